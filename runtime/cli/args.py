"""Argument types of the `taskq` command line: each rejects a bad value before any connection is made,
with a message argparse prints as one usage error."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from uuid import UUID


def job_id_arg(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a job id (expected a UUID): {text!r}") from None


def workflow_id_arg(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a workflow id (expected a UUID): {text[:80]!r}") from None


def int_arg(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def seconds_up_to(high: float) -> Callable[[str], float]:
    """A positive, finite number of seconds, at most `high`."""

    def parse(text: str) -> float:
        value = seconds_arg(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:g} seconds, got {text!r}")
        return value

    parse.__name__ = "seconds"
    return parse


_RELATIVE = re.compile(r"^\+(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def when_arg(text: str) -> datetime | timedelta:
    """An ISO 8601 time with a timezone (`2030-01-01T09:00:00+02:00`, `...Z`) or a delay (`+30s`,
    `+5m`, `+2h`, `+1d`, `+250ms`) from now."""
    relative = _RELATIVE.match(text.strip())
    if relative:
        return timedelta(seconds=float(relative.group(1)) * _UNIT_SECONDS[relative.group(2)])
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time with a timezone (e.g. 2030-01-01T09:00:00Z) or a delay like +30s, "
            f"got {text!r}"
        ) from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no timezone: add one (e.g. {text}Z or {text}+02:00), or give a delay like +30s"
        )
    return value
