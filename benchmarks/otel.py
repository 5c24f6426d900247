"""OpenTelemetry's cost on a no-op drain: one worker draining a backlog, with OpenTelemetry not installed,
installed but not configured, enabled (an SDK tracer provider exporting to memory in batches), and enabled
with the documented sampling set-up (docs/integrations.md: `OTEL_TRACES_SAMPLER=parentbased_traceidratio`,
`OTEL_TRACES_SAMPLER_ARG=0.1`, in the producers and the workers alike).

    python benchmarks/otel.py --nootel-python VENV/bin/python [--dsn DSN] [--jobs 20000] [--rounds 3]
                              [--json out.json]

`--nootel-python`: an interpreter of a virtualenv with taskq installed without the otel extra (for
example `python -m venv v && v/bin/pip install -e . uvloop`). The modes run interleaved, round by round,
on one database (benchmarks/throughput.py's round: enqueue the backlog, start the worker, drain). In
the enabled mode every job carries a trace context (as an enqueue inside a traced request writes), so
each attempt's process span is the child of a remote parent, and the worker exports one span per job.
In the sampled mode one job in ten carries a sampled parent (what producers sampling 10 % at the root
write) and the others an unsampled one, so the worker records one span in ten.
Targets (issue 34): sampled 10 % within 10 % of not installed; not configured no different from not
installed. The enabled mode, every job traced, is the SDK's full cost (benchmarks/otel_overhead.py takes
taskq's own part of it apart).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    DSN_HELP,
    RESULTS_DIR,
    ServerCpu,
    announce,
    bench_database,
    header,
    machine,
    print_table,
    server_facts,
    write_report,
)
from throughput import run_round

TARGET_SLOWDOWN = 0.10
TRACEPARENT = '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'
SAMPLED = "sampled 10 % (parent-based)"
SAMPLER_ENV = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}


def stamp_trace_context(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE taskq.jobs SET trace_context = %s::jsonb", (TRACEPARENT,))


def stamp_sampled_trace_context(dsn: str) -> None:
    """A trace of its own per job, one in ten sampled (flag 01), as producers sampling 10 % write them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE taskq.jobs SET trace_context = jsonb_build_object('traceparent', '00-'"
                     " || md5(id::text) || '-' || left(md5(id::text || 's'), 16) || '-'"
                     " || CASE WHEN random() < 0.1 THEN '01' ELSE '00' END)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--nootel-python", required=True, help="an interpreter without opentelemetry installed")
    parser.add_argument("--jobs", type=int, default=20_000, help="backlog size per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--claim-batch-size", type=int, default=200)
    parser.add_argument("--enqueue-batch", type=int, default=5_000)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "otel.json")
    args = parser.parse_args()
    args.py_spy = False
    modes: dict[str, dict[str, Any]] = {
        "not installed": {"python": args.nootel_python, "app": "benchmarks.apps:actors", "after_enqueue": None},
        "installed, not configured": {"python": sys.executable, "app": "benchmarks.apps:actors",
                                      "after_enqueue": None},
        "enabled (in-memory exporter)": {"python": sys.executable, "app": "benchmarks.otel_app:actors",
                                         "after_enqueue": stamp_trace_context},
        SAMPLED: {"python": sys.executable, "app": "benchmarks.otel_app:actors",
                  "after_enqueue": stamp_sampled_trace_context},
    }
    params = {"jobs": args.jobs, "rounds": args.rounds, "concurrency": args.concurrency,
              "claim_batch_size": args.claim_batch_size}
    info = machine()
    rates: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    with bench_database(args.dsn, "otel") as dsn:
        server = server_facts(dsn)
        announce("otel", params, info, server)
        server_cpu = ServerCpu(dsn)
        for r in range(args.rounds):
            names = list(modes) if r % 2 == 0 else list(modes)[::-1]
            for name in names:
                for key, value in modes[name].items():
                    setattr(args, key, value)
                # the worker's SDK reads its sampler from the environment (TracerProvider() without one)
                saved = {k: os.environ.pop(k, None) for k in SAMPLER_ENV}
                if name == SAMPLED:
                    os.environ.update(SAMPLER_ENV)
                try:
                    result = run_round(dsn, args, 1, server_cpu, f"otel-{r}-{name.split()[0]}")
                finally:
                    for k, v in saved.items():
                        os.environ.pop(k, None)
                        if v is not None:
                            os.environ[k] = v
                rates[name].append(result["jobs_per_s"])
                cpu[name].append(result["worker_cpu_us_per_job"])
                print(f"round {r + 1} {name}: {result['jobs_per_s']:,.0f} jobs/s", file=sys.stderr)
    base = statistics.median(rates["not installed"])
    rows = []
    summary: dict[str, Any] = {}
    for name in modes:
        rate = statistics.median(rates[name])
        slower = 1 - rate / base
        summary[name] = {"jobs_per_s": rate, "worker_cpu_us_per_job": statistics.median(cpu[name]),
                         "slower_than_not_installed": slower}
        rows.append([name, rate, statistics.median(cpu[name]), f"{slower:+.1%}"])
    print_table(["mode", "jobs/s", "worker CPU us/job", "slower than not installed"], rows)
    sampled = summary[SAMPLED]["slower_than_not_installed"]
    verdict = "met" if sampled <= TARGET_SLOWDOWN else "NOT met"
    print(f"{SAMPLED}: {sampled:+.1%} (target <= {TARGET_SLOWDOWN:.0%}): {verdict}")
    report = header("otel", params, info, server) | {"rounds": rates, "worker_cpu_us_per_job": cpu,
                                                      "summary": summary}
    print(f"wrote {write_report('otel', report, args.json)}")


if __name__ == "__main__":
    main()
