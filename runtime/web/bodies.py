"""The JSON bodies the API's writes accept: unknown fields are refused, every field is bounded. Shared by
the endpoints (taskq.web.api) and the OpenAPI description (taskq.web.openapi)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from taskq.enqueue import MAX_ATTEMPTS
from taskq.web.actions import BULK_LIMIT

MAX_REVISION = 2**63 - 1
"""A revision is a PostgreSQL bigint."""
MAX_SCHEDULE_TO_CLOSE = 365 * 86400.0
"""One year, in seconds: the longest `schedule_to_close` the API takes."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


M = TypeVar("M", bound=_Body)


class CancelBody(_Body):
    reason: str | None = Field(default=None, max_length=10_000)
    expected_revision: int | None = Field(default=None, ge=1, le=MAX_REVISION)


class RequeueBody(CancelBody):
    attempts: int | None = Field(default=None, ge=1, le=1_000_000)


class EnqueueBody(_Body):
    actor: str
    payload: Any = None
    queue: str | None = None
    priority: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)
    tags: list[str] = []
    scheduled_at: datetime | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS)
    schedule_to_close: float | None = Field(default=None, gt=0, le=MAX_SCHEDULE_TO_CLOSE, allow_inf_nan=False)
    unique_key: str | None = None
    unique_scope: str = "active"
    fairness_key: str | None = None
    """Checked by the enqueue's own checks (taskq.checks.check_fairness_key): 1-200 characters, no control
    characters."""


class SignalBody(_Body):
    """POST /jobs/{id}:signal: the signal's name (1-200 characters, no control character) and its JSON payload
    (at most 1 MiB), checked by taskq.ops.durable as for `client.signal`."""

    name: str
    payload: Any = None


class WorkflowCancelBody(_Body):
    reason: str | None = Field(default=None, max_length=10_000)


class QueueBody(_Body):
    reason: str | None = Field(default=None, max_length=10_000)


class LimitBody(_Body):
    """POST /queues/{name}:limit: each limit given is set (null removes it), each left out is kept. The
    values are checked by taskq.ops.queues, as for `taskq queue limit` (whole numbers >= 1; a rate needs its
    period, a finite number of seconds > 0 and at most a year)."""

    concurrency: StrictInt | None = None
    concurrency_per_key: StrictInt | None = None
    rate_limit: StrictInt | None = None
    rate_period: StrictFloat | StrictInt | None = None
    reason: str | None = Field(default=None, max_length=10_000)


class WeightBody(_Body):
    """PUT /queues/{name}/fairness-weights/{key}: the key's weight, a finite number > 0 and at most
    1,000,000 (1 is the default: setting it removes the stored weight), checked by taskq.ops.queues as for
    `taskq queue weight`."""

    weight: StrictFloat | StrictInt
    reason: str | None = Field(default=None, max_length=10_000)


class BulkBody(_Body):
    filter: dict[str, str | list[str]]
    limit: int = Field(default=100, ge=1, le=BULK_LIMIT)
    reason: str | None = Field(default=None, max_length=10_000)
    attempts: int | None = Field(default=None, ge=1, le=1_000_000)
