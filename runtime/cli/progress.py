"""A progress line for long operator commands (bulk requeue, prune): rows so far and the rate, redrawn
in place on a terminal. Silent when the stream is not a terminal (piped, redirected) or when disabled
(`--json`), so scripts read only the final result."""

from __future__ import annotations

import sys
import time
from typing import TextIO

REDRAW_EVERY = 0.2
"""Seconds between redraws: a fast command must not spend its time writing to the terminal."""


class ProgressLine:
    def __init__(self, label: str, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.active = enabled and _is_terminal(self.stream)
        self.started = time.monotonic()
        self._drawn_at = 0.0
        self._width = 0

    def update(self, rows: int) -> None:
        """Called with the number of rows handled so far (after each committed batch)."""
        if not self.active:
            return
        now = time.monotonic()
        if now - self._drawn_at < REDRAW_EVERY:
            return
        self._drawn_at = now
        self._draw(rows, now)

    def _draw(self, rows: int, now: float) -> None:
        elapsed = max(now - self.started, 1e-6)
        text = f"{self.label}: {rows:,} rows so far, {rows / elapsed:,.0f} rows/s"
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def finish(self) -> None:
        """Clear the line, so the command's result prints on a clean line."""
        if self.active and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
