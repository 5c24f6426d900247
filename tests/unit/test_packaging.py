"""The package list in pyproject.toml matches the folders, and importing taskq has no side effects."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("runtime", "actors", "supervisor", "sql")


def _setuptools() -> dict[str, Any]:
    with open(REPO / "pyproject.toml", "rb") as f:
        config: dict[str, Any] = tomllib.load(f)["tool"]["setuptools"]
    return config


def _package_folder(package: str, package_dir: dict[str, str]) -> Path:
    """Where setuptools looks for `package`: its own package-dir entry, else its parent's folder."""
    if package in package_dir:
        return REPO / package_dir[package]
    parent, _, leaf = package.rpartition(".")
    if not parent:
        return REPO / leaf
    return _package_folder(parent, package_dir) / leaf


def _folders_with_python() -> set[Path]:
    found: set[Path] = set()
    for top in SOURCE_FOLDERS:
        for py in (REPO / top).rglob("*.py"):
            if "__pycache__" not in py.parts:
                found.add(py.parent)
    return found


def test_every_folder_with_python_files_is_a_listed_package_and_every_listed_package_exists() -> None:
    config = _setuptools()
    package_dir: dict[str, str] = config.get("package-dir", {})
    listed = {_package_folder(p, package_dir): p for p in config["packages"]}
    folders = _folders_with_python()
    unlisted = sorted(str(f.relative_to(REPO)) for f in folders - set(listed))
    missing = sorted(p for folder, p in listed.items() if folder not in folders)
    assert not unlisted, f"folders with .py files missing from [tool.setuptools] packages: {unlisted}"
    assert not missing, f"packages listed in pyproject.toml without a folder of .py files: {missing}"


def test_top_level_folders_map_to_the_documented_import_names() -> None:
    config = _setuptools()
    package_dir: dict[str, str] = config.get("package-dir", {})
    mapping = {p: _package_folder(p, package_dir).relative_to(REPO).as_posix() for p in config["packages"]}
    expected = {
        "taskq": "runtime",
        "taskq.worker": "runtime/worker",
        "taskq.actors": "actors",
        "taskq.supervisor": "supervisor",
        "taskq.sql": "sql",
    }
    assert {k: mapping.get(k) for k in expected} == expected


def test_every_package_has_an_init_module() -> None:
    config = _setuptools()
    package_dir: dict[str, str] = config.get("package-dir", {})
    without_init = [p for p in config["packages"] if not (_package_folder(p, package_dir) / "__init__.py").is_file()]
    assert without_init == []


def test_py_typed_and_sql_files_are_shipped_as_package_data() -> None:
    config = _setuptools()
    assert "py.typed" in config["package-data"]["taskq"]
    assert "*.sql" in config["package-data"]["taskq.sql"]
    assert (REPO / "runtime" / "py.typed").is_file()
    assert resources.files("taskq").joinpath("py.typed").is_file()
    assert resources.files("taskq.sql").joinpath("0001_initial.sql").is_file()


_IMPORT_PROBE = r"""
import json, os, sys, threading

def sockets():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n

threads_before = threading.active_count()
sockets_before = sockets()
import taskq
import taskq.backend, taskq.client, taskq.backend.migrations, taskq.models, taskq.actors, taskq.sql
import taskq.cli, taskq.ops.tokens, taskq.backend.web
import taskq.client_sync, taskq.tracing, taskq.logs, taskq.metrics, taskq.worker.main, taskq.actors.child
extras = ("opentelemetry", "django", "django_tasks", "sqlalchemy", "starlette", "jinja2", "uvicorn", "httpx",
          "multipart", "python_multipart")
optional = sorted(m for m in sys.modules if m.split(".")[0] in extras or m.startswith("taskq.web"))
print(json.dumps({
    "optional": optional,
    "threads": [threads_before, threading.active_count()],
    "sockets": [sockets_before, sockets()],
    "os_threads": os.listdir(f"/proc/{os.getpid()}/task"),
    "data_dir": os.listdir(os.environ["TASKQ_DATA_DIR"]),
}))
"""


def test_importing_taskq_opens_no_connection_and_starts_no_thread(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "TASKQ_DATA_DIR": str(tmp_path), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    threads_before, threads_after = report["threads"]
    sockets_before, sockets_after = report["sockets"]
    assert threads_after == threads_before
    assert len(report["os_threads"]) == 1, "importing taskq started an OS thread"
    assert sockets_after == sockets_before, "importing taskq opened a socket"
    assert report["data_dir"] == [], "importing taskq touched the embedded server's data dir"
    assert report["optional"] == [], "importing taskq (its CLI, sync client, worker, tracing seam) imported an extra"


def test_the_web_package_ships_its_templates_and_htmx_with_its_licence() -> None:
    config = _setuptools()
    assert "taskq.web" in config["packages"]
    web = resources.files("taskq.web")
    for name in ("templates/base.html", "templates/job.html", "static/htmx.min.js", "static/htmx.LICENSE",
                 "static/taskq.css"):
        assert web.joinpath(name).is_file(), name
    with open(REPO / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert {d.split(">")[0].split("[")[0] for d in extras["web"]} >= {"starlette", "jinja2", "uvicorn"}
