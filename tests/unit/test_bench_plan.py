"""The pure parts of `taskq bench` (taskq.ops.bench): the plan's bounds, the percentile, the id range the
clean-up walks, the bench actor's queues and the environment its workers get."""

from __future__ import annotations

import math
import time

import pytest

from taskq.backend._conn import uuid7
from taskq.exceptions import ConfigurationError
from taskq.ops.bench import (
    ID_MARGIN,
    MAX_JOBS,
    MAX_SECONDS,
    MAX_WORKERS,
    BenchPlan,
    IdSpan,
    new_queue_name,
    noop,
    percentile,
    uuid7_ceiling,
    uuid7_floor,
)


@pytest.mark.parametrize(
    "options",
    [
        {"jobs": 0},
        {"jobs": MAX_JOBS + 1},
        {"jobs": True},
        {"jobs": 1.5},
        {"workers": 0},
        {"workers": MAX_WORKERS + 1},
        {"seconds": 0},
        {"seconds": -1.0},
        {"seconds": math.nan},
        {"seconds": math.inf},
        {"seconds": MAX_SECONDS + 1},
    ],
)
def test_a_plan_out_of_bounds_is_a_configuration_error(options: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match=next(iter(options))):
        BenchPlan(**options)  # type: ignore[arg-type]


def test_the_default_plan_and_the_bounds_themselves_are_accepted() -> None:
    assert BenchPlan() == BenchPlan(jobs=50_000, workers=1, seconds=5.0)
    BenchPlan(jobs=MAX_JOBS, workers=MAX_WORKERS, seconds=MAX_SECONDS)
    BenchPlan(jobs=1, workers=1, seconds=0.01)


def test_percentile_interpolates_between_the_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_an_id_written_at_a_moment_lies_between_that_moments_floor_and_ceiling() -> None:
    now = time.time()
    job_id = uuid7()
    assert uuid7_floor(now - 0.002) <= job_id <= uuid7_ceiling(time.time())
    assert uuid7_ceiling(now) < uuid7_floor(now + 0.002)


def test_the_clean_up_range_covers_every_id_seen_and_the_run_with_a_margin() -> None:
    span = IdSpan()
    early = uuid7_floor(span.started - 10 * ID_MARGIN)  # an id from a clock that jumped back
    late = uuid7()
    span.see(late)
    span.see(early)
    jobs = span.cover("taskq-bench-00000000")
    assert jobs.lo == early and jobs.hi >= late
    assert jobs.hi >= uuid7_ceiling(time.time() + ID_MARGIN / 2)
    fresh = IdSpan().cover("q")
    assert fresh.lo <= uuid7_floor(time.time() - ID_MARGIN / 2)


def test_the_bench_actor_runs_on_bench_queues_only_and_each_run_names_its_own() -> None:
    first, second = new_queue_name(), new_queue_name()
    assert first != second and first.startswith("taskq-bench-") and len(first) == len("taskq-bench-") + 8
    assert noop.allows_queue(first)
    assert not noop.allows_queue("default") and not noop.allows_queue("taskq-benchmark")
