"""`taskq web [--host 127.0.0.1] [--port 8765]`: serve the dashboard and the /api/v1 JSON API (uvicorn).

Registered in `taskq.cli.COMMANDS` through `commands()`. Needs the extra `taskq[web]`; without it the
command says so in one line (exit 8). Auth is on (bearer tokens, `taskq tokens create`); `--no-auth`
serves everyone with every grant and is refused on any host but loopback (exit 2).

The DSN comes from `--dsn-file`, TASKQ_DSN or `--dsn`; the process retitles itself at once, so a `--dsn`
typed on the command line does not stay in `ps` (/proc/PID/cmdline). Each request writes one line to
the logger `taskq.web.access` (`--log-format json` for JSON lines).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import sys

from taskq.cli._base import Command, arg, dsn_of
from taskq.cli.args import int_arg, seconds_arg

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
WEB_HINT = "pip install 'taskq[web]'"
ALLOWED_HOSTS_ENV = "TASKQ_WEB_ALLOWED_HOSTS"
"""Comma-separated names added to --allowed-host (so `taskq run --web-port` passes them to its child)."""
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "[::]"})
MAX_POOL_SIZE = 100
DEFAULT_POOL_SIZE = 8
"""WebConfig's defaults (taskq.web.state, not imported here: it needs the web extra)."""
DEFAULT_STATEMENT_TIMEOUT = 5.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


MAX_SESSION_SECONDS = 366 * 86400.0


def session_seconds_arg(text: str) -> float:
    """A session timeout: seconds, from 60 to a year."""
    import argparse

    value = seconds_arg(text)
    if not 60 <= value <= MAX_SESSION_SECONDS:
        raise argparse.ArgumentTypeError(f"must be from 60 seconds to a year ({MAX_SESSION_SECONDS:.0f}), got {text!r}")
    return value


def check_bind(host: str, auth: bool) -> None:
    """Serving without auth anywhere but loopback is refused (a UsageError, one line)."""
    from taskq.exceptions import UsageError

    if not auth and not is_loopback(host):
        raise UsageError(f"refusing to serve without auth on {host!r}: --no-auth is for loopback only "
                         "(127.0.0.1, ::1); create a token with `taskq tokens create` and drop --no-auth")


async def _probe(dsn: str, auth: bool) -> int:
    """Check the database and schema before serving (a clear error now rather than on the first request);
    the number of live tokens."""
    import psycopg

    from taskq.backend import Backend
    from taskq.exceptions import CliError
    from taskq.ops.tokens import list_tokens

    backend = await Backend.open(dsn, min_size=1, max_size=1)
    try:
        return sum(1 for t in await list_tokens(backend) if t.revoked_at is None) if auth else 0
    except psycopg.errors.InsufficientPrivilege as exc:
        raise CliError(f"this database role may not serve the web API ({exc.diag.message_primary}): run taskq web "
                       "as the web role of sql/roles.sql (-v web_role=...) or the owner") from None
    finally:
        await backend.close()


def host_arg(text: str) -> str:
    """An --allowed-host: a host name, an IP address (IPv6 with or without brackets), `.domain` for a
    domain and its subdomains, or `*` for any."""
    name = text.strip().lower()
    if name == "*":
        return name
    bare = name.removeprefix(".")
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        ipaddress.ip_address(bare)
        return name
    except ValueError:
        pass
    labels = bare.split(".")
    if not bare or len(bare) > 253 or not all(
            label and len(label) <= 63 and label.replace("-", "").replace("_", "").isalnum() and label.isascii()
            for label in labels):
        raise argparse.ArgumentTypeError(
            f"not a host name or IP address: {text!r} (a name such as ops.example.com, .example.com for a "
            "domain and its subdomains, an address, or * for any)")
    return name


def allowed_hosts(args: argparse.Namespace) -> tuple[str, ...]:
    """The loopback names, --allowed-host, TASKQ_WEB_ALLOWED_HOSTS and the bind address (unless a wildcard)."""
    from taskq.exceptions import UsageError
    from taskq.web.guard import DEFAULT_ALLOWED_HOSTS

    names = list(DEFAULT_ALLOWED_HOSTS) + list(args.allowed_host or [])
    for item in os.environ.get(ALLOWED_HOSTS_ENV, "").split(","):
        if item.strip():
            try:
                names.append(host_arg(item))
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"{ALLOWED_HOSTS_ENV}: {exc}") from None
    if args.host.strip().lower() not in WILDCARD_BINDS:
        names.append(args.host.strip().lower())
    return tuple(dict.fromkeys(names))


def read_dsn_file(path: str) -> str:
    from taskq.exceptions import UsageError

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise UsageError(f"--dsn-file {path}: cannot read it ({reason})") from None
    dsn = text.strip()
    if not dsn or "\n" in dsn:
        raise UsageError(f"--dsn-file {path}: expected one line holding the DSN")
    return dsn


def cmd_web(args: argparse.Namespace) -> int:
    import setproctitle

    from taskq.exceptions import MissingExtra, UsageError
    from taskq.exitcodes import ExitCode
    from taskq.logs import configure_logging

    # before anything slow: a --dsn on argv leaves `ps` at once
    setproctitle.setproctitle(f"taskq web [{args.host}:{args.port}]")
    auth = not args.no_auth
    check_bind(args.host, auth)
    if args.dsn_file is not None:
        if getattr(args, "dsn", None):
            raise UsageError("give the DSN once: --dsn or --dsn-file, not both")
        args.dsn = read_dsn_file(args.dsn_file)
    hosts = allowed_hosts(args)
    registry = None
    if args.app is not None:
        from taskq.worker.cli import load_app

        registry = load_app(args.app)  # AppNotImportable: one line, exit 10
    try:
        import uvicorn

        from taskq.web import WebConfig, create_app
    except ImportError as exc:
        raise MissingExtra(f"taskq web needs the web extra ({exc.name} is missing): {WEB_HINT}") from None
    dsn = dsn_of(args)
    live = asyncio.run(_probe(dsn, auth))
    if auth and live == 0:
        print("taskq: no live API token yet: create one with `taskq tokens create NAME --grant '*@*'`",
              file=sys.stderr)
    config = WebConfig(dsn=dsn, auth=auth, poll_seconds=args.poll_interval,
                       cancellation_grace_period=args.cancellation_grace_period,
                       cleanup_grace_period=args.cleanup_grace_period, secure_cookies=args.secure_cookies,
                       allowed_hosts=hosts, pool_size=args.pool_size, statement_timeout=args.statement_timeout,
                       session_idle_seconds=args.session_idle, session_max_seconds=args.session_max,
                       registry=registry)
    configure_logging(args.log_format)
    print(f"taskq: serving the dashboard on http://{args.host}:{args.port}/ and the API on /api/v1"
          + ("" if auth else " WITHOUT auth (loopback only)"), file=sys.stderr, flush=True)
    # uvicorn's own access log stays off: taskq.web.access writes one line per request, with the principal
    uvicorn.run(create_app(config=config), host=args.host, port=args.port, log_level="warning",
                lifespan="on", access_log=False, log_config=None)
    return ExitCode.OK


def commands() -> tuple[Command, ...]:
    return (
        Command(
            "web", cmd_web, "serve the dashboard and the /api/v1 JSON API",
            (arg("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST}, loopback)"),
             arg("--port", type=int_arg(0, 65535), default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})"),
             arg("--no-auth", action="store_true",
                 help="serve everyone with every grant, without tokens: loopback only"),
             arg("--poll-interval", type=seconds_arg, default=2.0, metavar="SECONDS",
                 help="how often open pages refresh their live regions (default 2)"),
             arg("--cancellation-grace-period", type=seconds_arg, default=None, metavar="SECONDS",
                 help="the fleet's, for the cancel ladder's clocks (default: TASKQ_CANCELLATION_GRACE_PERIOD "
                 "or the workers' default)"),
             arg("--cleanup-grace-period", type=seconds_arg, default=None, metavar="SECONDS",
                 help="likewise (default: TASKQ_CLEANUP_GRACE_PERIOD or the workers' default)"),
             arg("--secure-cookies", action="store_true", default=None,
                 help="always mark the session cookie Secure (behind a TLS proxy on the same host); by default "
                 "it is Secure unless served over plain HTTP on a loopback address"),
             arg("--session-idle", type=session_seconds_arg, default=8 * 3600.0, metavar="SECONDS",
                 help="a dashboard session ends after this long without a request (default 28800: 8 h)"),
             arg("--session-max", type=session_seconds_arg, default=24 * 3600.0, metavar="SECONDS",
                 help="a dashboard session ends this long after its login, whatever its use (default 86400)"),
             arg("--allowed-host", action="append", type=host_arg, metavar="NAME",
                 help="a name this server answers to in Host, besides localhost, 127.0.0.1, [::1] and the "
                 "--host address (repeatable; also TASKQ_WEB_ALLOWED_HOSTS, comma-separated; .example.com "
                 "for a domain and its subdomains; * turns the check off, for a proxy that checks Host)"),
             arg("--pool-size", type=int_arg(1, MAX_POOL_SIZE), default=DEFAULT_POOL_SIZE, metavar="N",
                 help=f"database connections of this server (default {DEFAULT_POOL_SIZE})"),
             arg("--statement-timeout", type=seconds_arg, default=DEFAULT_STATEMENT_TIMEOUT, metavar="SECONDS",
                 help=f"longest a statement may run before it is cancelled and the request answers 503 (default "
                 f"{DEFAULT_STATEMENT_TIMEOUT:g})"),
             arg("--dsn-file", default=None, metavar="PATH",
                 help="read the DSN from this file (one line), so it shows in no command line or environment"),
             arg("--log-format", choices=("text", "json"), default="text",
                 help="log lines, the access log included, as text or JSON (default text)"),
             arg("--app", default=None, metavar="APP",
                 help="the workers' APP (module:attribute): POST /api/v1/jobs then validates payloads against its "
                 "actors and refuses a queue an actor is not bound to (400) before writing anything")),
            description="Auth: bearer tokens (`taskq tokens create NAME --grant ACTION@QUEUES`), also the "
            "dashboard's login. Exit codes: 0 stopped, 2 bad arguments or --no-auth off loopback, 3 database "
            "unreachable, 5 schema not ready, 8 the web extra is not installed.",
        ),
    )
