"""taskq's own work per traced job, on top of what the OpenTelemetry SDK's span costs: the consumer span of
one attempt as the worker makes it (`taskq.tracing.consumer`, entered, the outcome set, left) against a
bare SDK span doing the same (started with the same eight attributes under the same remote parent, made
current, the outcome set, ended), in one process, CPU time of the calling thread.

    python benchmarks/otel_overhead.py [--jobs 5000] [--rounds 7] [--instructions] [--json out.json]

Three set-ups, each in a process of its own (the SDK's tracer provider is set once per process):
- `all`: an SDK TracerProvider with a BatchSpanProcessor exporting to memory, every job's stored trace
  context sampled (what otel.py's enabled mode drains);
- `sampled 10 %`: the documented sampling set-up, `ParentBased(TraceIdRatioBased(0.1))`, with the
  producers sampled the same way, so that one job in ten carries a sampled parent (flag 01) and the others
  an unsampled one (00): the worker records only the sampled ones;
- `not configured`: OpenTelemetry imported, no tracer provider set (taskq traces nothing).

The bare span gets its parent context built once, outside the timing; taskq's span reads it from the
job's stored trace context every time, as the worker must. The export thread's CPU is not in either
figure (it is the SDK's, the same for both). Target (issue 34): taskq's own work <= 5 us per traced job.

`--instructions` also counts both spans' instructions with valgrind's callgrind (each in a process of its
own, against one that runs neither): a figure these VMs' speed swings cannot move, and the same on any
machine of one instruction set.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import machine

TARGET_US = 5.0
SETUPS = ("all", "sampled 10 %", "not configured")


@dataclass
class Job:
    """What `tracing.consumer` reads of a claimed job (taskq.backend.workers.ClaimedJob)."""

    id: uuid.UUID
    queue: str
    actor: str
    attempt: int
    trace_context: str | None
    """Its JSON text, as the claim returns it (what jsonb writes back)."""
    id_text: str | None = None
    """Its id's text, once made (taskq.tracing.id_text)."""


def traceparent(sampled: bool) -> str:
    return f"00-{random.getrandbits(128):032x}-{random.getrandbits(64):016x}-{'01' if sampled else '00'}"


def child(setup: str, jobs: int, rounds: int, only: str | None = None) -> dict[str, Any]:
    """Runs in the child process: set up OpenTelemetry as `setup` says, then time both spans. With `only`
    (under valgrind, --instructions), run that one ("none": neither) over the batch once, untimed."""
    from opentelemetry import context, propagate, trace
    from opentelemetry.trace import SpanKind

    exporter = None
    if setup != "not configured":
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

        sampler = ALWAYS_ON if setup == "all" else ParentBased(TraceIdRatioBased(0.1))
        provider = TracerProvider(sampler=sampler)
        exporter = InMemorySpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=10 * jobs))
        trace.set_tracer_provider(provider)
    from taskq import tracing

    rng = random.Random(7)
    batch = [Job(uuid.uuid4(), "default", "bench.noop", 1,
                 json.dumps({"traceparent": traceparent(setup == "all" or rng.random() < 0.1)}))
             for _ in range(jobs)]
    parents = [propagate.extract(json.loads(job.trace_context or "{}")) for job in batch]
    tracer = trace.get_tracer("bench.bare")

    def bare(count: int = jobs) -> None:
        for job, parent in zip(batch[:count], parents[:count], strict=True):
            attributes: dict[str, Any] = {
                "messaging.system": "taskq", "messaging.operation.type": "process",
                "messaging.operation.name": "process", "messaging.destination.name": job.queue,
                "messaging.message.id": "0", "taskq.actor": job.actor, "taskq.attempt": job.attempt,
                "taskq.isolation": "async",
            }
            span = tracer.start_span(f"process {job.queue}", context=parent, kind=SpanKind.CONSUMER,
                                     attributes=attributes)
            token = context.attach(trace.set_span_in_context(span))
            span.set_attribute("taskq.outcome", "succeeded")
            context.detach(token)
            span.end()

    def ours(count: int = jobs) -> None:
        for job in batch[:count]:
            with tracing.consumer(job, "async") as span:
                if span is not None:
                    span.outcome("succeeded")

    if only is not None:
        bare(1)  # the first traced place loads the integration: the same work in every run
        ours(1)
        batch[0].id_text = None
        {"bare": bare, "ours": ours, "none": lambda: None}[only]()
        return {}
    timings: dict[str, list[float]] = {"bare SDK span": [], "taskq consumer span": []}
    for r in range(rounds + 1):  # the first round warms up, untimed
        order = [("bare SDK span", bare), ("taskq consumer span", ours)]
        for name, run in order if r % 2 == 0 else order[::-1]:
            for job in batch:  # the id's text is made by the first of the job's span and log lines: count it
                job.id_text = None
            started = time.thread_time()
            run()
            if r:
                timings[name].append((time.thread_time() - started) / jobs * 1e6)
            if exporter is not None:
                exporter.clear()
    return timings


ONLY = ("none", "bare", "ours")
INSTRUCTION_JOBS = 2000
_COLLECTED = re.compile(r"Collected : (\d+)")


def instructions(setup: str, only: str) -> int:
    """Instructions of one child run under callgrind (the whole process: set-up, the warm-up and `only`)."""
    run = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
                          "--child", setup, "--jobs", str(INSTRUCTION_JOBS), "--only", only],
                         check=True, capture_output=True, text=True)
    found = _COLLECTED.search(run.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no instruction count: {run.stderr[-500:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5000, help="spans per measurement per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "otel_overhead.json")
    parser.add_argument("--instructions", action="store_true",
                        help="also count instructions per span under valgrind's callgrind (needs valgrind)")
    parser.add_argument("--child", choices=SETUPS, help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=ONLY, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.jobs, args.rounds, args.only)))
        return 0
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind (apt-get install valgrind)")
    info = machine()  # before the children load the machine
    results: dict[str, Any] = {}
    rows = []
    for setup in SETUPS:
        out = subprocess.run([sys.executable, __file__, "--child", setup, "--jobs", str(args.jobs),
                              "--rounds", str(args.rounds)], check=True, capture_output=True, text=True).stdout
        timings = json.loads(out)
        bare, ours = (statistics.median(timings[k]) for k in ("bare SDK span", "taskq consumer span"))
        results[setup] = {"bare_us": bare, "taskq_us": ours, "taskq_own_us": ours - bare, "rounds": timings}
        rows.append((setup, f"{bare:.1f}", f"{ours:.1f}", f"{ours - bare:+.1f}"))
    print(f"\nCPU per job of the calling thread (median of {args.rounds} rounds of {args.jobs:,} spans)")
    print(f"{'set-up':<16} {'bare SDK span us':>17} {'taskq span us':>14} {'taskq own us':>13}")
    for row in rows:
        print(f"{row[0]:<16} {row[1]:>17} {row[2]:>14} {row[3]:>13}")
    own = results["all"]["taskq_own_us"]
    print(f"taskq's own work per traced job: {own:.1f} us (target <= {TARGET_US:g}): "
          f"{'met' if own <= TARGET_US else 'MISSED'}")
    if args.instructions:
        print(f"\nInstructions per job (callgrind, {INSTRUCTION_JOBS:,} spans; what the run adds over the same "
              "process running neither)")
        print(f"{'set-up':<16} {'bare SDK span':>14} {'taskq span':>11} {'taskq own':>10} {'own / bare':>11}")
        for setup in SETUPS:
            counted = {only: instructions(setup, only) for only in ONLY}
            bare_i, ours_i = ((counted[k] - counted["none"]) / INSTRUCTION_JOBS for k in ("bare", "ours"))
            results[setup]["instructions"] = {"bare": bare_i, "taskq": ours_i, "taskq_own": ours_i - bare_i}
            print(f"{setup:<16} {bare_i:>14,.0f} {ours_i:>11,.0f} {ours_i - bare_i:>+10,.0f} "
                  f"{(ours_i - bare_i) / bare_i:>+11.1%}")
    report = {"benchmark": "otel_overhead", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": info,
              "params": {"jobs": args.jobs, "rounds": args.rounds}, "results": results,
              "target": {"taskq_own_us": TARGET_US, "met": own <= TARGET_US}}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
