"""The two contract tables: one ExitCode enum (every code documented, in the code and in docs/deploy.md),
and one module of exceptions (every error class in taskq.exceptions, under TaskqError)."""

from __future__ import annotations

import ast
import builtins
import enum
import re
from pathlib import Path

import taskq.cli
import taskq.exceptions
from taskq.exitcodes import ExitCode
from taskq.supervisor import restart
from taskq.worker import exitcodes as worker_exitcodes

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("runtime", "actors", "supervisor", "sql")
EXITCODES_SOURCE = ROOT / "runtime" / "exitcodes.py"
EXCEPTIONS_SOURCE = ROOT / "runtime" / "exceptions.py"

OUTSIDE_THE_TREE = {
    # an actor's request to run again, not an error: `except TaskqError` in an actor must not swallow it
    ("runtime/exceptions.py", "Snooze"),
    # a forced cancel, a BaseException so that an actor's `except Exception` cannot swallow it (STYLE);
    # the thread executor's mechanism, and docs/isolation.md names it by its path
    ("actors/thread.py", "ActorInterrupted"),
    # a durable sleep or wait ending the attempt, a BaseException for the same reason; the worker decides by
    # what the JobContext recorded, and docs/durable.md names it
    ("runtime/context.py", "JobSuspended"),
    # the LISTEN connection's own verdict on itself (a standby, not listening), caught by the listener, which
    # reconnects; never raised to a caller
    ("runtime/backend/notify.py", "ListenerUnfit"),
    # an HTTP answer inside the optional web integration, rendered by its own app, never raised to a caller
    ("runtime/web/problems.py", "Problem"),
}
"""The only exception classes of the package outside the TaskqError tree, each with its reason."""


def member_docstrings() -> dict[str, str]:
    """ExitCode's members and the string literal that follows each assignment in the source."""
    tree = ast.parse(EXITCODES_SOURCE.read_text())
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ExitCode"]
    docs: dict[str, str] = {}
    for stmt, after in zip(cls.body, [*cls.body[1:], None], strict=True):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            doc = ""
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                doc = str(after.value.value).strip()
            docs[stmt.targets[0].id] = doc
    return docs


def test_every_exit_code_is_unique_and_a_valid_process_status() -> None:
    assert len(ExitCode.__members__) == len(list(ExitCode))  # no alias hides a second name for a number
    values = [int(code) for code in ExitCode]
    assert len(set(values)) == len(values)
    assert all(0 <= value <= 255 for value in values)


def test_every_exit_code_has_a_docstring() -> None:
    docs = member_docstrings()
    assert set(docs) == set(ExitCode.__members__)
    assert [name for name, doc in docs.items() if not doc] == []


def test_the_deploy_guide_shows_the_same_exit_code_table() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (\d+) \| `([A-Z_]+)` \|", section, flags=re.M))
    assert {int(code): name for code, name in rows.items()} == {code.value: code.name for code in ExitCode}


def test_the_cli_worker_and_supervisor_names_are_members_of_the_one_enum() -> None:
    assert taskq.cli.ExitCode is ExitCode
    worker_names = {name: value for name, value in vars(worker_exitcodes).items() if name.isupper()}
    assert worker_names and all(type(value) is ExitCode for value in worker_names.values())
    assert restart.CRASH_LOOP is ExitCode.CRASH_LOOP
    for codes in (restart.CONFIG_EXIT_CODES, restart.BOOT_EXIT_CODES, restart.SELF_RESTART_EXIT_CODES):
        assert all(type(code) is ExitCode for code in codes)


def test_the_cli_errors_carry_their_exit_code() -> None:
    assert taskq.exceptions.CliError.code is ExitCode.INTERNAL
    assert taskq.exceptions.UsageError.code is ExitCode.USAGE
    assert taskq.exceptions.NotFound.code is ExitCode.NOT_FOUND
    assert taskq.exceptions.MissingExtra.code is ExitCode.MISSING_EXTRA
    assert taskq.exceptions.AppNotImportable.code is ExitCode.IMPORT_ERROR
    assert taskq.cli.AppNotImportable is taskq.exceptions.AppNotImportable


def exception_classes_in_source() -> set[tuple[str, str]]:
    """(file, class name) of every class statement in the package, at any depth, that derives from an
    exception: a builtin one, or (transitively) another class of the package that does."""
    classes: list[tuple[str, str, list[str]]] = []
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                             for b in node.bases]
                    classes.append((str(path.relative_to(ROOT)), node.name, bases))
    exceptions = {name for name, value in vars(builtins).items()
                  if isinstance(value, type) and issubclass(value, BaseException)}
    found: set[tuple[str, str]] = set()
    grew = True
    while grew:
        grew = False
        for file, name, bases in classes:
            if (file, name) not in found and exceptions.intersection(bases):
                found.add((file, name))
                exceptions.add(name)
                grew = True
    return found


def test_every_exception_class_is_in_taskq_exceptions_except_the_listed_few() -> None:
    found = exception_classes_in_source()
    assert ("runtime/exceptions.py", "TaskqError") in found  # the scan sees the tree
    elsewhere = {entry for entry in found if entry[0] != "runtime/exceptions.py"}
    assert elsewhere == {entry for entry in OUTSIDE_THE_TREE if entry[0] != "runtime/exceptions.py"}


def test_every_exception_class_derives_from_taskq_error_except_the_listed_few() -> None:
    from taskq.actors.thread import ActorInterrupted
    from taskq.web.problems import Problem

    classes = [value for value in vars(taskq.exceptions).values()
               if isinstance(value, type) and issubclass(value, BaseException)
               and value.__module__ == "taskq.exceptions"]
    outside = {cls.__name__ for cls in classes if not issubclass(cls, taskq.exceptions.TaskqError)}
    assert outside == {name for file, name in OUTSIDE_THE_TREE if file == "runtime/exceptions.py"}
    assert not issubclass(ActorInterrupted, Exception)  # not even `except Exception` catches it
    assert not issubclass(Problem, taskq.exceptions.TaskqError)


def test_the_exit_code_module_imports_nothing_of_taskq() -> None:
    tree = ast.parse(EXITCODES_SOURCE.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "enum"}
    assert issubclass(ExitCode, enum.IntEnum)
