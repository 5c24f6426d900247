"""What importing taskq loads, each probe in a fresh interpreter: `import taskq` loads none of taskq's parts
and no third-party package, `from taskq import actor` (what a Django app writes) loads the actor
declaration and not the clients, the backend, the pool or Prometheus, every public name still resolves
to the object its module defines, and prometheus_client is imported at the first use of a metric, so the
supervisor enters multiprocess mode in its own process (no re-exec)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("psycopg", "psycopg_pool", "prometheus_client", "pydantic_settings", "cronsim")


def _loaded_by(statement: str) -> list[str]:
    """The modules `statement` added to sys.modules in a fresh interpreter."""
    probe = (f"import json, sys\nbefore = set(sys.modules)\n{statement}\n"
             "print(json.dumps(sorted(set(sys.modules) - before)))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded: list[str] = json.loads(proc.stdout)
    return loaded


def _packages(modules: list[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_import_taskq_loads_no_part_of_taskq_and_no_third_party_package() -> None:
    loaded = _loaded_by("import taskq")
    assert [m for m in loaded if m.startswith("taskq")] == ["taskq"]
    assert "psycopg_pool" not in loaded and "prometheus_client" not in loaded
    assert not _packages(loaded) & {*HEAVY, "pydantic"}


def test_from_taskq_import_actor_loads_neither_the_clients_nor_the_backend_nor_prometheus() -> None:
    loaded = _loaded_by("from taskq import actor")
    assert not _packages(loaded) & set(HEAVY)
    taskq_modules = {m for m in loaded if m.startswith("taskq")}
    assert not taskq_modules & {"taskq.client", "taskq.client_sync", "taskq.backend", "taskq.metrics",
                                "taskq.ops", "taskq.settings", "taskq.schedules"}, sorted(taskq_modules)


def test_every_public_name_resolves_to_its_modules_object_and_is_listed_by_dir() -> None:
    probe = """
import json, taskq
from taskq import *  # noqa: F403
names = {}
for name in taskq.__all__:
    value = getattr(taskq, name)
    names[name] = [value.__module__, getattr(value, "__qualname__", name)]
print(json.dumps({"names": names, "dir": dir(taskq), "version": taskq.__version__}))
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report["names"]) == set(_public_names())
    for name, (module, qualname) in report["names"].items():
        assert qualname == name and module.startswith("taskq."), (name, module, qualname)
    assert set(_public_names()) <= set(report["dir"]) and "__version__" in report["dir"]


def test_submodules_still_import_through_the_package_and_unknown_names_raise_attribute_error() -> None:
    probe = """
import taskq
from taskq import sql, tracing
try:
    taskq.no_such_name
except AttributeError as exc:
    print(exc)
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "no_such_name" in proc.stdout


def test_the_supervisor_and_worker_import_prometheus_client_only_when_a_metric_is_first_used() -> None:
    loaded = _loaded_by("import taskq.supervisor.main, taskq.worker.main, taskq.cli, taskq.metrics")
    assert "prometheus_client" not in _packages(loaded)
    probe = """
from taskq.metrics import STALE_WRITES
STALE_WRITES.inc()
from prometheus_client import REGISTRY
print(REGISTRY.get_sample_value("taskq_stale_writes_total"), REGISTRY.get_sample_value("taskq_jobs_snoozed_total"))
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1.0", "0.0"], "the first use creates every collector, in the default registry"


_MULTIPROCESS_PROBE = """
import json, os, shutil, sys
{before}
import taskq.supervisor.main
from taskq.supervisor.metrics_http import enter_multiprocess_mode
entered = enter_multiprocess_mode()
path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
report = {{"entered": entered, "dir": path is not None and os.path.isdir(path), "pid": os.getpid()}}
if entered:
    from taskq.metrics import WORKER_RESTARTS
    WORKER_RESTARTS.inc()
    from prometheus_client import values
    report["multiprocess"] = values.ValueClass._multiprocess
    report["files"] = sorted(os.listdir(path))
    shutil.rmtree(path)
print(json.dumps(report))
"""


def test_the_supervisor_enters_multiprocess_mode_in_its_own_process(tmp_path: Path) -> None:
    env = {**os.environ, "RUNTIME_DIRECTORY": str(tmp_path)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.run([sys.executable, "-c", _MULTIPROCESS_PROBE.format(before="")], capture_output=True,
                          text=True, timeout=60, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["entered"] and report["dir"] and report["multiprocess"]
    assert f"counter_{report['pid']}.db" in report["files"], "the counter did not write to the directory"


def test_the_supervisor_refuses_metrics_that_prometheus_client_already_keeps_in_memory(tmp_path: Path) -> None:
    env = {**os.environ, "RUNTIME_DIRECTORY": str(tmp_path)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.run([sys.executable, "-c", _MULTIPROCESS_PROBE.format(before="import prometheus_client")],
                          capture_output=True, text=True, timeout=60, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert not report["entered"] and not report["dir"]
    assert list(tmp_path.iterdir()) == []


_OTEL_PROBE = """
import json, sys
{before}
from taskq import tracing
from taskq.metrics import cancellation_requested
cancellation_requested()
print(json.dumps({{"active": tracing.active() is not None, "hooks": tracing.hooks() is not None,
                  "loaded": "taskq.contrib.otel" in sys.modules}}))
"""


def test_opentelemetry_registers_its_hooks_only_in_a_process_that_imported_it() -> None:
    def probe(before: str) -> dict[str, bool]:
        proc = subprocess.run([sys.executable, "-c", _OTEL_PROBE.format(before=before)], capture_output=True,
                              text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        report: dict[str, bool] = json.loads(proc.stdout)
        return report

    assert probe("") == {"active": False, "hooks": False, "loaded": False}
    # imported but no tracer provider set: the integration is loaded, and does nothing
    assert probe("import opentelemetry.trace") == {"active": False, "hooks": True, "loaded": True}
    with_provider = ("from opentelemetry import trace\nfrom opentelemetry.sdk.trace import TracerProvider\n"
                     "trace.set_tracer_provider(TracerProvider())")
    assert probe(with_provider) == {"active": True, "hooks": True, "loaded": True}


def _public_names() -> list[str]:
    import taskq

    return list(taskq.__all__)
