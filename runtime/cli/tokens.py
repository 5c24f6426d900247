"""`taskq tokens create NAME --grant ACTION@QUEUES ...`, `taskq tokens list`, `taskq tokens revoke NAME`:
the CLI face of taskq.ops.tokens (the web API's bearer tokens).

Registered in `taskq.cli.COMMANDS` through `commands()`. Exit codes: 0 done, 1 the database role may not
(create and revoke need the admin role of sql/roles.sql or the owner), 2 bad arguments (a bad name or
grant), 4 no such token (revoke), 7 the name is taken (create). `created_by` is the database role, and
create and revoke each write an audit row (principal `db:<role>`).
"""

from __future__ import annotations

import argparse
import sys

import psycopg

from taskq.cli import output
from taskq.cli._base import JSON_ARG, Command, arg, emit, with_client
from taskq.client import JobsClient
from taskq.exceptions import CliError
from taskq.ops import tokens

ACTIONS = ("create", "list", "revoke")


def cmd_tokens(args: argparse.Namespace) -> int:
    from taskq.exceptions import UsageError
    from taskq.exitcodes import ExitCode

    if args.action in ("create", "revoke"):
        if args.name is None:
            raise UsageError(f"tokens {args.action} needs a NAME")
        tokens.check_token_name(args.name)
    if args.action == "create":
        if not args.grant:
            raise UsageError("tokens create needs at least one --grant ACTION@QUEUE-PATTERN (e.g. jobs:read@*)")
        for g in args.grant:
            tokens.parse_grant(g)  # a usage error before any connection
    elif args.grant:
        raise UsageError("--grant is for tokens create")

    async def body(client: JobsClient) -> int:
        try:
            return await run(client)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise CliError(f"tokens {args.action}: this database role may not ({exc.diag.message_primary}); "
                           "run it as the admin role of sql/roles.sql (-v admin_role=...) or the owner") from None

    async def run(client: JobsClient) -> int:
        if args.action == "create":
            info, raw = await tokens.create_token(client.backend, args.name, args.grant)
            if args.json:
                emit(output.to_json({"token": raw, **info.model_dump(mode="json")}))
            else:
                emit(raw)
                print(f"taskq: token {info.name!r} created with {', '.join(info.grants)}; it is shown only once",
                      file=sys.stderr)
        elif args.action == "list":
            rows = await tokens.list_tokens(client.backend)
            if args.json:
                emit(output.to_json(rows))
            elif not rows:
                emit("no tokens (taskq tokens create NAME --grant jobs:read@*)")
            else:
                emit(output.table(
                    ("name", "grants", "created (UTC)", "last used (UTC)", "state"),
                    [(t.name, " ".join(t.grants), output.when(t.created_at), output.when(t.last_used_at),
                      "revoked" if t.revoked_at else "live") for t in rows]))
        else:
            changed = await tokens.revoke_token(client.backend, args.name)
            emit(f"{args.name}: revoked" if changed else f"{args.name}: already revoked")
        return ExitCode.OK

    return with_client(args, body)


def commands() -> tuple[Command, ...]:
    return (
        Command(
            "tokens", cmd_tokens, "create, list or revoke the web API's bearer tokens",
            (arg("action", choices=ACTIONS, metavar="ACTION", help="create, list or revoke"),
             arg("name", nargs="?", metavar="NAME", help="the token's name (create, revoke)"),
             arg("--grant", action="append", metavar="ACTION@QUEUES",
                 help=f"what the token may do, on which queues ('*' matches any run of characters): e.g. "
                 f"jobs:read@*, jobs:cancel@billing-*; actions: {', '.join(tokens.ACTIONS)}, jobs:*, *. "
                 "Repeatable"),
             JSON_ARG),
            description="create prints the token once (only its SHA-256 is stored). Run as the admin role of "
            "sql/roles.sql (or the owner); created_by is that database role, and create and revoke are audited. "
            "Exit codes: 0 done, 1 the database role may not, 2 bad arguments, 4 no such token, 7 the name is taken.",
        ),
    )
