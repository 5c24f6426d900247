"""Every table, sequence and function of the migrated taskq schema has its line in sql/roles.sql (a GRANT or
REVOKE naming it), or an entry below saying why it needs none, so that a migration's new object is a
decision about the roles rather than an accident of PostgreSQL's defaults. (What the roles can and cannot do
is tests/integration/test_security_roles.py's.)"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psycopg
from sqltext import code_only

SCHEMA = "taskq"
ROLES_FILE = Path(__file__).resolve().parents[2] / "sql" / "roles.sql"

_INVOKER = "runs with the caller's own privileges and is executable by PUBLIC (docs/security.md); "
# What sql/roles.sql does not name today, and why. An object that gets its line, or goes, leaves this list.
NOT_NAMED: dict[str, str] = {
    "taskq.settle_frontier(uuid[],text[],integer,uuid,uuid)": "owner-only: EXECUTE revoked from PUBLIC by its "
                                                              "migration, called only by the settle functions",
    "taskq.settle_chunk()": _INVOKER + "reads a setting",
    "taskq.claim_scope_key(text)": _INVOKER + "the advisory-lock key of the limited claims and of queue control",
    "taskq.job_claim_limited(text[],integer,integer,text,double precision)": _INVOKER + "the worker's column "
                                                                             "grants bound what it writes",
    "taskq.job_claim_queue_limited(text[],integer,text,double precision)": _INVOKER + "as job_claim_limited",
}
# The SECURITY DEFINER functions that PUBLIC may still execute: none. Migration 15 revoked it from the three
# trigger functions (record_lease_loss, note_settled, settle_dependents_stmt: with it, a role could attach
# record_lease_loss to a table of its own and forge lease losses as the owner); a trigger needs no EXECUTE on
# its function to fire. A new definer function must revoke it at once.
PUBLIC_DEFINERS: set[str] = set()

_GRANT = re.compile(r"^(?:GRANT|REVOKE)\s+.*?\s+ON\s+(?P<objects>.*?)\s+(?:TO|FROM)\s+", re.IGNORECASE | re.DOTALL)
_KIND = re.compile(r"^(?P<kind>FUNCTION|ROUTINE|PROCEDURE|TABLE|SEQUENCE|SCHEMA)\s+", re.IGNORECASE)


@dataclass(frozen=True)
class Named:
    kind: str  # 'function', 'relation' (a table, view or sequence) or 'schema'
    text: str  # as roles.sql spells it


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def named_objects(script: str) -> list[Named]:
    """The objects the GRANT and REVOKE statements of a roles script name (`ALL TABLES IN SCHEMA` names none)."""
    code = "\n".join(line for line in code_only(script).splitlines() if not line.lstrip().startswith("\\"))
    found: list[Named] = []
    for statement in code.split(";"):
        match = _GRANT.match(" ".join(statement.split()))
        if match is None or match["objects"].upper().startswith("ALL "):
            continue
        objects = match["objects"]
        kind_match = _KIND.match(objects)
        kind = "relation"
        if kind_match is not None:
            kind = {"FUNCTION": "function", "ROUTINE": "function", "PROCEDURE": "function",
                    "SCHEMA": "schema"}.get(kind_match["kind"].upper(), "relation")
            objects = objects[kind_match.end():]
        found.extend(Named(kind, name) for name in _split_top_level(objects))
    return found


def _resolved(conn: psycopg.Connection[tuple[object, ...]], named: list[Named]) -> tuple[set[str], list[str]]:
    """The identities (regclass / regprocedure text) of what roles.sql names, and the names that resolve to nothing."""
    identities, unknown = set(), []
    for item in named:
        if item.kind == "schema":
            continue
        lookup = "SELECT to_regprocedure(%s)::text" if item.kind == "function" else "SELECT to_regclass(%s)::text"
        row = conn.execute(lookup, (item.text,)).fetchone()
        if row is None or row[0] is None:
            unknown.append(f"{item.kind} {item.text}")
        else:
            identities.add(str(row[0]))
    return identities, unknown


def _catalog(conn: psycopg.Connection[tuple[object, ...]]) -> dict[str, str]:
    """Identity -> kind of every table, view, sequence and function of the schema; identity sequences apart."""
    rows = conn.execute(
        """
        SELECT c.oid::regclass::text, CASE WHEN c.relkind = 'S' THEN CASE WHEN EXISTS (
                   SELECT 1 FROM pg_depend AS d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                   AND d.deptype = 'i') THEN 'identity sequence' ELSE 'sequence' END ELSE 'relation' END
        FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
        UNION ALL
        SELECT p.oid::regprocedure::text, 'function'
        FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE n.nspname = %(schema)s
        """,
        {"schema": SCHEMA},
    ).fetchall()
    return {str(identity): str(kind) for identity, kind in rows}


def without_line(dsn: str, script: str) -> tuple[list[str], list[str]]:
    """(objects of the schema the script does not name and NOT_NAMED does not excuse, names that resolve to nothing)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET search_path = pg_catalog")  # identities come out schema-qualified
        named, unknown = _resolved(conn, named_objects(script))
        catalog = _catalog(conn)
    # roles.sql's header: sequences need no grant, an INSERT uses an identity column's sequence without one
    missing = sorted(f"{kind} {identity}" for identity, kind in catalog.items()
                     if identity not in named and identity not in NOT_NAMED and kind != "identity sequence")
    return missing, unknown


def test_every_table_sequence_and_function_has_its_line_in_roles_sql(module_dsn: str) -> None:
    missing, unknown = without_line(module_dsn, ROLES_FILE.read_text(encoding="utf-8"))
    assert missing == [], ("objects of the taskq schema without a GRANT or REVOKE in sql/roles.sql (add one, or an "
                           "entry with its reason to NOT_NAMED):\n  " + "\n  ".join(missing))
    assert unknown == [], "sql/roles.sql names objects the migrated schema does not have: " + ", ".join(unknown)


def test_each_object_excused_from_a_line_exists_and_still_has_none(module_dsn: str) -> None:
    with psycopg.connect(module_dsn) as conn:
        conn.execute("SET search_path = pg_catalog")
        named, _ = _resolved(conn, named_objects(ROLES_FILE.read_text(encoding="utf-8")))
        catalog = _catalog(conn)
    assert sorted(set(NOT_NAMED) - set(catalog)) == [], "NOT_NAMED lists objects the schema no longer has"
    assert sorted(set(NOT_NAMED) & named) == [], "NOT_NAMED lists objects sql/roles.sql now names: drop them"


def test_the_reader_of_roles_sql_sees_grants_revokes_and_function_lists() -> None:
    named = named_objects(ROLES_FILE.read_text(encoding="utf-8"))
    texts = {(n.kind, n.text) for n in named}
    assert ("relation", "taskq.jobs") in texts
    assert ("relation", "taskq.queue_events") in texts  # the second of a list
    assert ("function", "taskq.delete_operator_audit(bigint[], float8)") in texts  # second of a REVOKE's list
    assert ("schema", "taskq") in texts
    # a comment naming a table is not a line for it
    assert named_objects("-- GRANT SELECT ON taskq.jobs TO x;\nGRANT SELECT ON taskq.workers TO x;") == [
        Named("relation", "taskq.workers")]


def test_a_table_whose_grants_are_removed_is_reported(module_dsn: str) -> None:
    script = ROLES_FILE.read_text(encoding="utf-8")
    without = re.sub(r"GRANT SELECT, INSERT, DELETE ON taskq\.rate_starts TO [^;]*;", "", script)
    without = without.replace("taskq.actor_limits, taskq.rate_starts, ", "taskq.actor_limits, ")
    assert without.count("rate_starts") < script.count("rate_starts")
    missing, _ = without_line(module_dsn, without)
    assert missing == ["relation taskq.rate_starts"]
    _, unknown = without_line(module_dsn, script + "\nGRANT EXECUTE ON FUNCTION taskq.gone(integer) TO x;\n")
    assert unknown == ["function taskq.gone(integer)"]


def test_only_the_known_security_definer_functions_are_executable_by_public(module_dsn: str) -> None:
    with psycopg.connect(module_dsn) as conn:
        conn.execute("SET search_path = pg_catalog")
        rows = conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace "
            "CROSS JOIN LATERAL aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a "
            "WHERE n.nspname = %s AND p.prosecdef AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'",
            (SCHEMA,),
        ).fetchall()
    public = {str(name) for (name,) in rows}
    assert public - PUBLIC_DEFINERS == set(), "SECURITY DEFINER functions executable by PUBLIC: revoke it"
    assert PUBLIC_DEFINERS - public == set(), "no longer executable by PUBLIC: drop them from PUBLIC_DEFINERS"
