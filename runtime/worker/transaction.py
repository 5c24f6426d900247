"""`ctx.transaction()`: the actor's writes and its job's success in one transaction.

The block hands the actor a pool connection inside a transaction. Its end does not commit: it locks the
job's row, checking that this attempt still holds it (status running, attempt, claim_epoch), and keeps
the transaction open; the worker then writes the success (the same job_finish_batch statement as every
finish) on that connection when the actor returns, and commits. So the actor's rows and the job's success
commit together or not at all:

- the attempt lost the job before the block ended (its lease ran out and the job was reclaimed, or it was
  cancelled and forced): the lock finds no row of this attempt, the transaction rolls back, the actor gets
  LeaseLost;
- after the block the row is locked until the commit, so no reclaim, cancel or sweep can come between;
- the actor raises or is stopped after the block, or its result cannot be stored: rollback, nothing of it
  stays (the failure is written as usual, outside the transaction).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from psycopg import Rollback

from taskq.backend import durable as durable_store
from taskq.exceptions import TransactionInvalid

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    from taskq.backend.workers import Finish, WorkerStore
    from taskq.context import JobContext

__all__ = ["JobTransaction", "OpenTransaction", "abandon", "commit_with"]

log = logging.getLogger("taskq.worker")


class JobTransaction:
    """The async context manager `ctx.transaction()` returns (one per attempt)."""

    def __init__(self, ctx: JobContext[Any], pool: AsyncConnectionPool[Any], worker_id: str, *,
                 lost: Callable[[JobContext[Any], str], Any]) -> None:
        self._ctx = ctx
        self._pool = pool
        self._worker_id = worker_id
        self._lost = lost

    async def __aenter__(self) -> AsyncConnection[Any]:
        ctx = self._ctx
        if ctx.transaction_state is not None:
            raise TransactionInvalid("ctx.transaction() is already in use in this attempt (one per attempt, "
                                     "not nested)")
        ctx.transaction_state = "open"
        conn: AsyncConnection[Any] = await self._pool.getconn()
        try:
            tx = conn.transaction()
            await tx.__aenter__()
        except BaseException:
            await self._pool.putconn(conn)
            ctx.transaction_state = "done"
            raise
        ctx.transaction_open = OpenTransaction(self._pool, conn, tx)
        return conn

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        ctx = self._ctx
        if exc_type is not None:
            await abandon(ctx, exc_type, exc, tb)
            return False
        assert ctx.transaction_open is not None
        try:
            held = await durable_store.tx_fence(ctx.transaction_open.conn, ctx.job_id, ctx.attempt, ctx.claim_epoch,
                                                self._worker_id)
        except BaseException as error:
            await abandon(ctx, type(error), error, error.__traceback__)
            raise
        if not held:
            await abandon(ctx)
            self._lost(ctx, "its transaction was rolled back")
        ctx.transaction_state = "held"
        return False


class OpenTransaction:
    """An attempt's open transaction: its connection, and `end()`, which commits (or, given an exception, rolls
    back) and gives the connection back to the pool."""

    def __init__(self, pool: AsyncConnectionPool[Any], conn: AsyncConnection[Any],
                 tx: AbstractAsyncContextManager[Any]) -> None:
        self._pool = pool
        self.conn = conn
        self._tx = tx

    async def end(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None,
                  tb: TracebackType | None = None) -> None:
        try:
            await self._tx.__aexit__(exc_type, exc, tb)
        finally:
            await self._pool.putconn(self.conn)


def _close(ctx: JobContext[Any]) -> OpenTransaction | None:
    """Take the attempt's open transaction off its context (it is ended once, by the caller)."""
    opened: OpenTransaction | None = ctx.transaction_open
    ctx.transaction_open = None
    ctx.transaction_state = "done"
    return opened


async def abandon(ctx: JobContext[Any], exc_type: type[BaseException] | None = None, exc: BaseException | None = None,
                  tb: TracebackType | None = None) -> None:
    """Roll the attempt's transaction back (if still open) and give its connection back."""
    ender = _close(ctx)
    if ender is None:
        return
    try:
        if exc_type is None:
            await ender.end(Rollback, Rollback(), None)  # psycopg: roll back, and swallow it
        else:
            await ender.end(exc_type, exc, tb)
    except Exception as error:  # a broken connection: the pool discards it, the server rolls back
        log.warning("job %s attempt %d: rolling its transaction back failed: %s", ctx.job_id, ctx.attempt, error)


async def commit_with(ctx: JobContext[Any], store: WorkerStore, finish: Finish) -> str | None:
    """Write `finish` in the attempt's transaction and commit both: the status written, or None when
    nothing committed (the fence failed, or the commit itself failed: then the lease expires and the
    sweeper decides, as for any outcome not written)."""
    opened = ctx.transaction_open
    assert opened is not None
    if ctx.transaction_state != "held":
        # the actor returned from inside the block (cannot happen: the block's end runs first) or the
        # block failed: nothing commits
        await abandon(ctx)
        return None
    try:
        written = await store.finish_batch_in(opened.conn, [finish])
    except Exception as error:
        log.error("job %s attempt %d: its success was not written in its transaction (%s); rolled back",
                  ctx.job_id, ctx.attempt, error)
        await abandon(ctx)
        return None
    status = written.get(finish.job_id)
    if status is None:  # cannot happen while the row is locked, but never commit an unfenced transaction
        log.warning("job %s attempt %d: stale at commit; its transaction is rolled back", ctx.job_id, ctx.attempt)
        await abandon(ctx)
        return None
    _close(ctx)
    try:
        await opened.end()
    except Exception as error:
        log.error("job %s attempt %d: the commit of its transaction failed (%s): the outcome is unknown "
                  "here; its lease will expire and the sweeper will decide", ctx.job_id, ctx.attempt, error)
        return None
    return status
