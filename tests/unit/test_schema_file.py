"""sql/schema.sql sits beside the migrations and the query files but is neither: the loaders of taskq.sql must
not take it for one. (Whether it matches the migrated catalog is tests/integration/test_schema.py's.)"""

from __future__ import annotations

import re
from pathlib import Path

from taskq import sql

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "sql" / "schema.sql"


def test_the_schema_file_is_not_a_migration() -> None:
    numbered = sorted(p.name for p in SCHEMA_FILE.parent.glob("[0-9][0-9][0-9][0-9]_*.sql"))
    assert [f"{m.version:04d}_{m.name}.sql" for m in sql.migrations()] == numbered
    assert "schema" not in {m.name for m in sql.migrations()}


def test_the_schema_file_holds_no_named_query() -> None:
    # the query loader reads every *.sql file that is not a migration; blocks start at `-- name: x` lines
    markers = re.findall(r"^--\s*name:.*$", SCHEMA_FILE.read_text(encoding="utf-8"), re.MULTILINE | re.IGNORECASE)
    assert markers == []


def test_the_schema_file_was_written_for_the_latest_migration() -> None:
    latest = sql.migrations()[-1]
    first_line = SCHEMA_FILE.read_text(encoding="utf-8").splitlines()[0]
    assert f"..{latest.version:04d} leave it (the last: {latest.version:04d}_{latest.name}.sql)" in first_line, (
        "sql/schema.sql predates the latest migration: run python tools/dump_schema.py"
    )
