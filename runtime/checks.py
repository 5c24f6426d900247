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
