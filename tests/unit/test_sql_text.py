"""The named queries as sent (taskq.sql.compact): the same statements as in the files, and short enough that
psycopg keeps their placeholder conversion instead of parsing the text again on every execute."""

from __future__ import annotations

import psycopg
import pytest

from taskq import sql
from taskq.backend.workers import claim_statement

HOT = ("job_claim", "job_claim_classes", "job_claim_strays", "job_claim_limited", "job_claim_queue_limited",
       "job_finish_batch", "heartbeat", "job_insert", "job_insert_many", "job_insert_unique", "heartbeat_reconcile")
"""The statements a worker runs per claim, per finish batch and per tick, and a producer per enqueue."""

CACHE_LIMIT = getattr(getattr(psycopg, "_queries", None), "MAX_CACHED_STATEMENT_LENGTH", 4096)


def _code_words(text: str) -> list[str]:
    return [word for line in text.splitlines() if not line.strip().startswith("--") for word in line.split()]


def test_a_compact_query_is_its_block_without_comment_lines_or_indentation() -> None:
    blocks = sql.blocks()
    for name, body in blocks.items():
        sent = sql.query(name)
        assert not any(line.startswith(("--", " ", "\t")) or not line for line in sent.splitlines()), name
        assert _code_words(sent) == _code_words(body), name
        for line in body.splitlines():  # what makes dropping indentation safe: no literal spans two lines
            code = "" if line.strip().startswith("--") else line
            assert code.count("'") % 2 == 0 and "$$" not in code, (name, line)


@pytest.mark.parametrize("name", HOT)
def test_the_hot_statements_fit_psycopgs_conversion_cache(name: str) -> None:
    text = claim_statement(10_000) if name == "job_claim" else sql.query(name)
    assert len(text.encode()) <= CACHE_LIMIT, (
        f"{name} is {len(text.encode())} bytes as sent: over {CACHE_LIMIT}, psycopg parses it again on every "
        "execute (move part of it into a SQL function, or shorten it)")


def test_the_compaction_is_what_psycopg_caches() -> None:
    assert CACHE_LIMIT == 4096  # psycopg's own limit; a new psycopg that moves it should be looked at again
