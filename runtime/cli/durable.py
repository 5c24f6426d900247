"""`taskq signal ID NAME [--payload JSON]`: the CLI face of taskq.ops.durable.send_signal.

Registered in `taskq.cli.COMMANDS` through `commands()`; errors follow its contract (2 usage: a bad name or
payload; 4: no such job; a job that has ended is refused with exit 2 and one line saying its status).
"""

from __future__ import annotations

import argparse
import json
from typing import Any
from uuid import UUID

from taskq.cli import _audit as audit
from taskq.cli import output as cli_output
from taskq.cli._base import JSON_ARG, Command, arg, emit, with_client
from taskq.client import JobsClient


def cmd_signal(args: argparse.Namespace) -> int:
    from taskq.exceptions import JobNotFound, NotFound, SignalInvalid, SignalRefused, UsageError
    from taskq.exitcodes import ExitCode
    from taskq.ops.durable import check_name, check_signal_payload

    job_id: UUID = args.job_id
    try:
        name = check_name(args.name, "signal")
        payload: Any = None if args.payload is None else json.loads(_read(args.payload))
        check_signal_payload(payload)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--payload is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except SignalInvalid as exc:
        raise UsageError(str(exc)) from None

    async def body(client: JobsClient) -> int:
        try:
            sent = await client.signal(job_id, name, payload)
        except JobNotFound:
            raise NotFound(f"no job with id {job_id}") from None
        except SignalRefused as exc:
            raise UsageError(str(exc)) from None
        await audit.record(client, "jobs:signal", "signalled", job_id=job_id,
                           detail={"signal": name, "signal_id": sent.signal_id, "woke": sent.woke})
        if args.json:
            emit(cli_output.to_json(sent))
        else:
            woke = "; it was waiting for it and is due now" if sent.woke else ""
            emit(f"signal {name!r} sent to job {job_id} ({sent.status}) as signal {sent.signal_id}{woke}")
        return ExitCode.OK

    return with_client(args, body)


def _read(value: str) -> str:
    import sys

    if value == "-":
        return sys.stdin.read()
    if value.startswith("@"):
        from pathlib import Path

        from taskq.exceptions import UsageError

        try:
            return Path(value[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--payload {value}: cannot read the file ({exc.strerror})") from None
    return value


def commands() -> tuple[Command, ...]:
    from taskq.cli.args import job_id_arg

    return (
        Command(
            "signal", cmd_signal, "send a signal to a job (ctx.wait_for_signal takes it)",
            (
                arg("job_id", type=job_id_arg, metavar="ID", help="the job"),
                arg("name", metavar="NAME", help="the signal's name (what the job waits for)"),
                arg("--payload", metavar="JSON", help="the payload as JSON (default null); @FILE reads a file, "
                    "- reads stdin; at most 1 MiB"),
                JSON_ARG,
            ),
            description="Signals are kept in order until a ctx.wait_for_signal(NAME) of the job takes one (each "
            "once); a job suspended waiting for NAME is due at once. A job that has ended takes no signal.",
        ),
    )
