"""Job dependencies: enqueue jobs that wait on parents, and graphs of them in one transaction.

A job enqueued with `depends_on` waits in status awaiting_parents. When its last parent settles it is
released (pending, or scheduled if its scheduled_at is ahead); in mode 'on_success' (the default) a
parent that ends other than succeeded cancels it at once (error_class ParentFailed, cancel_reason
'parent-failure:<status>'), and the cancel goes on down the graph. The database does this in the parent's
own terminal transaction, on every path that writes one (migration 7); this module only writes the jobs
and their edges.

The service functions here take a Backend (as taskq.ops.jobs does), so the async client, the sync
client and the worker's `ctx.jobs.enqueue` share the checks and the SQL. The builder behind
`JobsClient.workflow()` is `taskq.client.Workflow`: nodes are collected on the client (their ids made
there), and written here in order in one transaction when its `async with` block ends without an error,
all or nothing. A node may depend only on jobs that exist or on earlier nodes, so a graph cannot have a
cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from psycopg import AsyncConnection
from typing_extensions import TypeVar

from taskq.backend import Backend, InsertedJob, JobBatch, JobInsert
from taskq.backend import dependencies as dependency_store
from taskq.backend.caller import check_caller_connection
from taskq.backend.dependencies import DependencyEdge
from taskq.checks import as_job_id
from taskq.exceptions import ConfigurationError, DependencyInvalid

if TYPE_CHECKING:
    pass

__all__ = [
    "DEPENDENCY_MODES", "MAX_PARENTS", "DependencyEdge", "GraphJob",
    "check_dependencies", "enqueue_dependent", "enqueue_graph", "job_dependencies", "parent_results",
]

R = TypeVar("R", default=Any)

DEPENDENCY_MODES: tuple[str, ...] = ("on_success", "on_any_terminal")
MAX_PARENTS = 10_000
"""The most parents one job may name in `depends_on` (a fan-in wider than that: add a level of jobs)."""


class _HasJobId(Protocol):
    @property
    def job_id(self) -> UUID: ...


ParentRef = UUID | str | _HasJobId
"""A parent in `depends_on`: a JobHandle, a WorkflowNode, a job id (UUID or its text)."""


def check_dependencies(
    depends_on: Iterable[ParentRef] | None, dependency_mode: str
) -> tuple[tuple[UUID, ...], str]:
    """The parents' ids (duplicates dropped, order kept) and the mode; DependencyInvalid for an unknown
    mode, a reference that is not a job, or more than MAX_PARENTS parents. Nothing is read or written."""
    if not isinstance(dependency_mode, str) or dependency_mode not in DEPENDENCY_MODES:
        raise DependencyInvalid(
            f"dependency_mode must be one of {', '.join(DEPENDENCY_MODES)}, got {dependency_mode!r}"
        )
    if depends_on is None:
        return (), dependency_mode
    if isinstance(depends_on, str | UUID) or hasattr(depends_on, "job_id"):
        raise DependencyInvalid("depends_on must be a list of jobs (handles or ids), not a single job")
    ids: dict[UUID, None] = {}
    for ref in depends_on:
        ids[_parent_id(ref)] = None
        if len(ids) > MAX_PARENTS:
            raise DependencyInvalid(f"depends_on names more than {MAX_PARENTS:,} parents (the limit)")
    return tuple(ids), dependency_mode


def _parent_id(ref: Any) -> UUID:
    if isinstance(ref, UUID | str):
        try:
            return as_job_id(ref)
        except ConfigurationError:
            raise DependencyInvalid(f"depends_on: not a job id (expected a UUID): {ref!r}") from None
    job_id = getattr(ref, "job_id", None)
    if isinstance(job_id, UUID):
        return job_id
    raise DependencyInvalid(f"depends_on: expected a JobHandle, a workflow node or a job id, got {ref!r}")


@dataclass(frozen=True, slots=True)
class GraphJob:
    """One job of a graph: the checked insert, and its parents (existing jobs or earlier jobs of the graph)."""

    job: JobInsert
    parent_ids: tuple[UUID, ...] = ()
    dependency_mode: str = "on_success"


def batch_of(job: JobInsert) -> JobBatch:
    return JobBatch(ids=[job.id], payloads_json=[job.payload_json], options=job.options)


async def _insert_on(backend: Backend, conn: AsyncConnection[Any], g: GraphJob) -> InsertedJob:
    if not g.parent_ids:
        return await backend.job_insert_deferred(g.job, conn=conn)
    if g.job.unique_key is not None:
        raise DependencyInvalid("unique_key cannot be combined with depends_on")
    written = await dependency_store.insert_dependent(conn, batch_of(g.job), g.parent_ids, g.dependency_mode)
    return InsertedJob(g.job, written.status, written.scheduled_at, written.schedule_to_close, written.created_at)


def check_graph(jobs: Sequence[GraphJob]) -> None:
    position = {g.job.id: i for i, g in enumerate(jobs)}
    if len(position) != len(jobs):
        raise DependencyInvalid("a graph names the same job id twice")
    for i, g in enumerate(jobs):
        if g.job.unique_key is not None and g.parent_ids:
            raise DependencyInvalid("unique_key cannot be combined with depends_on")
        for parent in g.parent_ids:
            at = position.get(parent)
            if at is not None and at >= i:
                raise DependencyInvalid(
                    f"job {g.job.id} depends on {parent}, "
                    + ("itself" if at == i else "a later job of the same graph")
                    + ": a graph may depend only on existing or earlier jobs (no cycles)"
                )


async def enqueue_graph(
    backend: Backend, jobs: Sequence[GraphJob], *, conn: AsyncConnection[Any] | None = None
) -> list[InsertedJob]:
    """Write every job of the graph in order, in one transaction (the caller's with `conn`, as a
    savepoint): all or nothing. DependencyInvalid before anything is written for a forward edge (a cycle);
    DependencyNotFound (and nothing written) when a parent does not exist."""
    check_graph(jobs)
    if not jobs:
        return []
    if conn is not None:
        check_caller_connection(conn, backend.database)
        async with conn.transaction():
            return [await _insert_on(backend, conn, g) for g in jobs]
    async with backend.transaction() as own:
        return [await _insert_on(backend, own, g) for g in jobs]


async def enqueue_dependent(
    backend: Backend, job: JobInsert, parent_ids: tuple[UUID, ...], mode: str,
    *, conn: AsyncConnection[Any] | None = None,
) -> InsertedJob:
    """One job that waits on `parent_ids` (existing jobs), in one transaction."""
    (inserted,) = await enqueue_graph(backend, [GraphJob(job, parent_ids, mode)], conn=conn)
    return inserted


async def enqueue_many_dependent(
    backend: Backend, batches: Sequence[JobBatch], parent_ids: tuple[UUID, ...], mode: str,
    *, conn: AsyncConnection[Any] | None = None,
) -> None:
    """Batches of jobs sharing the same parents (a fan-out), one statement per batch, in one transaction."""
    if conn is not None:
        check_caller_connection(conn, backend.database)
        async with conn.transaction():
            for batch in batches:
                await dependency_store.insert_dependent(conn, batch, parent_ids, mode)
        return
    async with backend.transaction() as own:
        for batch in batches:
            await dependency_store.insert_dependent(own, batch, parent_ids, mode)


async def job_dependencies(backend: Backend, job_id: UUID | str) -> list[DependencyEdge]:
    """The job's parents (with their status and how each edge resolved) and its children."""
    jid = as_job_id(job_id)
    async with backend.connection() as conn:
        return await dependency_store.dependencies(conn, jid)


async def parent_results(backend: Backend, job_id: UUID, adapters: Any) -> dict[UUID, Any]:
    """{parent id: result} for every parent of the job: a succeeded parent's stored result, decoded with
    its actor's result type when `adapters` (an ActorRegistry) knows the actor; None for a parent that did
    not succeed (mode on_any_terminal)."""
    async with backend.connection() as conn:
        rows = await dependency_store.parent_results(conn, job_id)
    results: dict[UUID, Any] = {}
    for pid, actor_name, status, raw in rows:
        if status != "succeeded":
            results[pid] = None
            continue
        actor = adapters.get(actor_name) if adapters is not None else None
        results[pid] = actor.result_adapter.validate_python(raw) if actor is not None else raw
    return results
