"""The unit files in systemd/: systemd accepts them, and their timeouts fit the supervisor's budgets."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from taskq.settings import WorkerSettings
from taskq.supervisor.arbiter import SupervisorOptions
from taskq.worker import exitcodes

pytestmark = pytest.mark.timeout(60)

UNITS = Path(__file__).resolve().parents[2] / "systemd"


def directives(name: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


@pytest.mark.parametrize("name", ["taskq.service", "taskq@.service"])
def test_units_are_notify_services_stopped_by_the_supervisor(name: str) -> None:
    d = directives(name)
    assert d["Type"] == ["notify"] and d["NotifyAccess"] == ["main"]
    assert d["KillMode"] == ["mixed"] and d["KillSignal"] == ["SIGTERM"]
    assert d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert d["Restart"] == ["on-failure"]
    prevented = {int(c) for c in d["RestartPreventExitStatus"][0].split()}
    assert prevented == {exitcodes.USAGE, exitcodes.EMBEDDED_UNAVAILABLE, exitcodes.IMPORT_ERROR}
    assert d["ExecStart"][0].split()[1] == "run"
    assert d["NoNewPrivileges"] == ["yes"] and d["ProtectSystem"] == ["strict"] and d["PrivateTmp"] == ["yes"]


@pytest.mark.parametrize("name", ["taskq.service", "taskq@.service"])
def test_unit_timeouts_exceed_the_supervisors_own_budgets(name: str) -> None:
    d = directives(name)
    settings = WorkerSettings()
    options = SupervisorOptions(app="x:y", workers=1)
    assert float(d["TimeoutStopSec"][0]) > settings.effective_shutdown_timeout + options.stop_margin
    assert float(d["WatchdogSec"][0]) > settings.worker_timeout + options.kill_grace


def test_env_example_names_only_real_settings() -> None:
    fields = {f"TASKQ_{name.upper()}" for name in WorkerSettings.model_fields} | {"TASKQ_WORKERS"}
    for line in (UNITS / "taskq.env.example").read_text().splitlines():
        line = line.lstrip("#").strip()
        if line.startswith("TASKQ_") and "=" in line:
            assert line.split("=", 1)[0] in fields, line


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize(("name", "instance"), [("taskq.service", "taskq.service"),
                                                ("taskq@.service", "taskq@emails.service")])
def test_systemd_analyze_verify_accepts_the_unit(name: str, instance: str, tmp_path: Path) -> None:
    # the only change: paths that exist on this machine (verify checks that ExecStart is executable)
    text = (UNITS / name).read_text().replace("/opt/taskq/venv/bin/taskq", "/bin/true")
    text = text.replace("EnvironmentFile=/", "EnvironmentFile=-/")
    (tmp_path / instance).write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / instance)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert instance not in result.stdout + result.stderr, result.stdout + result.stderr
