"""The CLI's job dependencies: `taskq enqueue --depends-on ID (repeatable) --dependency-mode MODE`, and
the parents and children that `taskq job ID` shows.

Used by taskq.cli.jobs and taskq.cli.lifecycle.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from taskq.cli.output import NONE, table, when
from taskq.client import JobsClient
from taskq.workflows import DEPENDENCY_MODES, MAX_PARENTS, DependencyEdge, check_dependencies


def enqueue_args(arg: Any, job_id_arg: Any) -> tuple[Any, ...]:
    """The enqueue options, made with taskq.cli's `arg` (passed in: this module cannot import it)."""
    return (
        arg("--depends-on", action="append", type=job_id_arg, metavar="ID",
            help=f"wait for job ID to end first (repeatable, at most {MAX_PARENTS:,}); the job waits in "
            "awaiting_parents until every parent is terminal"),
        arg("--dependency-mode", choices=list(DEPENDENCY_MODES), default="on_success",
            help="'on_success' (default): a parent that ends other than succeeded cancels the job "
            "(ParentFailed); 'on_any_terminal': run it once every parent ended, however"),
    )


def enqueue_options(args: argparse.Namespace) -> dict[str, Any]:
    """The client's enqueue options the flags give, checked (DependencyInvalid) before any connection."""
    check_dependencies(args.depends_on, args.dependency_mode)
    if not args.depends_on:
        return {}
    return {"depends_on": list(args.depends_on), "dependency_mode": args.dependency_mode}


async def read(client: JobsClient, job_id: Any) -> list[DependencyEdge]:
    return await client.dependencies(job_id)


def section(edges: Sequence[DependencyEdge]) -> str:
    """The parents (status now, and how each ended when its edge resolved) and the children."""
    parents = [e for e in edges if e.side == "parent"]
    children = [e for e in edges if e.side == "child"]
    lines = [f"parents ({len(parents)})"]
    if parents:
        lines.append(_indent(table(
            ("job", "actor", "status", "resolved (UTC)", "ended as"),
            [(e.job_id, e.actor or "(deleted)", _status(e), when(e.resolved_at), _ended(e)) for e in parents],
        )))
    lines.append("")
    lines.append(f"children ({len(children)})")
    if children:
        lines.append(_indent(table(
            ("job", "actor", "status"), [(e.job_id, e.actor or "(deleted)", _status(e)) for e in children],
        )))
    return "\n".join(lines)


def to_plain(edges: Sequence[DependencyEdge]) -> dict[str, list[dict[str, Any]]]:
    def one(e: DependencyEdge) -> dict[str, Any]:
        return {"job_id": str(e.job_id), "actor": e.actor, "status": e.status.value if e.status else None,
                "resolved_at": e.resolved_at.isoformat() if e.resolved_at else None,
                "parent_status": e.parent_status.value if e.parent_status else None}

    return {"parents": [one(e) for e in edges if e.side == "parent"],
            "children": [one(e) for e in edges if e.side == "child"]}


def _status(e: DependencyEdge) -> str:
    return e.status.value if e.status else NONE


def _ended(e: DependencyEdge) -> str:
    return e.parent_status.value if e.parent_status else NONE


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
