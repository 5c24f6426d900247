"""The worker process: one event loop, a dispatcher, consumers, a heartbeat, a listener, a sweeper and a
dependency resolver."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any

from taskq.actors.declaration import Actor, ActorRegistry, as_registry
from taskq.actors.executors import AsyncioExecutor, Executor, ThreadExecutor
from taskq.backend import Backend
from taskq.dsn import resolve_dsn
from taskq.logs import JobLines
from taskq.metrics import LEAKED_THREADS, SHUTDOWN_JOBS, STALE_WRITES
from taskq.models import CancelOrigin, CancelPhase
from taskq.settings import WorkerSettings
from taskq.worker import exitcodes
from taskq.worker.cancel import CancelController
from taskq.worker.completer import Completer
from taskq.worker.consumer import Consumers, Hooks
from taskq.worker.dispatcher import Dispatcher, Listener
from taskq.worker.heartbeat import Heartbeat
from taskq.worker.liveness import STOP_SIGNALS
from taskq.worker.pruner import Pruner
from taskq.worker.queue_control import QueueControl
from taskq.worker.registry import ActiveJob, ActiveJobRegistry
from taskq.worker.resolver import Resolver
from taskq.worker.schedule_store import ScheduleStore
from taskq.worker.scheduler import Scheduler
from taskq.worker.store import ClaimedJob, WorkerStore
from taskq.worker.sweeper import Sweeper

log = logging.getLogger("taskq.worker")

POOL_RECONNECT_TIMEOUT = 10.0
"""Seconds of one series of pool reconnection attempts: their delays (1, 2, 4 s...) restart from one
second after it, so the worker gets connections back within seconds of the end of an outage."""
LOST_LEASES_FINAL_STEP_BUDGET = 2.0
"""Seconds each final database step (writes, deregistration) may take once the database stopped answering,
at most: never more than leaves the exit EXIT_MARGIN before the shutdown watchdog."""
EXIT_MARGIN = 1.0
"""Seconds of the watchdog's budget kept for the exit itself (closing the pool, reaping, logging)."""
MIN_STEP_BUDGET = 0.1
MARK_STOPPING_BUDGET = 1.0
"""Seconds the stop waits to flag the workers row `stopping` (a courtesy for operators) before going on."""


DEFAULT_SCHEDULE_OWNER = "default"
"""The owner of the schedules of an ActorRegistry that names none (`taskq worker APP` uses APP)."""


class ShutdownWatchdog:
    """An OS thread that hard-exits the process if shutdown takes longer than its budget. Armed at the
    first trigger; disarmed only by the worker's own exit path."""

    def __init__(self, budget: float, describe: Any) -> None:
        self._budget = budget
        self._describe = describe
        self._disarmed = threading.Event()
        self._thread: threading.Thread | None = None
        self._armed_at = 0.0

    def arm(self) -> None:
        if self._thread is None:
            self._armed_at = time.monotonic()
            self._thread = threading.Thread(target=self._watch, name="taskq-shutdown-watchdog", daemon=True)
            self._thread.start()

    def remaining(self) -> float:
        """Seconds left before the hard exit (the whole budget while not armed)."""
        if self._thread is None:
            return self._budget
        return self._budget - (time.monotonic() - self._armed_at)

    def disarm(self) -> None:
        self._disarmed.set()

    def _watch(self) -> None:
        if self._disarmed.wait(self._budget):
            return
        try:
            log.critical("shutdown watchdog: still running after %.1fs; hard exit %d; still held: %s",
                         self._budget, exitcodes.WATCHDOG, self._describe())
        finally:
            os._exit(exitcodes.WATCHDOG)


class Worker:
    def __init__(self, settings: WorkerSettings, actors: ActorRegistry | Iterable[Actor[Any, Any]]) -> None:
        self.settings = settings
        self.actors = as_registry(actors)
        self.worker_id = settings.resolved_worker_id()
        self.concurrency = settings.resolved_concurrency(a.isolation for a in self.actors)
        """Jobs this worker runs at once: the `concurrency` setting, or its default for these actors."""
        self.registry = ActiveJobRegistry()
        self.draining = False
        self.shutdown_active = False
        self.leases_lost = False
        self.unreleased: list[str] = []
        """Jobs a stop could not give back (the database was unreachable): left to the sweeper."""
        self.releasing: set[str] = set()
        """Jobs whose release is being written now."""
        self.releases_settled = asyncio.Event()
        self.exit_code = exitcodes.OK
        self.ready = threading.Event()
        self._async_executor = AsyncioExecutor()
        # a thread stuck after a forced stop the ladder does not own (timeout, lost lease) is given up
        # after the cleanup grace and counted toward max_leaked_threads, like an abandonment
        self._thread_executor = ThreadExecutor(settings.max_threads)
        self._thread_executor.configure(
            cleanup_grace_period=settings.cleanup_grace_period, on_leak_change=self.on_abandoned
        )
        self._process_executor: Executor | None = None
        self.summary: dict[str, list[str]] = {"released": [], "cancelled": [], "crashed": [], "held": []}
        self.shutdown_event = asyncio.Event()
        self.skip_grace = asyncio.Event()
        """Set by a second SIGINT: skip what is left of the grace windows."""
        self.job_log = JobLines(self.worker_id) if settings.log_job_lines else None
        """The INFO line at each attempt's start and finish (None: `log_job_lines` off)."""
        self.consumers = Consumers(self)
        self.hooks = Hooks(self)
        self.controller = CancelController(self)
        self.heartbeat = Heartbeat(self)
        self.dispatcher = Dispatcher(self)
        self.listener = Listener(self, "")
        self.sweeper = Sweeper(self)
        self.resolver = Resolver(self)
        self.watchdog = ShutdownWatchdog(settings.effective_shutdown_timeout, self._describe_held)

    # -- wiring used by the parts --------------------------------------------------------------

    def executor_for(self, actor: Actor[Any, Any]) -> Executor:
        if actor.isolation == "async":
            return self._async_executor
        if actor.isolation == "thread":
            return self._thread_executor
        if self._process_executor is None:
            from taskq.actors.process import ProcessExecutor

            self._process_executor = ProcessExecutor(self.settings)
        return self._process_executor

    def executors(self) -> list[Executor]:
        found: list[Executor] = [self._async_executor, self._thread_executor]
        if self._process_executor is not None:
            found.append(self._process_executor)
        return found

    def leaked_threads(self) -> int:
        return sum(int(getattr(ex, "leaked_threads", 0)) for ex in self.executors())

    def slot_freed(self) -> None:
        # only a dispatcher waiting for a slot has a reason to claim again; one that found the queue empty
        # waits for a NOTIFY or its poll (waking it here would cost an empty claim per finished job)
        if self.dispatcher.full or self.draining:
            self.dispatcher.wake.set()

    def limited_slot_freed(self) -> None:
        # a finish just committed: under limits, the slot it freed may be the one our claims wait for (a
        # worker that found its limits used up waits for a NOTIFY or its poll otherwise)
        if self.control.limited:
            self.dispatcher.wake.set()

    def on_abandoned(self, entry: ActiveJob) -> None:
        """After an abandonment verdict: a thread that never left keeps its slot; too many of them and
        the worker restarts itself through the normal shutdown path (only process exit frees them)."""
        self.slot_freed()
        leaked = self.leaked_threads()
        LEAKED_THREADS.set(leaked)
        if leaked > self.settings.max_leaked_threads and not self.draining:
            log.error("%d actor threads leaked (max_leaked_threads=%d): restarting this worker",
                      leaked, self.settings.max_leaked_threads)
            self.exit_code = exitcodes.LEAKED_THREADS
            self.request_shutdown()

    def lose_leases(self, why: str) -> None:
        """Self-fencing: our leases are gone, so stop every actor without writing anything."""
        if self.leases_lost:
            return
        log.error("%s: stopping every actor without writing (the sweeper will recover the rows)", why)
        self.leases_lost = True
        self.exit_code = exitcodes.LEASES_LOST
        for entry in self.registry:
            entry.drop_lease()
        self.request_shutdown()

    def request_shutdown(self) -> None:
        """The one stop trigger (signals, embedders, the teardown paths): arms the watchdog at once."""
        self.watchdog.arm()
        self.shutdown_event.set()

    def on_sigint(self) -> None:
        if self.shutdown_event.is_set():
            log.warning("second SIGINT: skipping the rest of the grace windows")
            self.skip_grace.set()
        self.request_shutdown()

    async def release(self, entries: Sequence[ActiveJob]) -> None:
        """Give interrupted attempts back to the fleet; a row an operator asked to cancel ends
        cancelled (forced) instead, through the same fenced write the unwinding consumer races."""
        todo = [e for e in entries if not (e.finishing and e.cancel_origin is CancelOrigin.LEASE_LOST)]
        if not todo:
            return
        for e in todo:
            e.finishing = True
        ids = [str(e.id) for e in todo]
        self.releasing.update(ids)
        # bounded: with the database gone, the pool would wait its own timeout for a connection, past the
        # end of the stop, and a release still waiting when the stop ends is a job the summary would miss
        budget = self.step_budget() if self.db_in_doubt() else POOL_RECONNECT_TIMEOUT
        try:
            outcome = await asyncio.wait_for(
                self.store.release_batch([(e.id, e.attempt, e.claim_epoch) for e in todo],
                                         [e.effect_unknown for e in todo]),
                budget,
            )
        except BaseException as exc:  # a cancelled release (the exit path) gave nothing back either
            # nothing more to try before the exit: the rows stay held until their lease runs out, then any
            # sweeper retries them (the attempt counts, as for a crash)
            self.unreleased += ids
            self.exit_code = exitcodes.LEASES_LOST
            log.error("could not release %d jobs (%s): left to the sweeper once their lease runs out",
                      len(todo), str(exc) or type(exc).__name__)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self.releasing.difference_update(ids)
            if not self.releasing:
                self.releases_settled.set()
        for e in todo:
            status = outcome.get(e.id)
            if status is None:
                STALE_WRITES.inc()
                log.warning("job %s attempt %d: release fenced out (a newer attempt owns the row)", e.id, e.attempt)
            elif status == "crashed":
                self.summary["crashed"].append(str(e.id))
                log.warning("job %s attempt %d: a non-idempotent actor had to be forced at shutdown; ended crashed "
                            "(WorkerShutdown) for review instead of being re-run", e.id, e.attempt)
            elif status == "cancelled":
                self.summary["cancelled"].append(str(e.id))
                if e.actor is not None and e.actor.on_cancel is not None:
                    await self.hooks.run(e.actor.on_cancel, e, e.actor.on_cancel_timeout, "on_cancel")
            else:
                self.summary["released"].append(str(e.id))

    def db_in_doubt(self) -> bool:
        """The database did not answer lately: the exit path gives each last step a short budget."""
        return self.leases_lost or bool(self.unreleased) or self.heartbeat.consecutive_failures > 0

    async def release_unstarted(self, jobs: Sequence[ClaimedJob]) -> None:
        await self.release([ActiveJob(job=j) for j in jobs])

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        s = self.settings
        dsn = resolve_dsn(s.dsn_value())
        # the worker's connections name it, so that the lease-loss trigger tells its own writes apart
        self.backend = await Backend.open(dsn, min_size=2, max_size=max(4, min(20, self.concurrency // 50 + 4)),
                                          reconnect_timeout=POOL_RECONNECT_TIMEOUT,
                                          worker_id=self.worker_id, transaction_pooler=s.transaction_pooler)
        self.store = WorkerStore(self.backend, self.worker_id)
        self.completer = Completer(self.store, give_up_after=s.lock_timeout, on_queued=self.slot_freed,
                                   on_written=self.limited_slot_freed)
        self.control = QueueControl(self.store, s.queues, s.poll_interval)
        self.pruner = Pruner(self.store, s)
        listen_dsn = s.listen_dsn_value()
        self.listener.dsn = resolve_dsn(listen_dsn) if listen_dsn else dsn
        await self.store.register(s.queues, self.concurrency, s.lock_timeout)
        # this code's actor limits, for the whole fleet (the last worker to start wins)
        if await self.store.sync_actor_limits({a.name: a.limits for a in self.actors}):
            log.info("actor limits written: %s", {a.name: a.limits.describe() for a in self.actors if a.limits.any})
        taken = await self.store.take_over()
        if taken:
            log.warning("reclaimed %s left running under worker id %s by an earlier process", taken, self.worker_id)
        self.scheduler = Scheduler(ScheduleStore(self.backend), self.actors.schedules(),
                                   owner=self.actors.owner or DEFAULT_SCHEDULE_OWNER,
                                   poll_interval=s.schedule_poll_interval)
        await self.scheduler.sync()  # code declarations are upserted when a worker starts
        log.info("worker %s started: queues=%s concurrency=%d actors=%s", self.worker_id, s.queues,
                 self.concurrency, self.actors.names())
        services = {
            "completer": loop.create_task(self.completer.run(), name="taskq-completer"),
            "heartbeat": loop.create_task(self.heartbeat.run(), name="taskq-heartbeat"),
            "sweeper": loop.create_task(self.sweeper.run(), name="taskq-sweeper"),
            "resolver": loop.create_task(self.resolver.run(), name="taskq-resolver"),
            "pruner": loop.create_task(self.pruner.run(), name="taskq-pruner"),
            "scheduler": loop.create_task(self.scheduler.run(), name="taskq-scheduler"),
            "dispatcher": loop.create_task(self.dispatcher.run(), name="taskq-dispatcher"),
        }
        if s.listens():
            services["listener"] = loop.create_task(self.listener.run(), name="taskq-listener")
        else:
            log.info("no LISTEN connection (transaction_pooler without listen_dsn): polling every %.2fs, "
                     "cancel requests arrive with the heartbeat", s.poll_interval)
        from taskq.worker.liveness import LivenessReporter

        self.liveness = LivenessReporter.from_env(self)
        if self.liveness is not None:
            services["liveness"] = loop.create_task(self.liveness.run(), name="taskq-liveness")
        stop_wait = loop.create_task(self.shutdown_event.wait(), name="taskq-stop-wait")
        self.ready.set()
        cancelled_from_outside = False
        try:
            try:
                done, _ = await asyncio.wait([stop_wait, *services.values()], return_when=asyncio.FIRST_COMPLETED)
                for name, task in services.items():
                    if task in done and not task.cancelled() and task.exception():
                        log.error("worker service %s crashed; shutting down", name, exc_info=task.exception())
                        self.exit_code = exitcodes.ERROR
            except asyncio.CancelledError:
                # a bare cancel of the worker task is a supported stop path: same as a signal
                cancelled_from_outside = True
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
            await self._shutdown()
        finally:
            stop_wait.cancel()
            # the completer stops last: cancelling it mid-write could drop the batch it holds
            completer = services.pop("completer")
            for task in services.values():
                task.cancel()
            if self.db_in_doubt():  # a service may be stuck cancelling a query the server never answers
                await settle([*services.values(), *self.heartbeat.stuck_ticks()], self.step_budget())
            await cancel_and_wait([*services.values(), stop_wait])
            await asyncio.gather(*services.values(), stop_wait, return_exceptions=True)
            try:
                await self._final_step(self.completer.drain(), "final writes")
            finally:
                await cancel_and_wait([completer])
                await asyncio.gather(completer, return_exceptions=True)
                await self._close()
        if cancelled_from_outside:
            raise asyncio.CancelledError
        return self.exit_code

    async def _shutdown(self) -> None:
        """DRAINING -> SIGNALLED -> FORCED -> RELEASING -> EXITING (spec §4, §9). Heartbeats keep
        running until the end, so every lease stays valid while the phases play out."""
        self.watchdog.arm()
        s = self.settings
        # DRAINING: stop claiming at once (and pruning, after its current batch)
        self.draining = True
        self.pruner.stopping.set()
        self.shutdown_active = True
        self.dispatcher.wake.set()
        log.info("worker %s shutting down with %d jobs in flight", self.worker_id, len(self.registry))
        if self.leases_lost:
            await self._wait_empty(s.cleanup_grace_period)
            return
        # informational only: never let an unreachable database hold up the stop
        await self._bounded(self.store.mark_stopping(), MARK_STOPPING_BUDGET, "marking the worker stopping")
        # SIGNALLED: record why (SHUTDOWN) before setting each cancel event
        for entry in self.registry:
            entry.request_cancel(CancelOrigin.SHUTDOWN)
        await self._wait_empty(s.cancellation_grace_period)
        # FORCED: the executor's force path; an operator-cancelled job is now a forced cancel
        for entry in self.registry:
            if entry.finishing:
                continue
            if entry.cancel_origin is CancelOrigin.OPERATOR and entry.cancel_phase < CancelPhase.FORCED:
                entry.cancel_phase = CancelPhase.FORCED
            entry.force("shutdown")
        await self._wait_empty(s.cleanup_grace_period)
        # RELEASING: operator-cancelled rows end cancelled (forced); the rest go back to the fleet.
        # An actor still executing (a thread stuck in C) keeps its row: releasing it would let a second
        # execution start beside it; the watchdog ends the process and the sweeper reclaims the row.
        remaining = [e for e in self.registry if not e.finishing and not self._still_executing(e)]
        if remaining:
            await self.release(remaining)
        await self._wait_empty(0.5)
        if self.releasing:  # a consumer's release still waiting on the database: its last seconds
            self.releases_settled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.releases_settled.wait(), self.step_budget())
        # EXITING
        self.summary["held"] = [str(e.id) for e in self.registry if not e.finishing or self._still_executing(e)]
        self.summary["held"] += [i for i in self.unreleased if i not in self.summary["held"]]
        if self.releasing:  # given back by nobody: the sweeper's, once the lease runs out
            self.summary["held"] += [i for i in self.releasing if i not in self.summary["held"]]
            self.exit_code = exitcodes.LEASES_LOST
        for outcome, ids in self.summary.items():
            SHUTDOWN_JOBS.labels(outcome=outcome).inc(len(ids))
        log.info("worker %s stopped: released=%s cancelled=%s crashed=%s still_held=%s", self.worker_id,
                 self.summary["released"], self.summary["cancelled"], self.summary["crashed"], self.summary["held"])

    @staticmethod
    def _still_executing(entry: ActiveJob) -> bool:
        probe = getattr(entry.executor, "still_running", None)
        return bool(probe is not None and probe(entry))

    async def _wait_empty(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline and not self.skip_grace.is_set():
            if not any(not e.finishing for e in self.registry) and not self.consumers.tasks:
                return
            self.dispatcher.wake.clear()
            try:
                await asyncio.wait_for(self.dispatcher.wake.wait(), min(0.05, max(0.0, deadline - loop.time())))
            except TimeoutError:
                pass

    async def _final_step(self, step: Coroutine[Any, Any, None], what: str) -> None:
        """A last database step of the exit path. When the database did not answer lately (the leases were
        lost, a release failed, heartbeats fail) give it LOST_LEASES_FINAL_STEP_BUDGET seconds rather
        than the pool's own waits, so the worker exits promptly instead of being killed by its watchdog."""
        if not self.db_in_doubt():
            try:
                await step
            except Exception as exc:
                log.warning("%s failed: %s", what, exc)
            return
        await self._bounded(step, self.step_budget(), what)

    def step_budget(self) -> float:
        """Seconds for one last database step once the database is in doubt: LOST_LEASES_FINAL_STEP_BUDGET,
        or less as the watchdog's deadline nears, so that the steps together end before it fires."""
        left = self.watchdog.remaining() - EXIT_MARGIN
        return max(MIN_STEP_BUDGET, min(LOST_LEASES_FINAL_STEP_BUDGET, left))

    @staticmethod
    async def _bounded(step: Coroutine[Any, Any, None], budget: float, what: str) -> None:
        task = asyncio.get_running_loop().create_task(step)
        await settle([task], budget)
        if not task.done() or task.cancelled():
            log.warning("%s: no answer from the database in time; the sweeper will clean up", what)
        elif task.exception() is not None:
            log.warning("%s failed: %s", what, task.exception())

    async def _close(self) -> None:
        await self._final_step(self.completer.drain(), "final writes")
        for task in list(self.consumers.tasks):
            task.cancel()
        if self.consumers.tasks:
            await asyncio.wait(self.consumers.tasks, timeout=1.0)
        # the tracked-exit gate: threads and children still running an actor are waited for (only the
        # watchdog bounds this); a consumer whose actor leaves meanwhile still writes its outcome
        for executor in self.executors():
            try:
                await executor.reap()
            except Exception as exc:
                log.warning("reaping %s failed: %s", type(executor).__name__, exc)
        if self.consumers.tasks:
            await asyncio.wait(self.consumers.tasks, timeout=1.0)
        await self._final_step(self.completer.drain(), "final writes")
        await self._final_step(self.store.deregister(), "deregistering the worker")
        await self.backend.close(timeout=self.step_budget() if self.db_in_doubt() else 5.0)

    def _describe_held(self) -> list[str]:
        return [f"{e.id}#{e.attempt}" for e in self.registry]


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and wait until they end, cancelling again whichever lost the cancel. On Python
    3.11 a cancel that lands just as asyncio.wait_for's inner wait completes is lost, and psycopg_pool
    waits for a pooled connection that way: a service loop cancelled while the pool hands it a connection
    would run on, and the worker would never finish stopping (its watchdog ends it with exit 13)."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.1)


async def settle(tasks: Iterable[asyncio.Task[Any]], budget: float) -> None:
    """Give `tasks` `budget` seconds to end, then cancel the rest, twice if need be: a second cancel
    interrupts psycopg's own wait to cancel a query on a server that does not answer (a hung server,
    a network partition), which closes that connection instead of waiting seconds for a reply."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(3):
        if not pending:
            return
        _, pending = await asyncio.wait(pending, timeout=budget)
        for task in pending:
            task.cancel()


def install_signal_handlers(worker: Worker, loop: asyncio.AbstractEventLoop) -> None:
    """SIGTERM/SIGINT only set the worker's shutdown event; the loop does the work. A supervisor's worker
    child was forked with both blocked (liveness.STOP_SIGNALS); they are unblocked now that they are
    handled, and one that came while the worker started is delivered here."""
    loop.add_signal_handler(signal.SIGTERM, worker.request_shutdown)
    loop.add_signal_handler(signal.SIGINT, worker.on_sigint)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


async def worker_main_async(
    settings: WorkerSettings,
    actors: ActorRegistry | Iterable[Actor[Any, Any]],
    *,
    handle_signals: bool | None = None,
    worker: Worker | None = None,
) -> int:
    """Run a worker until it is stopped (signal, its shutdown event, or cancelling this task).
    Returns the exit code (see taskq.worker.exitcodes)."""
    w = worker or Worker(settings, actors)
    if handle_signals is None:
        handle_signals = threading.current_thread() is threading.main_thread()
    loop = asyncio.get_running_loop()
    if handle_signals:
        install_signal_handlers(w, loop)
    try:
        code = await w.run()
    finally:
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        w.watchdog.disarm() if hasattr(w, "watchdog") else None
    return code


def tune_gc_for_worker() -> None:
    """A worker allocates a few short-lived objects per job: freeze what the imports made and collect
    the young generation less often (measured: about 20 µs of cyclic GC per job otherwise)."""
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


def worker_main(settings: WorkerSettings, actors: ActorRegistry | Iterable[Actor[Any, Any]]) -> int:
    """Run a worker on uvloop in this thread; returns the exit code."""
    import uvloop

    tune_gc_for_worker()
    teardown: list[threading.Timer] = []

    async def main() -> int:
        code = await worker_main_async(settings, actors)
        # The watchdog is disarmed now, and the loop's teardown (cancel every task left, wait for them all)
        # has no bound: a psycopg_pool worker task connecting to a server that never answers (hung, or
        # partitioned away) swallows that cancel and goes on with the next queued connection attempt, so a
        # fenced worker could hang here for as long as the server does. The process exits with its code
        # within EXIT_MARGIN of stopping, whatever is left.
        timer = threading.Timer(EXIT_MARGIN, os._exit, (code,))
        timer.daemon = True
        timer.start()
        teardown.append(timer)
        return code

    try:
        return uvloop.run(main())
    finally:
        for timer in teardown:
            timer.cancel()
