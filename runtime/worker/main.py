"""The worker process: one event loop, a dispatcher, consumers, a heartbeat, a listener, a sweeper and a
dependency resolver. This module is the wiring (each part is handed its collaborators) plus the shutdown
phases; the parts never import it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import threading
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from taskq.actors.declaration import Actor, ActorRegistry, as_registry
from taskq.actors.executors import AsyncioExecutor, Execution, Executor
from taskq.actors.thread import ThreadExecutor
from taskq.backend import CANCEL_CHANNEL, JOBS_CHANNEL, Backend
from taskq.backend.queues import QUEUES_CHANNEL
from taskq.backend.schedules import ScheduleStore
from taskq.backend.workers import WorkerStore
from taskq.dsn import resolve_dsn
from taskq.exitcodes import ExitCode
from taskq.logs import JobLines
from taskq.metrics import LEAKED_THREADS, SHUTDOWN_JOBS, WORKER_CAPACITY
from taskq.models import CancelOrigin
from taskq.settings import WorkerSettings
from taskq.worker.cancel import CancelController
from taskq.worker.classes import WorkerClasses
from taskq.worker.completer import Completer
from taskq.worker.consumer import Consumers
from taskq.worker.decisions import (
    EXIT_MARGIN,
    POOL_RECONNECT_TIMEOUT,
    db_in_doubt,
    phase_at_shutdown_force,
    release_budget,
    settle_budget,
    step_budget,
)
from taskq.worker.dispatcher import ClaimWake, Dispatcher
from taskq.worker.heartbeat import Heartbeat
from taskq.worker.hooks import Hooks
from taskq.worker.listener import Listener, cancel_route, queue_route, wake_route
from taskq.worker.liveness import STOP_SIGNALS, LivenessReporter
from taskq.worker.pruner import Pruner
from taskq.worker.queue_control import QueueControl
from taskq.worker.registry import ActiveJob, ActiveJobRegistry
from taskq.worker.release import Releaser
from taskq.worker.resolver import SETTLE_CHANNEL, Resolver
from taskq.worker.scheduler import Scheduler
from taskq.worker.service import Service, ServiceSet, cancel_and_wait, settle
from taskq.worker.state import WorkerState
from taskq.worker.sweeper import Sweeper
from taskq.worker.watchdog import ShutdownWatchdog

log = logging.getLogger("taskq.worker")

MARK_STOPPING_BUDGET = 1.0
"""Seconds the stop waits to flag the workers row `stopping` (a courtesy for operators) before going on."""


DEFAULT_SCHEDULE_OWNER = "default"
"""The owner of the schedules of an ActorRegistry that names none (`taskq worker APP` uses APP)."""


@dataclass(eq=False)
class WorkerParts:
    """The parts of a running worker, each handed its collaborators by `Worker._wire` once the backend
    is open. The services among them run until the stop; the others serve them."""

    backend: Backend
    store: WorkerStore
    completer: Completer
    control: QueueControl
    pruner: Pruner
    scheduler: Scheduler
    hooks: Hooks
    releaser: Releaser
    consumers: Consumers
    controller: CancelController
    heartbeat: Heartbeat
    wake: ClaimWake
    dispatcher: Dispatcher
    resolver: Resolver
    listener: Listener
    sweeper: Sweeper
    liveness: LivenessReporter | None

    def services(self, *, listens: bool) -> dict[str, Service]:
        """The services to run, by name, in their start order (the listener only with a LISTEN
        connection, the liveness reports only under a supervisor)."""
        found: dict[str, Service] = {
            "completer": self.completer, "heartbeat": self.heartbeat, "sweeper": self.sweeper,
            "resolver": self.resolver, "pruner": self.pruner, "scheduler": self.scheduler,
            "dispatcher": self.dispatcher,
        }
        if listens:
            found["listener"] = self.listener
        if self.liveness is not None:
            found["liveness"] = self.liveness
        return found


class Worker:
    """The wiring of one worker process (its parts, `Worker.parts` once running) and the shutdown
    phases. Every stop goes through `request_shutdown()`."""

    def __init__(self, settings: WorkerSettings, actors: ActorRegistry | Iterable[Actor[Any, Any]]) -> None:
        self.settings = settings
        self.actors = as_registry(actors)
        self.worker_id = settings.resolved_worker_id()
        self.classes = WorkerClasses.of(settings.capacities(), ((a.name, a.isolation) for a in self.actors))
        """Its actors' isolation classes and each class's capacity."""
        self.concurrency = self.classes.capacities["async"]
        """Async jobs this worker runs at once: the `concurrency` setting, or DEFAULT_CONCURRENCY."""
        self.registry = ActiveJobRegistry(self.classes.class_of if self.classes.mixed else None,
                                          single=self.classes.stray)
        self.state = WorkerState()
        self.ready = threading.Event()
        self.shutdown_event = asyncio.Event()
        self.skip_grace = asyncio.Event()
        """Set by a second SIGINT: skip what is left of the grace windows."""
        self.job_log = JobLines(self.worker_id) if settings.log_job_lines else None
        """The INFO line at each attempt's start and finish (None: `log_job_lines` off)."""
        self._async_executor = AsyncioExecutor()
        # a thread stuck after a forced stop the ladder does not own (timeout, lost lease) is given up
        # after the cleanup grace and counted toward max_leaked_threads, like an abandonment
        self._thread_executor = ThreadExecutor(settings.max_threads)
        self._thread_executor.configure(
            cleanup_grace_period=settings.cleanup_grace_period, on_leak_change=self.on_abandoned
        )
        self._process_executor: Executor | None = None
        self.watchdog = ShutdownWatchdog(settings.effective_shutdown_timeout, self._describe_held)
        self._parts: WorkerParts | None = None

    @property
    def parts(self) -> WorkerParts:
        """The running worker's parts (from the moment its backend is open)."""
        if self._parts is None:
            raise RuntimeError("the worker has not started: its parts exist once run() opened the backend")
        return self._parts

    @property
    def draining(self) -> bool:
        """The worker stopped claiming (its stop began); read by the supervisor's process title."""
        return self.state.draining

    # -- wiring ----------------------------------------------------------------------------------

    def _wire(self, backend: Backend, listen_dsn: str) -> WorkerParts:
        s = self.settings
        state, registry = self.state, self.registry
        store = WorkerStore(backend, self.worker_id)
        control = QueueControl(store, s.queues, s.poll_interval)
        wake = ClaimWake(state, control)
        completer = Completer(store, give_up_after=s.lock_timeout, on_queued=wake.slot_freed,
                              on_written=wake.limited_slot_freed,
                              class_of=registry.class_of_job if self.classes.mixed else None,
                              single=self.classes.stray)
        hooks = Hooks(backend)
        releaser = Releaser(store, state, hooks, budget=self._release_budget)
        consumers = Consumers(registry, self.actors, backend, store, completer, hooks,
                              executor_for=self.executor_for, release=releaser.release, on_done=wake.slot_freed,
                              job_log=self.job_log, lock_timeout=s.lock_timeout)
        controller = CancelController(registry, state, store, completer, hooks, worker_id=self.worker_id,
                                      cancellation_grace_period=s.cancellation_grace_period,
                                      cleanup_grace_period=s.cleanup_grace_period, on_abandoned=self.on_abandoned)
        heartbeat = Heartbeat(backend, store, registry, state, queues=s.queues, classes=self.classes,
                              heartbeat_interval=s.heartbeat_interval, lock_timeout=s.lock_timeout,
                              in_tx=controller.run_in_tx, post_tx=controller.run_post_tx,
                              on_leases_lost=self.lose_leases)
        dispatcher = Dispatcher(store, registry, state, control, completer, wake, spawn=consumers.spawn,
                                release_unstarted=releaser.release_unstarted, queues=s.queues,
                                classes=self.classes, claim_batch_size=s.claim_batch_size,
                                lock_timeout=s.lock_timeout, poll_interval=s.poll_interval,
                                unavailable=self._unavailable_slots)
        # the NOTIFY wakes the resolver at once; its poll only catches a backlog left by a crash, so it is
        # as slow as the sweeper's unless no LISTEN connection is there to wake it
        resolver = Resolver(store, interval=s.sweep_interval if s.listens() else s.poll_interval)

        def reconnected() -> None:
            control.invalidate()  # a pause or limit change made while we were away
            wake.set()  # anything enqueued while we were away
            resolver.wake.set()  # a backlog written while we were away

        listener = Listener(listen_dsn, {
            JOBS_CHANNEL: queue_route(s.queues, wake.set),
            CANCEL_CHANNEL: cancel_route(self.worker_id, controller.on_notification),
            SETTLE_CHANNEL: wake_route(resolver.wake.set),
            QUEUES_CHANNEL: queue_route(s.queues, control.invalidate, wake.set, any_queue="*"),
        }, on_connect=reconnected, worker_id=self.worker_id)
        if s.listens():
            resolver.fallback = (listener.connected.is_set, s.poll_interval)
        return WorkerParts(
            backend=backend, store=store, completer=completer, control=control, pruner=Pruner(store, s),
            scheduler=Scheduler(ScheduleStore(backend), self.actors.schedules(),
                                owner=self.actors.owner or DEFAULT_SCHEDULE_OWNER,
                                poll_interval=s.schedule_poll_interval),
            hooks=hooks, releaser=releaser, consumers=consumers, controller=controller, heartbeat=heartbeat,
            wake=wake, dispatcher=dispatcher, resolver=resolver, listener=listener,
            sweeper=Sweeper(store, registry, sweep_interval=s.sweep_interval,
                            dead_after=max(2 * s.lock_timeout, 10 * s.heartbeat_interval, 60.0)),
            liveness=LivenessReporter.from_env(
                worker_id=self.worker_id, queues=s.queues, worker_timeout=s.worker_timeout, registry=registry,
                state=state, ready=lambda: listener.connected.is_set() or heartbeat.ticks > 0,
                on_orphaned=self.request_shutdown,
            ),
        )

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

    def _unavailable_slots(self, isolation: str) -> int:
        """Slots of a class no held job takes but that are not free: a leaked thread keeps its thread."""
        return self._thread_executor.leaked_threads if isolation == "thread" else 0

    def leaked_threads(self) -> int:
        return sum(int(getattr(ex, "leaked_threads", 0)) for ex in self.executors())

    def on_abandoned(self, entry: Execution) -> None:
        """After an abandonment verdict: a thread that never left keeps its slot; too many of them and
        the worker restarts itself through the normal shutdown path (only process exit frees them)."""
        self.parts.wake.slot_freed()
        leaked = self.leaked_threads()
        LEAKED_THREADS.set(leaked)
        if leaked > self.settings.max_leaked_threads and not self.state.draining:
            log.error("%d actor threads leaked (max_leaked_threads=%d): restarting this worker",
                      leaked, self.settings.max_leaked_threads)
            self.state.exit_code = ExitCode.LEAKED_THREADS
            self.request_shutdown()

    def lose_leases(self, why: str) -> None:
        """Self-fencing: our leases are gone, so stop every actor without writing anything."""
        if self.state.leases_lost:
            return
        log.error("%s: stopping every actor without writing (the sweeper will recover the rows)", why)
        self.state.leases_lost = True
        self.state.exit_code = ExitCode.LEASES_LOST
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

    def db_in_doubt(self) -> bool:
        """The database did not answer lately: the exit path gives each last step a short budget."""
        return db_in_doubt(leases_lost=self.state.leases_lost, unreleased=len(self.state.unreleased),
                           heartbeat_failures=self.parts.heartbeat.consecutive_failures)

    def step_budget(self) -> float:
        """Seconds for one last database step once the database is in doubt (decisions.step_budget)."""
        return step_budget(self.watchdog.remaining())

    def _release_budget(self) -> float:
        return release_budget(in_doubt=self.db_in_doubt(), step=self.step_budget())

    def _settle_budget(self) -> float:
        return settle_budget(in_doubt=self.db_in_doubt(), watchdog_left=self.watchdog.remaining())

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        s = self.settings
        dsn = resolve_dsn(s.dsn_value())
        # the worker's connections name it, so that the lease-loss trigger tells its own writes apart
        backend = await Backend.open(dsn, min_size=2, max_size=max(4, min(20, self.concurrency // 50 + 4)),
                                     reconnect_timeout=POOL_RECONNECT_TIMEOUT,
                                     worker_id=self.worker_id, transaction_pooler=s.transaction_pooler,
                                     abandon=lambda: self._parts is not None and self.db_in_doubt())
        listen_dsn = s.listen_dsn_value()
        p = self._parts = self._wire(backend, resolve_dsn(listen_dsn) if listen_dsn else dsn)
        await p.store.register(s.queues, self.concurrency, s.lock_timeout, capacities=self.classes.capacities,
                               actor_isolation=self.classes.actors)
        for isolation, capacity in self.classes.capacities.items():
            WORKER_CAPACITY.labels(isolation=isolation).set(capacity)
        # this code's actor limits, for the whole fleet (the last worker to start wins)
        if await p.store.sync_actor_limits({a.name: a.limits for a in self.actors}):
            log.info("actor limits written: %s", {a.name: a.limits.describe() for a in self.actors if a.limits.any})
        taken = await p.store.take_over()
        if taken:
            log.warning("reclaimed %s left running under worker id %s by an earlier process", taken, self.worker_id)
        await p.scheduler.sync()  # code declarations are upserted when a worker starts
        log.info("worker %s started: queues=%s capacity: %s actors=%s", self.worker_id, s.queues,
                 self.classes.describe(), self.actors.names())
        if not s.listens():
            log.info("no LISTEN connection (transaction_pooler without listen_dsn): polling every %.2fs, "
                     "cancel requests arrive with the heartbeat", s.poll_interval)
        # the completer stops last: cancelling it mid-write could drop the batch it holds
        services = ServiceSet(p.services(listens=s.listens()), last="completer")
        services.start()
        stop_wait = loop.create_task(self.shutdown_event.wait(), name="taskq-stop-wait")
        self.ready.set()
        cancelled_from_outside = False
        try:
            try:
                # the first service to end stops the worker, like a signal
                for name, exc in await services.wait_first(stop_wait):
                    log.error("worker service %s crashed; shutting down", name, exc_info=exc)
                    self.state.exit_code = ExitCode.INTERNAL
            except asyncio.CancelledError:
                # a bare cancel of the worker task is a supported stop path: same as a signal
                cancelled_from_outside = True
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
            await self._shutdown(p, services)
        finally:
            stop_wait.cancel()
            others = services.cancel_others()
            if self.db_in_doubt():  # a service may be stuck cancelling a query the server never answers
                await settle([*others, *p.heartbeat.stuck_ticks()], self.step_budget())
            await cancel_and_wait([*others, stop_wait])
            await asyncio.gather(*others, stop_wait, return_exceptions=True)
            try:
                await self._final_step(p.completer.drain(), "final writes")
            finally:
                await services.cancel_last()
                await self._close(p)
        if cancelled_from_outside:
            raise asyncio.CancelledError
        return self.state.exit_code

    async def _shutdown(self, p: WorkerParts, services: ServiceSet) -> None:
        """DRAINING -> SIGNALLED -> FORCED -> RELEASING -> EXITING (spec §4, §9). Heartbeats keep
        running until the end, so every lease stays valid while the phases play out."""
        self.watchdog.arm()
        s, state = self.settings, self.state
        # DRAINING: stop claiming at once (and pruning, after its current batch)
        state.draining = True
        state.shutdown_active = True
        services.stop()
        log.info("worker %s shutting down with %d jobs in flight", self.worker_id, len(self.registry))
        if state.leases_lost:
            await self._wait_empty(p, s.cleanup_grace_period)
            return
        # informational only: never let an unreachable database hold up the stop
        await self._bounded(p.store.mark_stopping(), MARK_STOPPING_BUDGET, "marking the worker stopping")
        # SIGNALLED: record why (SHUTDOWN) before setting each cancel event
        for entry in self.registry:
            entry.request_cancel(CancelOrigin.SHUTDOWN)
        await self._wait_empty(p, s.cancellation_grace_period)
        # FORCED: the executor's force path; an operator-cancelled job is now a forced cancel
        for entry in self.registry:
            if entry.finishing:
                continue
            entry.cancel_phase = phase_at_shutdown_force(entry.cancel_origin, entry.cancel_phase)
            entry.force("shutdown")
        await self._wait_empty(p, s.cleanup_grace_period)
        # RELEASING: operator-cancelled rows end cancelled (forced); the rest go back to the fleet.
        # An actor still executing (a thread stuck in C) keeps its row: releasing it would let a second
        # execution start beside it; the watchdog ends the process and the sweeper reclaims the row.
        remaining = [e for e in self.registry if not e.finishing and not self._still_executing(e)]
        if remaining:
            await p.releaser.release(remaining)
        await self._wait_empty(p, 0.5)
        if state.releasing:  # a consumer's release still waiting on the database: its last seconds
            state.releases_settled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.releases_settled.wait(), self._settle_budget())
        # EXITING
        summary = state.summary
        summary["held"] = [str(e.id) for e in self.registry if not e.finishing or self._still_executing(e)]
        summary["held"] += [i for i in state.unreleased if i not in summary["held"]]
        if state.releasing:  # given back by nobody: the sweeper's, once the lease runs out
            summary["held"] += [i for i in state.releasing if i not in summary["held"]]
            state.exit_code = ExitCode.LEASES_LOST
        for outcome, ids in summary.items():
            SHUTDOWN_JOBS.labels(outcome=outcome).inc(len(ids))
        log.info("worker %s stopped: released=%s cancelled=%s crashed=%s still_held=%s", self.worker_id,
                 summary["released"], summary["cancelled"], summary["crashed"], summary["held"])

    @staticmethod
    def _still_executing(entry: ActiveJob) -> bool:
        probe = getattr(entry.executor, "still_running", None)
        return bool(probe is not None and probe(entry))

    async def _wait_empty(self, p: WorkerParts, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        wake = p.wake.event
        while loop.time() < deadline and not self.skip_grace.is_set():
            if not any(not e.finishing for e in self.registry) and not p.consumers.tasks:
                return
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), min(0.05, max(0.0, deadline - loop.time())))
            except TimeoutError:
                pass

    async def _final_step(self, step: Coroutine[Any, Any, None], what: str) -> None:
        """A last database step of the exit path. When the database did not answer lately (the leases were
        lost, a release failed, heartbeats fail) give it step_budget() seconds (decisions.step_budget) rather
        than the pool's own waits, so the worker exits promptly instead of being killed by its watchdog."""
        if not self.db_in_doubt():
            try:
                await step
            except Exception as exc:
                log.warning("%s failed: %s", what, exc)
            return
        await self._bounded(step, self.step_budget(), what)

    @staticmethod
    async def _bounded(step: Coroutine[Any, Any, None], budget: float, what: str) -> None:
        task = asyncio.get_running_loop().create_task(step)
        await settle([task], budget)
        if not task.done() or task.cancelled():
            log.warning("%s: no answer from the database in time; the sweeper will clean up", what)
        elif task.exception() is not None:
            log.warning("%s failed: %s", what, task.exception())

    async def _close(self, p: WorkerParts) -> None:
        await self._final_step(p.completer.drain(), "final writes")
        consumers = p.consumers
        for task in list(consumers.tasks):
            task.cancel()
        if consumers.tasks:
            await asyncio.wait(consumers.tasks, timeout=1.0)
        # the tracked-exit gate: threads and children still running an actor are waited for (only the
        # watchdog bounds this); a consumer whose actor leaves meanwhile still writes its outcome
        for executor in self.executors():
            try:
                await executor.reap()
            except Exception as exc:
                log.warning("reaping %s failed: %s", type(executor).__name__, exc)
        if consumers.tasks:
            await asyncio.wait(consumers.tasks, timeout=1.0)
        await self._final_step(p.completer.drain(), "final writes")
        # releases asked for by consumers the teardown cancelled are still written (Releaser)
        if not await p.releaser.settled(self._settle_budget()):
            log.warning("releases not written in time: left to the sweeper once their lease runs out")
            await p.releaser.abandon()
        await self._final_step(p.store.deregister(), "deregistering the worker")
        await p.backend.close(timeout=self.step_budget() if self.db_in_doubt() else 5.0)

    def _describe_held(self) -> list[str]:
        return [f"{e.id}#{e.attempt}" for e in self.registry]


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
    Returns the exit code (see taskq.exitcodes.ExitCode)."""
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
