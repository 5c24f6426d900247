"""Fixtures of the chaos tests: the size of the bounded run, and a test database with the effects table.

The CI run's size can be changed without editing code (the by-hand run is `tests/chaos/chaos.py`):
TASKQ_CHAOS_JOBS, TASKQ_CHAOS_FAULTS, TASKQ_CHAOS_SECONDS and TASKQ_CHAOS_SEED (a failing run prints
its seed; the same seed replays the same workload and fault schedule, though not the same timings).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest
from apps import taskq_chaos_app
from chaos import ChaosConfig
from chaos_history import EFFECTS_DDL


@pytest.fixture
def ci_config() -> ChaosConfig:
    seed = os.environ.get("TASKQ_CHAOS_SEED")
    return ChaosConfig(
        jobs=int(os.environ.get("TASKQ_CHAOS_JOBS", "300")),
        faults=int(os.environ.get("TASKQ_CHAOS_FAULTS", "10")),
        seconds=float(os.environ.get("TASKQ_CHAOS_SECONDS", "40")),
        seed=int(seed) if seed else None,
        drain_timeout=90.0,
    )


@pytest.fixture
def effects_dsn(dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This test's database with `chaos.effects`, where in-process chaos actors record their executions."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
    monkeypatch.setenv(taskq_chaos_app.EFFECTS_DSN_ENV, dsn)
    yield dsn
    taskq_chaos_app.close_effects()
