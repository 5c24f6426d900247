"""Value types: statuses, cancel phases, filters and results (no database)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from pydantic import ValidationError

from taskq.models import (
    TERMINAL_STATUSES,
    UNFINISHED_STATUSES,
    BulkCancelResult,
    CancelMarker,
    CancelPhase,
    CancelResult,
    JobFilter,
    JobRow,
    JobStatus,
)


def test_cancel_phases_are_numbered_zero_to_three_in_ladder_order() -> None:
    assert [(p.name, int(p)) for p in CancelPhase] == [
        ("NONE", 0),
        ("COOPERATIVE", 1),
        ("FORCED", 2),
        ("ABANDON_PENDING", 3),
    ]


def test_exactly_five_statuses_are_terminal() -> None:
    assert {s.value for s in TERMINAL_STATUSES} == {
        "succeeded",
        "failed",
        "cancelled",
        "crashed",
        "abandoned",
    }
    assert {s.value for s in UNFINISHED_STATUSES} == {"pending", "scheduled", "running", "awaiting_parents"}
    assert all(s.is_terminal for s in TERMINAL_STATUSES)
    assert not any(s.is_terminal for s in UNFINISHED_STATUSES)


def test_cancel_markers_use_the_spec_error_class_names() -> None:
    assert {m.value for m in CancelMarker} == {
        "CancelledCooperatively",
        "CancelledForced",
        "CancelAbandoned",
        "CancelledBeforeStart",
    }


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (JobFilter(tags=("a",)), None),
        (JobFilter(unfinished=True), ["awaiting_parents", "pending", "running", "scheduled"]),
        (JobFilter(statuses=(JobStatus.FAILED, JobStatus.PENDING)), ["failed", "pending"]),
        (JobFilter(statuses=(JobStatus.RUNNING, JobStatus.SUCCEEDED), unfinished=True), ["running"]),
    ],
    ids=["no-status-criterion", "unfinished", "statuses", "statuses-narrowed-by-unfinished"],
)
def test_status_list_applies_unfinished_to_the_given_statuses(flt: JobFilter, expected: list[str] | None) -> None:
    assert flt.status_list() == expected


def test_unfinished_with_only_terminal_statuses_is_rejected_as_matching_nothing() -> None:
    with pytest.raises(ValidationError, match="matches nothing"):
        JobFilter(statuses=(JobStatus.SUCCEEDED,), unfinished=True)


def test_only_a_filter_without_any_criterion_is_empty() -> None:
    assert JobFilter().is_empty
    assert not JobFilter(unfinished=True).is_empty
    assert not JobFilter(tags=("t",)).is_empty
    assert not JobFilter(created_after=datetime(2024, 1, 1, tzinfo=UTC)).is_empty


def _row(**overrides: Any) -> JobRow:
    now = datetime.now(UTC)
    fields: dict[str, Any] = dict(
        id=uuid4(),
        actor="a",
        queue="default",
        payload={"x": 1},
        status="pending",
        priority=0,
        tags=(),
        attempt=0,
        max_attempts=3,
        claim_epoch=0,
        interrupt_count=0,
        scheduled_at=now,
        schedule_to_close=None,
        created_at=now,
        started_at=None,
        finished_at=None,
        worker_id=None,
        lock_expires_at=None,
        cancel_phase=0,
        cancel_requested_at=None,
        cancel_reason=None,
        error_class=None,
        error_message=None,
        parent_id=None,
    )
    fields.update(overrides)
    return JobRow.model_validate(fields)


@pytest.mark.parametrize(
    ("model", "field", "value"),
    [
        (JobFilter(tags=("a",)), "tags", ("b",)),
        (
            CancelResult(
                job_id=uuid4(), previous_status="pending", new_status="cancelled", cancellation_initiated=True
            ),
            "cancellation_initiated",
            False,
        ),
        (BulkCancelResult(by_previous_status={}, job_ids=(), batches=0), "batches", 3),
        (_row(), "status", JobStatus.RUNNING),
    ],
    ids=["JobFilter", "CancelResult", "BulkCancelResult", "JobRow"],
)
def test_frozen_models_reject_mutation(model: Any, field: str, value: Any) -> None:
    before = getattr(model, field)
    with pytest.raises(ValidationError, match="frozen"):
        setattr(model, field, value)
    assert getattr(model, field) == before


def test_job_row_rejects_unknown_columns_and_unknown_statuses() -> None:
    with pytest.raises(ValidationError):
        _row(surprise=1)
    with pytest.raises(ValidationError):
        _row(status="paused")


def test_job_row_reports_terminal_from_its_status() -> None:
    assert not _row(status="running").is_terminal
    assert _row(status="crashed", finished_at=datetime.now(UTC)).is_terminal


def test_bulk_cancel_result_totals_by_previous_status() -> None:
    result = BulkCancelResult(
        by_previous_status={JobStatus.PENDING: 4, JobStatus.SCHEDULED: 2, JobStatus.RUNNING: 3},
        job_ids=tuple(uuid4() for _ in range(9)),
        batches=2,
    )
    assert (result.total, result.cancelled_before_start, result.running_requested) == (9, 6, 3)
    empty = BulkCancelResult(by_previous_status={}, job_ids=(), batches=0)
    assert (empty.total, empty.cancelled_before_start, empty.running_requested) == (0, 0, 0)
