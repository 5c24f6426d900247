"""When to replace a dead worker, and when to give up and let systemd take over.

- A worker that exits at boot with a configuration exit code (bad settings, schema, import, no embedded
  server) will fail the same way again: the supervisor stops with that code instead of looping.
  DATABASE_UNAVAILABLE is fatal only before the supervisor was ever ready; later it is a transient
  outage and counts as an ordinary death.
- Ordinary deaths are replaced after an exponential backoff; `crash_limit` deaths within
  `crash_window` seconds stop the supervisor with CRASH_LOOP.
- A worker that restarted itself on purpose (LEAKED_THREADS) is replaced at once and not counted.
- A worker that ended because the database was out of reach (LEASES_LOST: it self-fenced; or
  DATABASE_UNAVAILABLE once the supervisor has been ready) is an outage, not a crash: it is not counted,
  and it is replaced after a backoff that doubles per outage death up to OUTAGE_BACKOFF_MAX and starts
  over once a worker is ready again. A failover with no primary for longer than `lock_timeout` (every
  worker self-fences, their replacements find no primary for a while) is waited out, not turned into a
  crash loop that would stop the supervisor.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from taskq.exitcodes import ExitCode

CRASH_LOOP = ExitCode.CRASH_LOOP
"""The supervisor's exit when `crash_limit` workers died within `crash_window` seconds (the name the
tests import; the code is documented in taskq.exitcodes)."""

CONFIG_EXIT_CODES = frozenset({
    ExitCode.USAGE, ExitCode.SCHEMA, ExitCode.EMBEDDED_UNAVAILABLE, ExitCode.IMPORT_ERROR,
})
BOOT_EXIT_CODES = CONFIG_EXIT_CODES | {ExitCode.DATABASE_UNAVAILABLE}
SELF_RESTART_EXIT_CODES = frozenset({ExitCode.LEAKED_THREADS})
OUTAGE_EXIT_CODES = frozenset({ExitCode.LEASES_LOST, ExitCode.DATABASE_UNAVAILABLE})
OUTAGE_BACKOFF_MAX = 5.0
"""Seconds: the longest wait before replacing a worker the database's absence ended, so that the fleet is
back within this of the database."""


@dataclass
class RestartPolicy:
    crash_limit: int = 5
    crash_window: float = 60.0
    backoff: float = 0.5
    backoff_max: float = 30.0
    deaths: deque[float] = field(default_factory=deque)
    outages: int = 0
    """Outage deaths since a worker was last ready."""

    def worker_ready(self) -> None:
        """A worker is ready: the database is there; the next outage backs off from the start."""
        self.outages = 0

    def is_boot_failure(self, code: int, *, ever_ready: bool, supervisor_was_ready: bool) -> bool:
        """A death that restarting cannot fix (see the module docstring)."""
        if ever_ready or code not in BOOT_EXIT_CODES:
            return False
        return code in CONFIG_EXIT_CODES or not supervisor_was_ready

    def record_death(self, now: float, code: int) -> float | None:
        """Count an unexpected death at `now`. Returns the delay before its replacement, or None when
        the crash limit is reached (stop the supervisor)."""
        if code in SELF_RESTART_EXIT_CODES:
            return 0.0
        if code in OUTAGE_EXIT_CODES:
            self.outages += 1
            return min(OUTAGE_BACKOFF_MAX, self.backoff * 2.0 ** min(self.outages - 1, 16))
        self.deaths.append(now)
        while self.deaths and self.deaths[0] <= now - self.crash_window:
            self.deaths.popleft()
        if len(self.deaths) >= self.crash_limit:
            return None
        return min(self.backoff_max, self.backoff * 2.0 ** (len(self.deaths) - 1))
