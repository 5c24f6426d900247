"""SteadyRetry (backend._conn): when a pool's series of reconnection attempts fails, the next series starts
at once while the outage is younger than `retry_for` and the pool holds no idle connection."""

from __future__ import annotations

import time

from taskq.backend._conn import RECONNECT_SERIES, SteadyRetry


def stats(attempts: int, errors: int, available: int = 0) -> dict[str, int]:
    return {"connections_num": attempts, "connections_errors": errors, "pool_available": available}


def test_a_failed_series_is_followed_by_the_next_while_the_outage_is_young() -> None:
    steady = SteadyRetry(retry_for=60.0)
    assert steady.should_retry(stats(attempts=4, errors=3))
    assert steady.should_retry(stats(attempts=7, errors=6))  # no connection came since: the same outage


def test_no_new_series_past_retry_for_until_a_connection_came() -> None:
    steady = SteadyRetry(retry_for=RECONNECT_SERIES + 0.05)
    assert steady.should_retry(stats(attempts=4, errors=3))
    deadline = time.monotonic() + 0.1
    while time.monotonic() < deadline:  # the outage ages past retry_for
        pass
    assert not steady.should_retry(stats(attempts=7, errors=6))
    # one attempt succeeded since (a request's own series): a later failure is a new outage
    assert steady.should_retry(stats(attempts=9, errors=7))


def test_a_pool_with_idle_connections_does_not_start_another_series() -> None:
    """A failed growth (say, the server's connection limit) while idle connections work: nothing to restore."""
    steady = SteadyRetry(retry_for=60.0)
    assert not steady.should_retry(stats(attempts=4, errors=1, available=2))
