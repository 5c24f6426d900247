"""WorkerState: what the worker's parts share about the worker as a whole (is it stopping, were its
leases lost, what did its stop give back). One object, handed to each part that reads or sets it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from taskq.exitcodes import ExitCode


def _empty_summary() -> dict[str, list[str]]:
    return {"released": [], "cancelled": [], "crashed": [], "held": []}


@dataclass(eq=False)
class WorkerState:
    draining: bool = False
    """Stop claiming (the first step of every stop)."""
    shutdown_active: bool = False
    """The shutdown orchestration runs: a held job the ladder gives up on ends cancelled, not abandoned."""
    leases_lost: bool = False
    """The worker could not renew its leases in time: its actors stop and nothing more is written."""
    exit_code: int = ExitCode.OK
    unreleased: list[str] = field(default_factory=list)
    """Jobs a stop could not give back (the database was unreachable): left to the sweeper."""
    releasing: set[str] = field(default_factory=set)
    """Jobs whose release is being written now."""
    releases_settled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set whenever `releasing` empties."""
    summary: dict[str, list[str]] = field(default_factory=_empty_summary)
    """What the stop did with each job it found held: released, cancelled, crashed, or still held."""
