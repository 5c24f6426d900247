"""The YAML of docs/kubernetes.md has the shape KEDA and Kubernetes read, checked against a minimal schema
written here (KEDA's CRD is not available offline, so only the fields the page relies on are checked), and
its numbers agree with taskq: the grace period exceeds the shutdown timeout it sets, the query is the
migration's function, the target is one pod's capacity."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]

from taskq.settings import DEFAULT_CONCURRENCY, WorkerSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"

# the minimal schema: a key maps to the type its value must have, or to a nested schema; "?" marks optional
SCALED_OBJECT: dict[str, Any] = {
    "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": str},
    "spec": {"scaleTargetRef": {"name": str}, "minReplicaCount?": int, "maxReplicaCount?": int,
             "pollingInterval?": int, "cooldownPeriod?": int, "triggers": list},
}
TRIGGER: dict[str, Any] = {
    "type": "postgresql",
    # KEDA reads every trigger metadata value as a string
    "metadata": {"query": str, "targetQueryValue": str, "activationTargetQueryValue?": str},
    "authenticationRef": {"name": str},
}
TRIGGER_AUTH: dict[str, Any] = {
    "apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication", "metadata": {"name": str},
    "spec": {"secretTargetRef": list},
}
DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": str},
    "spec": {"selector": {"matchLabels": dict},
             "template": {"metadata": {"labels": dict},
                          "spec": {"terminationGracePeriodSeconds": int, "containers": list}}},
}


def violations(value: Any, schema: Any, where: str = "") -> list[str]:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{where or '.'}: a mapping expected, got {type(value).__name__}"]
        found = []
        for key, sub in schema.items():
            name, optional = key.rstrip("?"), key.endswith("?")
            if name not in value:
                found += [] if optional else [f"{where}.{name}: missing"]
            else:
                found += violations(value[name], sub, f"{where}.{name}")
        return found
    if isinstance(schema, type):
        ok = isinstance(value, schema) and not (schema is int and isinstance(value, bool))
        return [] if ok else [f"{where}: {schema.__name__} expected, got {value!r}"]
    return [] if value == schema else [f"{where}: {schema!r} expected, got {value!r}"]


def documents() -> dict[str, dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    docs = [d for block in blocks for d in yaml.safe_load_all(block) if d]
    return {str(d["kind"]): d for d in docs}


def test_the_schema_checker_reports_what_is_wrong() -> None:
    assert violations({"a": {"b": 1}}, {"a": {"b": int}}) == []
    assert violations({"a": {"b": "1"}}, {"a": {"b": int, "c?": str}}) == [".a.b: int expected, got '1'"]
    assert violations({"a": True}, {"a": int, "d": str}) == [".a: int expected, got True", ".d: missing"]


def test_the_page_has_a_valid_scaled_object_trigger_authentication_and_deployment() -> None:
    docs = documents()
    assert sorted(docs) == ["Deployment", "ScaledObject", "TriggerAuthentication"]
    assert violations(docs["ScaledObject"], SCALED_OBJECT) == []
    assert violations(docs["TriggerAuthentication"], TRIGGER_AUTH) == []
    assert violations(docs["Deployment"], DEPLOYMENT) == []
    (trigger,) = docs["ScaledObject"]["spec"]["triggers"]
    assert violations(trigger, TRIGGER) == []
    assert docs["ScaledObject"]["spec"]["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"]
    assert trigger["authenticationRef"]["name"] == docs["TriggerAuthentication"]["metadata"]["name"]
    assert docs["TriggerAuthentication"]["spec"]["secretTargetRef"][0]["parameter"] == "connection"


def test_the_trigger_reads_the_depth_function_and_targets_one_pods_capacity() -> None:
    docs = documents()
    (trigger,) = docs["ScaledObject"]["spec"]["triggers"]
    assert trigger["metadata"]["query"] == "SELECT taskq.queue_depth_v19(ARRAY['default'])"
    target = int(trigger["metadata"]["targetQueryValue"])
    assert target > 0  # KEDA refuses 0
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    workers = int(args[args.index("--workers") + 1])
    assert target == workers * DEFAULT_CONCURRENCY
    assert math.ceil(1000 / target) == 3  # the page's example


def test_the_grace_period_exceeds_the_shutdown_timeout_the_deployment_sets() -> None:
    docs = documents()
    spec = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    shutdown = WorkerSettings(shutdown_timeout=float(env["TASKQ_SHUTDOWN_TIMEOUT"])).effective_shutdown_timeout
    assert spec["terminationGracePeriodSeconds"] > shutdown
    # and Kubernetes' default grace (30 s) is shorter than taskq's default shutdown_timeout, as the page says
    assert WorkerSettings().effective_shutdown_timeout > 30
    assert env["TASKQ_METRICS_HOST"] == "0.0.0.0"
