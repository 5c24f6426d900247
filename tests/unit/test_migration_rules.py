"""Rules for the migrations themselves. From migration 0015 on a function is never restated: a migration that
changes one adds a new function under a versioned name (`settle_frontier_v2`) and points its callers at it,
so each migration's functions stay as released and two releases' workers can run side by side during a
rolling upgrade (procrastinate's `_vN`). Migrations 0001..0014 were released before the rule and are frozen
as they are (0009 and 0011 restate delete_terminal_jobs)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sqltext import created_routines

from taskq import sql

FIRST_VERSIONED = 15
_VERSIONED = re.compile(r"_v[0-9]+$")


def rule_violations(migrations: Sequence[tuple[int, str, str]]) -> list[str]:
    """What breaks the `_vN` rule in (version, file name, text) migrations, in order: from FIRST_VERSIONED on,
    a CREATE [OR REPLACE] FUNCTION (or PROCEDURE) of a name an earlier migration created, or of a name
    without its `_v<N>` suffix."""
    defined: dict[str, str] = {}
    problems = []
    for version, file, text in sorted(migrations):
        for name in created_routines(text):
            if version >= FIRST_VERSIONED:
                if name in defined:
                    problems.append(f"{file}: restates {name}, which {defined[name]} created; add {name} under a "
                                    "new _v<N> name instead")
                elif not _VERSIONED.search(name):
                    problems.append(f"{file}: creates {name}, whose name does not end in _v<N> (e.g. {name}_v1)")
            defined.setdefault(name, file)
    return problems


def _shipped() -> list[tuple[int, str, str]]:
    return [(m.version, f"{m.version:04d}_{m.name}.sql", m.sql) for m in sql.migrations()]


def test_the_shipped_migrations_follow_the_versioned_function_rule() -> None:
    assert rule_violations(_shipped()) == []


def test_the_rule_reads_the_functions_the_frozen_migrations_create() -> None:
    created = {name for _, _, text in _shipped() for name in created_routines(text)}
    # a sample across the migrations (tests/integration/test_schema.py checks every function of the catalog)
    assert {"record_lease_loss", "delete_terminal_jobs", "settle_frontier", "job_claim_limited",
            "delete_operator_audit"} <= created


def test_the_frozen_migrations_may_restate_a_function() -> None:
    assert rule_violations([
        (5, "0005_a.sql", "CREATE FUNCTION taskq.prune(p int) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;"),
        (9, "0009_b.sql", "CREATE OR REPLACE FUNCTION taskq.prune(p int) RETURNS int LANGUAGE sql AS $$ SELECT 2 $$;"),
    ]) == []


def test_a_new_migration_may_not_restate_a_function_of_an_earlier_one() -> None:
    problems = rule_violations([
        (5, "0005_a.sql", "CREATE FUNCTION taskq.prune(p int) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;"),
        (15, "0015_b.sql", "CREATE OR REPLACE FUNCTION taskq.prune(p int) RETURNS int LANGUAGE sql AS $$ SELECT 2 $$;"),
    ])
    assert problems == ["0015_b.sql: restates prune, which 0005_a.sql created; add prune under a new _v<N> name "
                        "instead"]


def test_a_new_migration_may_not_restate_a_versioned_function_either() -> None:
    problems = rule_violations([
        (15, "0015_a.sql", "CREATE FUNCTION taskq.prune_v1() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;"),
        (16, "0016_b.sql", 'CREATE OR REPLACE FUNCTION "taskq".PRUNE_V1() RETURNS int LANGUAGE sql AS $$ SELECT 2 $$;'),
    ])
    assert len(problems) == 1 and problems[0].startswith("0016_b.sql: restates prune_v1, which 0015_a.sql created")


def test_a_new_function_needs_a_versioned_name() -> None:
    problems = rule_violations([(15, "0015_a.sql", "CREATE FUNCTION taskq.prune() RETURNS trigger LANGUAGE plpgsql "
                                                   "AS $$ BEGIN RETURN NULL; END $$;")])
    assert problems == ["0015_a.sql: creates prune, whose name does not end in _v<N> (e.g. prune_v1)"]
    assert rule_violations([(15, "0015_a.sql", "create procedure taskq.tidy() language sql as $$ $$;")]) != []


def test_a_new_version_of_a_function_is_a_new_function() -> None:
    assert rule_violations([
        (5, "0005_a.sql", "CREATE FUNCTION taskq.prune() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;"),
        (15, "0015_b.sql", "CREATE FUNCTION taskq.prune_v2() RETURNS int LANGUAGE sql AS $$ SELECT 2 $$;\n"
                           "DROP FUNCTION taskq.prune();"),
        (16, "0016_c.sql", "CREATE FUNCTION taskq.prune_v3() RETURNS int LANGUAGE sql AS $$ SELECT 3 $$;"),
    ]) == []


def test_functions_named_in_comments_strings_or_bodies_are_not_definitions() -> None:
    text = (
        "-- CREATE OR REPLACE FUNCTION taskq.prune() replaces nothing here\n"
        "/* CREATE FUNCTION taskq.prune() /* nested */ */\n"
        "SELECT 'CREATE FUNCTION taskq.prune()', E'\\' CREATE FUNCTION taskq.prune()';\n"
        "CREATE FUNCTION taskq.build_v1() RETURNS void LANGUAGE plpgsql AS $body$\n"
        "BEGIN EXECUTE $q$CREATE FUNCTION taskq.prune() RETURNS int LANGUAGE sql AS 'SELECT 1'$q$; END\n"
        "$body$;\n"
    )
    assert rule_violations([
        (5, "0005_a.sql", "CREATE FUNCTION taskq.prune() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;"),
        (15, "0015_b.sql", text),
    ]) == []
