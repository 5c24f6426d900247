"""SQL files shipped with taskq: numbered migrations and named query blocks.

A query file holds blocks introduced by `-- name: <query_name>`; each block runs to the next marker.
Everything is parsed once, on first use, with importlib.resources.

A query's text as sent is compact (`compact`): its comment lines and indentation are for the reader of the
file. psycopg converts a statement's placeholders on every execute and keeps the conversion only for a
text of at most 4,096 characters (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH); the claim and the finish
with their comments were longer, and each of their executes parsed 4-7 KB of text again in Python.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import LiteralString

_MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_NAME_MARKER = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: LiteralString
    checksum: str


@functools.cache
def migrations() -> tuple[Migration, ...]:
    found: list[Migration] = []
    for entry in resources.files(__name__).iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match is None:
            continue
        text = entry.read_text(encoding="utf-8")
        found.append(
            Migration(
                version=int(match.group(1)),
                name=match.group(2),
                sql=text,  # shipped files, never user input
                checksum=hashlib.sha256(text.encode()).hexdigest(),
            )
        )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"taskq migrations must be numbered 1..n without gaps, found {versions}")
    return tuple(found)


def latest_version() -> int:
    return migrations()[-1].version


@functools.cache
def blocks() -> dict[str, LiteralString]:
    """Each named query's block as the file has it, comments and indentation included."""
    named: dict[str, LiteralString] = {}
    for entry in resources.files(__name__).iterdir():
        if not entry.name.endswith(".sql") or _MIGRATION_FILE.match(entry.name):
            continue
        text = entry.read_text(encoding="utf-8")
        parts = _NAME_MARKER.split(text)
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in named:
                raise RuntimeError(f"query {name!r} is defined twice in taskq.sql")
            named[name] = body
    return named


@functools.cache
def queries() -> dict[str, LiteralString]:
    """Each named query as sent (`compact`)."""
    return {name: compact(body) for name, body in blocks().items()}


def compact(body: str) -> LiteralString:
    """The statement as sent: its lines without indentation, comment lines and blank lines (what
    pg_stat_activity shows starts with the statement itself: `LISTEN taskq_jobs; ...`, as doctor.sql and
    operators' queries look for it). Shipped
    files, never user input; no query here has a string literal or a dollar quote that spans lines, so this
    changes no literal (tests/unit/test_sql_text.py checks it)."""
    lines = (line.strip() for line in body.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


def query(name: str) -> LiteralString:
    try:
        return queries()[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in taskq.sql") from None
