"""Every UPDATE of taskq.jobs in the named queries raises the row's revision (issue 20): the web API's
`expected_revision` relies on it, and a statement that forgets it would let a stale write through."""

from __future__ import annotations

import re
from pathlib import Path

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
_MIGRATION = re.compile(r"^\d{4}_")
# the SET list of an UPDATE of taskq.jobs: everything up to its FROM or WHERE
_UPDATE = re.compile(r"UPDATE\s+taskq\.jobs\b(?:\s+AS\s+(\w+))?\s+SET\b(.*?)(?:\bFROM\b|\bWHERE\b)", re.S | re.I)


def _query_files() -> list[Path]:
    """The named queries, and the migrations from the one that adds the column on (their functions, such as
    the dependency cascade, update jobs too)."""
    migrations = sorted(p for p in SQL_DIR.glob("*.sql") if _MIGRATION.match(p.name))
    first = next(i for i, p in enumerate(migrations)
                 if re.search(r"ADD COLUMN\s+revision\b", p.read_text(encoding="utf-8"), re.I))
    queries = [p for p in SQL_DIR.glob("*.sql") if not _MIGRATION.match(p.name) and p.name != "roles.sql"]
    return sorted(queries) + migrations[first + 1 :]


def updates_missing_revision(text: str) -> list[str]:
    missing = []
    for match in _UPDATE.finditer(text):
        alias, set_list = match.group(1), match.group(2)
        own = rf"{alias}\.revision" if alias else "revision"
        if not re.search(rf"(?<![\w.])revision\s*=\s*{own}\s*\+\s*1\b", set_list):
            missing.append(" ".join(match.group(0).split())[:100])
    return missing


def test_every_update_of_jobs_in_the_query_files_raises_the_revision() -> None:
    files = _query_files()
    assert {p.name for p in files} >= {"jobs.sql", "claims.sql", "workers.sql"}
    seen = 0
    for path in files:
        text = path.read_text(encoding="utf-8")
        seen += len(_UPDATE.findall(text))
        assert updates_missing_revision(text) == [], f"{path.name}: an UPDATE of taskq.jobs without revision + 1"
    assert seen >= 13  # the claim, the finishes, the cancels, the requeues, the sweeps, progress...


def test_the_check_catches_an_update_that_forgets_the_revision() -> None:
    assert updates_missing_revision("UPDATE taskq.jobs SET progress = '1' WHERE id = 1") != []
    assert updates_missing_revision("UPDATE taskq.jobs AS j SET status = 'x' FROM t WHERE j.id = t.id") != []
    assert updates_missing_revision("UPDATE taskq.jobs AS j SET revision = revision + 1 FROM t") != []
    assert updates_missing_revision("UPDATE taskq.jobs AS j SET revision = j.revision + 1, a = 1 WHERE x") == []
