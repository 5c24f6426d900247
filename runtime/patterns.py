"""Queue-name patterns: `*` stands for any run of characters (none included), every other character for
itself. Token grants (`jobs:enqueue@billing-*`) and the queues an actor may run on (`@actor(queues=...)`)
share this one syntax."""

from __future__ import annotations

import functools
import re

MAX_PATTERN_LENGTH = 255


def pattern_problem(pattern: object) -> str | None:
    """What is wrong with a queue pattern, or None when it is one (1-255 characters, no NUL, valid UTF-8)."""
    if not isinstance(pattern, str):
        return f"a queue pattern must be a string, got {pattern!r}"
    if not pattern or len(pattern) > MAX_PATTERN_LENGTH:
        return f"a queue pattern must be 1-{MAX_PATTERN_LENGTH} characters, got {pattern!r}"
    if "\x00" in pattern:
        return f"a queue pattern must not contain NUL, got {pattern!r}"
    try:
        pattern.encode("utf-8")
    except UnicodeEncodeError:
        return f"a queue pattern must be valid Unicode (no lone surrogates), got {pattern!r}"
    return None


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.S)


def queue_matches(pattern: str, queue: str) -> bool:
    """True when the whole queue name matches the pattern (`*` is any run of characters)."""
    if pattern == "*":
        return True
    if "*" not in pattern:
        return pattern == queue
    return _compiled(pattern).fullmatch(queue) is not None


def matches_any(patterns: tuple[str, ...] | list[str], queue: str) -> bool:
    """True when one of the patterns matches the queue name."""
    return any(queue_matches(p, queue) for p in patterns)
