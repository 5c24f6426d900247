"""The supervisor's main loop: one thread, one poll() over the liveness pipes and a signal self-pipe.

Signal handlers only record the signal (a SimpleQueue, plus the wakeup fd that ends the poll); the loop
acts on it. Each turn of the loop: read liveness reports, act on signals, reap children (and reclaim
a dead worker's leases at once), kill silent workers, advance a rolling restart or a stop, spawn what
is missing, then publish (proctitle, sd_notify STATUS/WATCHDOG, health for the HTTP helper).
"""

from __future__ import annotations

import logging
import os
import queue
import select
import signal
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from taskq.exitcodes import ExitCode
from taskq.metrics import WORKER_RESTARTS
from taskq.settings import WorkerSettings
from taskq.supervisor import proctitle
from taskq.supervisor.metrics_http import MetricsHelper, mark_worker_dead
from taskq.supervisor.reclaim import Reclaimer
from taskq.supervisor.restart import OUTAGE_EXIT_CODES, RestartPolicy
from taskq.supervisor.sdnotify import Notifier, watchdog_interval
from taskq.supervisor.spawn import HANDLED_SIGNALS, child_hygiene, exit_child, run_worker_child
from taskq.supervisor.web_child import WebChild
from taskq.supervisor.workers import WorkerProc

log = logging.getLogger("taskq.supervisor")

PUBLISH_INTERVAL = 0.5
STATUS_MIN_INTERVAL = 1.0


@dataclass(frozen=True)
class SupervisorOptions:
    """Supervisor-only options (the workers' own settings are a WorkerSettings). Seconds are floats."""

    app: str
    workers: int
    crash_limit: int = 5
    """Stop with CRASH_LOOP after this many unexpected worker deaths within crash_window."""
    crash_window: float = 60.0
    restart_backoff: float = 0.5
    """Delay before replacing a dead worker; doubles with each death within crash_window."""
    restart_backoff_max: float = 30.0
    kill_grace: float = 5.0
    """After SIGABRT to a silent worker, wait this long before SIGKILL."""
    stop_margin: float = 5.0
    """After SIGTERM, SIGKILL a worker still running at shutdown_timeout + stop_margin."""
    fast_stop_grace: float = 2.0
    """SIGQUIT: SIGTERM every worker, SIGKILL whatever still runs after this long."""
    ready_timeout: float = 60.0
    """Rolling restart: give up if a new worker is not ready within this long."""
    preload: bool = True
    """Import APP once in the supervisor (fail fast, shared memory); False: each worker imports it after
    the fork, so a rolling restart (SIGHUP) picks up new code."""
    metrics: bool = True


@dataclass
class Roll:
    """A rolling restart in progress: the old workers still to replace, one at a time."""

    old: deque[int]
    new_pid: int | None = None
    total: int = 0


@dataclass
class Supervisor:
    options: SupervisorOptions
    settings: WorkerSettings
    dsn: str
    registry: Any
    """The imported actors (preload), or None when each worker imports APP itself."""
    inherited_fds: set[int] = field(default_factory=set)
    web: WebChild | None = None
    """`taskq run --web-port`: the dashboard's process, started with the loop and restarted like a worker."""

    def __post_init__(self) -> None:
        self.pid = os.getpid()
        self.reclaimer_id = f"supervisor:{socket.gethostname()}:{self.pid}"
        self.workers: dict[int, WorkerProc] = {}
        self.by_fd: dict[int, WorkerProc] = {}
        self.desired = self.options.workers
        self.policy = RestartPolicy(self.options.crash_limit, self.options.crash_window,
                                    self.options.restart_backoff, self.options.restart_backoff_max)
        self.next_spawn_at = 0.0
        self.stopping: str | None = None
        self.exit_code: int | None = None
        self.unclean_stop = False
        self.ready_sent = False
        self.roll: Roll | None = None
        self.spawned = 0
        self.signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.notifier = Notifier()
        self.watchdog_every = watchdog_interval()
        self.next_watchdog = 0.0
        self.helper: MetricsHelper | None = None
        self.reclaimer = Reclaimer(self.dsn, self.reclaimer_id, give_up_after=self.settings.lock_timeout)
        self._poll = select.poll()
        self._wake_r = self._wake_w = -1
        self._last_title = ""
        self._last_status = ""
        self._status_sent_at = -1e9
        self._health_at = -1e9
        self._warned_threads = False

    # -- setup --------------------------------------------------------------------------------------

    def bind_metrics(self) -> str | None:
        """Bind the HTTP endpoint (before anything is forked); returns its address. OSError if taken."""
        if not self.options.metrics:
            return None
        dir_ = os.environ["PROMETHEUS_MULTIPROC_DIR"]
        self.helper = MetricsHelper(self.settings.metrics_host, self.settings.metrics_port,
                                    dsn=self.dsn, metrics_dir=dir_)
        return self.helper.address

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, self._on_signal)
        self._poll.register(self._wake_r, select.POLLIN)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.put_nowait(signum)

    # -- forking ------------------------------------------------------------------------------------

    def _parent_fds(self) -> list[int]:
        fds = [self._wake_r, self._wake_w, *self.by_fd, *self.inherited_fds]
        if self.helper is not None:
            fds += self.helper.parent_fds()
        notify_fd = self.notifier.fileno()
        if notify_fd is not None:
            fds.append(notify_fd)
        return [fd for fd in fds if fd >= 0]

    def _child_setup(self, keep: list[int], worker: bool = False) -> None:
        """Fork hygiene for any child of ours (worker or HTTP helper)."""
        # sockets are closed through their objects (detach), so nothing closes their numbers twice
        owned = {self.notifier.fileno(), self.helper.sock.fileno() if self.helper is not None else None}
        child_hygiene(parent_pid=self.pid, close_fds=[fd for fd in self._parent_fds() if fd not in owned],
                      keep_fds=keep, hold_stop_signals=worker)
        self.notifier.detach_in_child()
        if self.helper is not None and self.helper.sock.fileno() not in keep:
            os.close(self.helper.sock.detach())

    def _fork(self) -> int:
        """fork() with our signals blocked, so none can reach the child's copy of our handlers (whose
        wakeup fd is the parent's pipe) before the child has reset them."""
        if threading.active_count() > 1 and not self._warned_threads:
            self._warned_threads = True
            log.warning("forking while %d threads exist (%s): something started a thread in the supervisor "
                        "(APP at import time?); its locks may be copied into workers in a held state",
                        threading.active_count(), [t.name for t in threading.enumerate()])
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
        try:
            pid = os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            raise
        if pid != 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return pid

    def _worker_id(self, pid: int, token: str, number: int) -> str:
        if self.settings.worker_id:
            return f"{self.settings.worker_id}-{number}"
        return f"{socket.gethostname()}:{pid}:{token}"

    def _spawn_worker(self, now: float) -> WorkerProc:
        self.spawned += 1
        number = self.spawned
        token = os.urandom(3).hex()
        read_fd, write_fd = os.pipe()
        pid = self._fork()
        if pid == 0:
            code: int = ExitCode.INTERNAL
            try:
                self._child_setup(keep=[write_fd], worker=True)
                os.close(read_fd)
                worker_id = self._worker_id(os.getpid(), token, number)
                settings = self.settings.model_copy(update={"worker_id": worker_id})
                code = run_worker_child(app=self.options.app, registry=self.registry, settings=settings,
                                        number=number, liveness_fd=write_fd)
            except BaseException:
                log.exception("worker %d failed before it could start", number)
            finally:
                exit_child(code)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        wp = WorkerProc(number=number, pid=pid, worker_id=self._worker_id(pid, token, number), fd=read_fd,
                        spawned_at=now, last_seen=now, queues=list(self.settings.queues))
        self.workers[pid] = wp
        self.by_fd[read_fd] = wp
        self._poll.register(read_fd, select.POLLIN)
        log.info("spawned worker %d (pid %d, id %s)", number, pid, wp.worker_id)
        return wp

    def _fork_helper(self) -> None:
        """Fork the HTTP helper, with our signals blocked for the same reason as in _fork()."""
        assert self.helper is not None
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
        try:
            self.helper.start(self._child_setup)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    # -- the loop -----------------------------------------------------------------------------------

    def run(self) -> int:
        self._install_signals()
        capacity = " ".join(f"{c}={n}" for c, n in self.settings.capacities().items())
        log.info("supervisor %d starting %d workers for %s (queues=%s, capacity: %s each)", self.pid,
                 self.desired, self.options.app, ",".join(self.settings.queues), capacity)
        if self.helper is not None:
            self._fork_helper()
            log.info("metrics endpoint on http://%s/metrics (also /healthz, /readyz)", self.helper.address)
        if self.web is not None:
            self.web.start()
        self._publish(self._now())
        while True:
            now = self._now()
            self._spawn_missing(now)
            for fd, _events in self._poll.poll(self._timeout(now) * 1000):
                if fd == self._wake_r:
                    self._drain_wakeups()
                else:
                    self._read(fd, self._now())
            now = self._now()
            self._handle_signals(now)
            self._reap(now)
            self._check_workers(now)
            self.reclaimer.retry_due(now)
            if self.stopping is None:
                self._advance_roll(now)
                self._spawn_missing(now)
                self._maybe_ready()
                self._keep_helper(now)
                if self.web is not None:
                    self.web.keep(now)
            elif not self.workers:
                break
            self._publish(now)
        return self._finish()

    @staticmethod
    def _now() -> float:
        return time.monotonic()

    def _timeout(self, now: float) -> float:
        deadlines = [now + PUBLISH_INTERVAL]
        if self.stopping is None and self._active_count() < self.desired:
            deadlines.append(self.next_spawn_at)
        if self.watchdog_every:
            deadlines.append(self.next_watchdog)
        for wp in self.workers.values():
            if wp.kill_sent_at is not None:
                continue
            if wp.abort_sent_at is not None:
                deadlines.append(wp.abort_sent_at + self.options.kill_grace)
            else:
                deadlines.append(wp.last_seen + self.settings.worker_timeout)
            if wp.stop_deadline is not None:
                deadlines.append(wp.stop_deadline)
        if self.stopping is None and self.web is not None and self.web.restart_at is not None:
            deadlines.append(self.web.restart_at)
        retry_at = self.reclaimer.next_try()
        if retry_at is not None:
            deadlines.append(retry_at)
        return max(0.0, min(deadlines) - now)

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _read(self, fd: int, now: float) -> None:
        wp = self.by_fd.get(fd)
        if wp is None:
            self._poll.unregister(fd)
            return
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # the worker closed its end (it is exiting); waitpid tells the rest
                self._close_pipe(wp)
                return
            wp.feed(data, now)
            if wp.state == "ready":
                self.policy.worker_ready()

    def _close_pipe(self, wp: WorkerProc) -> None:
        if wp.fd is None:
            return
        self._poll.unregister(wp.fd)
        self.by_fd.pop(wp.fd, None)
        os.close(wp.fd)
        wp.fd = None

    # -- signals ------------------------------------------------------------------------------------

    def _handle_signals(self, now: float) -> None:
        while True:
            try:
                sig = self.signals.get_nowait()
            except queue.Empty:
                return
            name = signal.Signals(sig).name
            if sig in (signal.SIGTERM, signal.SIGINT):
                if self.stopping is None:
                    log.info("%s: stopping gracefully (workers release their jobs)", name)
                    self._begin_stop("graceful", now)
                elif sig == signal.SIGINT and self.stopping == "graceful":
                    log.warning("SIGINT again: fast stop")
                    self._begin_stop("fast", now)
            elif sig == signal.SIGQUIT:
                log.warning("SIGQUIT: fast stop (SIGKILL after %gs)", self.options.fast_stop_grace)
                self._begin_stop("fast", now)
            elif sig == signal.SIGHUP:
                self._start_roll(now)
            elif sig == signal.SIGTTIN and self.stopping is None:
                self.desired += 1
                log.info("SIGTTIN: %d workers wanted", self.desired)
            elif sig == signal.SIGTTOU and self.stopping is None:
                self._scale_down(now)

    def _scale_down(self, now: float) -> None:
        if self.desired <= 1:
            log.info("SIGTTOU ignored: already at one worker")
            return
        self.desired -= 1
        log.info("SIGTTOU: %d workers wanted", self.desired)
        candidates = [wp for wp in self.workers.values()
                      if wp.active and not (self.roll is not None and wp.pid == self.roll.new_pid)]
        if len(candidates) > self.desired:
            # not-yet-ready workers first (they hold nothing), then the oldest
            victim = min(candidates, key=lambda wp: (wp.state == "ready", wp.number))
            self._retire(victim, "scale down", now)

    # -- stopping workers ---------------------------------------------------------------------------

    def _retire(self, wp: WorkerProc, why: str, now: float, budget: float | None = None) -> None:
        """SIGTERM a worker we will not replace; SIGKILL it if it outlives its budget."""
        if wp.retiring is None:
            wp.retiring = why
        if wp.term_sent_at is None:
            wp.term_sent_at = now
            wp.send(signal.SIGTERM)
            log.info("worker %d (pid %d): SIGTERM (%s)", wp.number, wp.pid, why)
        if budget is None:
            budget = self.settings.effective_shutdown_timeout + self.options.stop_margin
        deadline = now + budget
        wp.stop_deadline = deadline if wp.stop_deadline is None else min(wp.stop_deadline, deadline)

    def _kill(self, wp: WorkerProc, now: float, why: str) -> None:
        log.error("worker %d (pid %d) %s: SIGKILL", wp.number, wp.pid, why)
        wp.kill_sent_at = now
        wp.send(signal.SIGKILL)

    def _begin_stop(self, kind: str, now: float, exit_code: int | None = None) -> None:
        if exit_code is not None and self.exit_code is None:
            self.exit_code = exit_code
        if self.stopping == "fast" or self.stopping == kind:
            return
        if self.stopping is None:
            self.notifier.stopping(f"stopping: {len(self.workers)} workers releasing their jobs")
            if self.roll is not None:
                log.warning("rolling restart interrupted by the stop")
                self.roll = None
        self.stopping = kind
        budget = self.options.fast_stop_grace if kind == "fast" else None
        for wp in self.workers.values():
            self._retire(wp, "stop", now, budget)

    def _check_workers(self, now: float) -> None:
        timeout = self.settings.worker_timeout
        for wp in list(self.workers.values()):
            if wp.kill_sent_at is not None:
                continue
            if wp.abort_sent_at is not None:
                if now - wp.abort_sent_at >= self.options.kill_grace:
                    self._kill(wp, now, f"still alive {self.options.kill_grace:g}s after SIGABRT")
                continue
            silent = now - wp.last_seen
            if silent > timeout:
                wp.silent_for = silent
                wp.abort_sent_at = now
                log.error("worker %d (pid %d) silent for %.1fs (worker_timeout %gs): SIGABRT (its stacks "
                          "follow), SIGKILL in %gs", wp.number, wp.pid, silent, timeout,
                          self.options.kill_grace)
                wp.send(signal.SIGABRT)
            elif wp.stop_deadline is not None and now >= wp.stop_deadline:
                self._kill(wp, now, f"still running {now - (wp.term_sent_at or now):.1f}s after SIGTERM")

    # -- deaths ---------------------------------------------------------------------------------------

    def _reap(self, now: float) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.helper is not None and pid == self.helper.pid:
                if self.stopping is None:
                    log.error("the metrics helper (pid %d) died (status %d); restarting it", pid, status)
                self.helper.on_exit(now)
                continue
            if self.web is not None and pid == self.web.pid:
                self.web.on_exit(status, now, stopping=self.stopping is not None)
                continue
            wp = self.workers.pop(pid, None)
            if wp is not None:
                self._on_exit(wp, status, now)

    def _on_exit(self, wp: WorkerProc, status: int, now: float) -> None:
        if wp.fd is not None:
            self._read(wp.fd, now)
            self._close_pipe(wp)
        code, text = wp.describe_exit(status)
        mark_worker_dead(wp.pid)
        expected = wp.retiring is not None or self.stopping is not None
        level = logging.INFO if expected and code == 0 else logging.ERROR
        log.log(level, "worker %d (pid %d) %s", wp.number, wp.pid, text)
        # even after exit 0: whatever is still 'running' under a dead worker's id is orphaned
        cause = "heartbeat_timeout" if wp.silent_for is not None else "worker_died"
        self.reclaimer.reclaim(wp.worker_id, cause, text, now)
        if self.stopping is not None or wp.retiring == "stop":
            if code != ExitCode.OK:
                self.unclean_stop = True
            return
        if self.roll is not None and self.roll.new_pid == wp.pid:
            self.roll.new_pid = None
            self._end_roll(f"the new worker {text} before it was ready; the old workers keep running")
            self._count_death(wp, code, now, replace=False)
            return
        if wp.retiring is not None:
            return  # replaced by a rolling restart, or scaled down: nothing owed
        if self.policy.is_boot_failure(code, ever_ready=wp.ever_ready, supervisor_was_ready=self.ready_sent):
            log.error("worker %d failed at boot with exit code %d: stopping (restarting cannot fix this)",
                      wp.number, code)
            self._begin_stop("graceful", now, exit_code=code)
            return
        self._count_death(wp, code, now, replace=True)

    def _count_death(self, wp: WorkerProc, code: int, now: float, *, replace: bool) -> None:
        delay = self.policy.record_death(now, code)
        if delay is None:
            log.error("%d workers died within %gs: crash loop, stopping with exit code %d",
                      self.options.crash_limit, self.options.crash_window, ExitCode.CRASH_LOOP)
            self._begin_stop("graceful", now, exit_code=ExitCode.CRASH_LOOP)
            return
        if replace:
            self.next_spawn_at = max(self.next_spawn_at, now + delay)
            WORKER_RESTARTS.inc()
            if code in OUTAGE_EXIT_CODES:
                log.warning("worker %d ended because the database is out of reach (exit code %d): replacing it "
                            "in %.2fs, not counted as a crash", wp.number, code, delay)
            else:
                log.info("replacing worker %d in %.2fs", wp.number, delay)

    # -- capacity -----------------------------------------------------------------------------------

    def _active_count(self) -> int:
        new_pid = self.roll.new_pid if self.roll is not None else None
        return sum(1 for wp in self.workers.values() if wp.active and wp.pid != new_pid)

    def _spawn_missing(self, now: float) -> None:
        if self.stopping is not None or now < self.next_spawn_at:
            return
        while self._active_count() < self.desired:
            try:
                self._spawn_worker(now)
            except OSError as exc:  # EAGAIN/ENOMEM: out of processes or memory, for now
                delay = self.options.restart_backoff_max
                log.error("cannot fork a worker: %s; retrying in %.1fs", exc, delay)
                self.next_spawn_at = now + delay
                return

    def _maybe_ready(self) -> None:
        if self.ready_sent or self.roll is not None:
            return
        ready = sum(1 for wp in self.workers.values() if wp.active and wp.state == "ready")
        if ready >= self.desired:
            self.ready_sent = True
            self.notifier.ready(self._status_text())
            log.info("ready: %d workers connected and listening", ready)

    def _keep_helper(self, now: float) -> None:
        h = self.helper
        if h is not None and h.pid is None and h.restart_at is not None and now >= h.restart_at:
            self._fork_helper()

    # -- rolling restart ----------------------------------------------------------------------------

    def _start_roll(self, now: float) -> None:
        if self.stopping is not None:
            return
        new_pid = self.roll.new_pid if self.roll is not None else None
        old = sorted((wp for wp in self.workers.values() if wp.active and wp.pid != new_pid),
                     key=lambda wp: wp.number)
        if self.roll is None:
            self.roll = Roll(deque(wp.pid for wp in old), total=len(old))
        else:
            self.roll.old = deque(wp.pid for wp in old)
            self.roll.total = len(old)
        if self.ready_sent:
            self.notifier.reloading()
        log.info("SIGHUP: rolling restart of %d workers, one at a time", len(old))
        self._advance_roll(now)

    def _next_old(self) -> WorkerProc | None:
        roll = self.roll
        assert roll is not None
        while roll.old:
            wp = self.workers.get(roll.old[0])
            if wp is not None and wp.active:
                return wp
            roll.old.popleft()
        return None

    def _advance_roll(self, now: float) -> None:
        roll = self.roll
        while roll is not None:
            if roll.new_pid is not None:
                new = self.workers.get(roll.new_pid)
                if new is None:
                    return  # its death ends the roll (_on_exit)
                if new.state != "ready":
                    if now - new.spawned_at > max(self.options.ready_timeout, self.settings.worker_timeout):
                        self._retire(new, "not ready in time", now)
                        roll.new_pid = None
                        self._end_roll(f"worker {new.number} was not ready within "
                                       f"{self.options.ready_timeout:g}s; the old workers keep running")
                    return
                roll.new_pid = None
                old = self._next_old()
                if old is not None:
                    roll.old.popleft()
                    self._retire(old, "rolling restart", now)
                continue
            if self._next_old() is None:
                self._end_roll(None)
                return
            try:
                roll.new_pid = self._spawn_worker(now).pid
            except OSError as exc:
                self._end_roll(f"cannot fork a new worker: {exc}")
            return

    def _end_roll(self, failure: str | None) -> None:
        total = self.roll.total if self.roll is not None else 0
        self.roll = None
        if failure:
            log.error("rolling restart aborted: %s", failure)
        else:
            log.info("rolling restart done: %d workers replaced", total)
        self.ready_sent = True
        self.notifier.ready(self._status_text())

    # -- publishing ---------------------------------------------------------------------------------

    def _status_text(self) -> str:
        active = [wp for wp in self.workers.values() if wp.active]
        ready = sum(1 for wp in active if wp.state == "ready")
        draining = sum(1 for wp in self.workers.values() if not wp.active or wp.state == "draining")
        in_flight = sum(wp.in_flight for wp in self.workers.values())
        text = f"{len(active)} workers ({ready} ready), {in_flight} jobs in flight, {draining} draining"
        if self.stopping:
            text += f"; stopping ({self.stopping})"
        elif self.roll is not None:
            text += f"; rolling restart {self.roll.total - len(self.roll.old)}/{self.roll.total}"
        return text

    def _all_live(self, now: float) -> bool:
        return all(now - wp.last_seen <= self.settings.worker_timeout for wp in self.workers.values())

    def _publish(self, now: float) -> None:
        active = sum(1 for wp in self.workers.values() if wp.active)
        in_flight = sum(wp.in_flight for wp in self.workers.values())
        phase = "stopping" if self.stopping else "reloading" if self.roll is not None else None
        title = proctitle.supervisor_title(active, in_flight, self.options.app, phase)
        if title != self._last_title:
            proctitle.set_title(title)
            self._last_title = title
        status = self._status_text()
        if status != self._last_status and now - self._status_sent_at >= STATUS_MIN_INTERVAL:
            self.notifier.status(status)
            self._last_status = status
            self._status_sent_at = now
        live = self._all_live(now)
        if self.watchdog_every and now >= self.next_watchdog and live:
            self.notifier.watchdog()
            self.next_watchdog = now + self.watchdog_every
        if self.helper is not None and now - self._health_at >= PUBLISH_INTERVAL:
            self._health_at = now
            if self.stopping:
                healthy, reason = False, "stopping"
            elif not self.workers:
                healthy, reason = False, "no workers running (restart backoff)"
            elif not live:
                healthy, reason = False, "a worker missed its liveness reports for worker_timeout"
            else:
                healthy, reason = True, "ok: " + status
            self.helper.publish({"healthy": healthy, "reason": reason})

    def _finish(self) -> int:
        self.reclaimer.flush(self._now())
        self.notifier.status("stopped")
        if self.web is not None:
            self.web.stop()
        if self.helper is not None:
            self.helper.stop()
            self.helper.close()
        self.notifier.close()
        signal.set_wakeup_fd(-1)
        code = self.exit_code
        if code is None:
            code = ExitCode.INTERNAL if self.unclean_stop else ExitCode.OK
        level = logging.INFO if code == ExitCode.OK else logging.ERROR
        log.log(level, "supervisor %d stopped: exit code %d%s",
                self.pid, code, " (a worker did not stop cleanly)" if self.unclean_stop else "")
        return code
