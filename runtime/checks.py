"""Checks of caller input shared by the client, the operator actions and the CLI: each raises a
specific TaskqError before anything is written."""

from __future__ import annotations

from uuid import UUID

from taskq.exceptions import ConfigurationError


def as_job_id(job_id: UUID | str) -> UUID:
    """The job id as a UUID. ConfigurationError (a ValueError) for anything that is not one."""
    if isinstance(job_id, UUID):
        return job_id
    try:
        return UUID(str(job_id))
    except ValueError:
        raise ConfigurationError(f"not a job id (expected a UUID): {job_id!r}") from None


def as_workflow_id(workflow_id: UUID | str) -> UUID:
    """The workflow id as a UUID (`Workflow.id`, or its text). ConfigurationError for anything else."""
    if isinstance(workflow_id, UUID):
        return workflow_id
    if not isinstance(workflow_id, str):
        raise ConfigurationError(f"not a workflow id (expected a UUID): {workflow_id!r}")
    try:
        return UUID(workflow_id)
    except ValueError:
        raise ConfigurationError(f"not a workflow id (expected a UUID): {workflow_id[:80]!r}") from None


def is_utf8(text: str) -> bool:
    """False for text holding a lone surrogate (e.g. from `surrogateescape`), which no UTF-8 database stores."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(name: str, value: str, *, max_len: int = 255) -> str:
    if not isinstance(value, str) or not value or len(value) > max_len or "\x00" in value or not is_utf8(value):
        raise ConfigurationError(
            f"{name} must be 1-{max_len} characters of valid Unicode without NUL, got {value!r}"
        )
    return value


def check_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    if not isinstance(reason, str) or len(reason) > 10_000 or "\x00" in reason or not is_utf8(reason):
        raise ConfigurationError(
            "reason must be text of at most 10,000 characters of valid Unicode without NUL"
        )
    return reason


MAX_FAIRNESS_KEY = 200
"""Longest fairness key (characters); the empty key is jobs enqueued without one."""
MAX_FAIRNESS_WEIGHT = 1_000_000.0


def check_fairness_key(value: str | None, *, allow_empty: bool = False) -> str | None:
    """A job's fairness key (a tenant, a customer): None (the empty key) or 1-200 characters of valid
    Unicode without control characters. `allow_empty`: '' names the empty key (weights of jobs without
    one) and is returned as ''."""
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or len(value) > MAX_FAIRNESS_KEY
        or (not value and not allow_empty)
        or any(ch < " " or "\x7f" <= ch <= "\x9f" for ch in value)
        or not is_utf8(value)
    ):
        empty = " (or '' for jobs enqueued without a key)" if allow_empty else ""
        raise ConfigurationError(
            f"fairness_key must be 1-{MAX_FAIRNESS_KEY} characters of valid Unicode without control "
            f"characters{empty}, got {value!r}"
        )
    return value


def check_fairness_weight(value: object) -> float:
    """A fairness weight: a finite number > 0 (at most 1,000,000); a key's share of starts is its weight
    over the sum of the weights of the keys with jobs ready."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"weight must be a number greater than 0, got {value!r}")
    weight = float(value)
    if not (0 < weight <= MAX_FAIRNESS_WEIGHT):  # NaN fails every comparison
        raise ConfigurationError(
            f"weight must be a finite number greater than 0 and at most {MAX_FAIRNESS_WEIGHT:,.0f}, got {value!r}"
        )
    return weight
