"""The current figures: one JSON file per report under benchmarks/current/, one table each in
benchmarks/README.md, written between marker comments from that JSON.

    python benchmarks/report.py                   # rewrite the README's tables from benchmarks/current/
    python benchmarks/report.py --check           # exit 1 when a table differs from its JSON (CI)
    python benchmarks/report.py --take latency benchmarks/results/latency.json \\
        --machine "2-vCPU VM, embedded PostgreSQL 18, nothing else running" \\
        --command "python benchmarks/latency.py"  # a fresh run becomes the current figures

A current file holds the table (`columns`, `rows` of text cells, optional `notes` printed under it) and
where it came from (`provenance`: the date, the machine, the commit measured, the command, and whether
the figures were measured into this file by `--take` or transcribed by hand from an earlier README).
In the README a table sits between `<!-- current:NAME -->` and `<!-- /current:NAME -->`; everything
between the two is generated, so edit the JSON (or take a new run) and rerun this script.

`--take NAME RESULTS...` reads what a benchmark wrote under benchmarks/results/ and replaces the
current file NAME with its table, dated by the run and stamped with the checkout's commit (`-dirty`
when the work tree has changes). The reports it can read are those in `IMPORTERS`; the others are
kept by hand. unique takes two files, the run with `--synchronous-commit on` and the one with `off`.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
CURRENT_DIR = BENCH_DIR / "current"
README = BENCH_DIR / "README.md"
NOT_MEASURED = "not measured yet"

_BLOCK = re.compile(r"<!-- current:(?P<name>[\w-]+) -->\n.*?<!-- /current:(?P=name) -->", re.DOTALL)

Table = tuple[list[str], list[list[str]], list[str]]
"""columns, rows, notes"""


# -- rendering -------------------------------------------------------------------------------------


def load_current(directory: Path = CURRENT_DIR) -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))}


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def provenance_line(current: dict[str, Any]) -> str:
    p = current["provenance"]
    if not current["rows"] or all(cell == NOT_MEASURED for row in current["rows"] for cell in row[1:]):
        return f"*Not measured yet.* Command: `{p['command']}`."
    when = f" {p['date']}" if p.get("date") else ""
    commit = f"commit {p['commit']}" if p.get("commit") else "commit not recorded"
    text = f"Measured{when} on {p['machine']}; {commit}. Command: `{p['command']}`."
    if p.get("transcribed"):
        text += f" Transcribed by hand from {p['source']}."
    return f"*{text}*"


def render(name: str, current: dict[str, Any]) -> str:
    columns: list[str] = current["columns"]
    align: str = current.get("align") or "l" + "r" * (len(columns) - 1)
    lines = [f"<!-- current:{name} -->", provenance_line(current), ""]
    lines.append("| " + " | ".join(_escape(c) for c in columns) + " |")
    lines.append("| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |")
    for row in current["rows"]:
        if len(row) != len(columns):
            raise ValueError(f"{name}: a row has {len(row)} cells for {len(columns)} columns: {row}")
        lines.append("| " + " | ".join(_escape(str(c)) for c in row) + " |")
    notes: list[str] = current.get("notes") or []
    if notes:
        lines.append("")
        lines.extend(f"- {note}" for note in notes)
    lines.append(f"<!-- /current:{name} -->")
    return "\n".join(lines)


def rewrite(text: str, currents: dict[str, dict[str, Any]]) -> tuple[str, list[str]]:
    """The README with every table regenerated, and the problems found (a block without JSON or the
    reverse)."""
    problems: list[str] = []
    seen: set[str] = set()

    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if name in seen:
            problems.append(f"README has two tables for {name}")
        seen.add(name)
        if name not in currents:
            problems.append(f"README has a table for {name} but there is no benchmarks/current/{name}.json")
            return match[0]
        return render(name, currents[name])

    new = _BLOCK.sub(block, text)
    problems.extend(f"benchmarks/current/{name}.json has no table in the README (add the two marker comments)"
                    for name in sorted(set(currents) - seen))
    return new, problems


# -- taking a run's results --------------------------------------------------------------------------


def _num(value: Any, decimals: int = 0) -> str:
    """A figure as the tables print it: thousands separated, `-` for a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{decimals}f}"


def _ms(value: Any) -> str:
    return _num(value, 2)


def _pct(fraction: float, signed: bool = False) -> str:
    return f"{100 * fraction:+.1f} %" if signed else f"{100 * fraction:.1f} %"


def _met(flag: Any) -> str:
    return "met" if flag else "missed"


def take_latency(reports: Sequence[dict[str, Any]]) -> Table:
    (report,) = reports
    results, target = report["results"], report["target"]
    rows = [[label, _ms(results[key]["p50"]), _ms(results[key]["p99"]), _ms(results[key]["max"])]
            for label, key in (("enqueue call → actor start", "enqueue_to_start_ms"),
                               ("enqueue returned → actor start", "commit_to_start_ms"),
                               ("enqueue call (insert + commit)", "enqueue_call_ms"),
                               ("created_at → claimed (server clock)", "created_to_claimed_ms"))]
    notes = [f"Target, from the enqueue call: p50 ≤ {target['p50_ms']:g} ms and p99 ≤ {target['p99_ms']:g} ms: "
             f"{_met(target['met'])}."]
    if "lean" in report:
        lean = report["lean"]["enqueue_to_start_ms"]
        rows.append(["lean loop (same run): enqueue call → start", _ms(lean["p50"]), _ms(lean["p99"]),
                     _ms(lean["max"])])
        rows += [[f"traced worker: {label}", _ms(seg["p50"]), _ms(seg["p99"]), _ms(seg["max"])]
                 for label, seg in report["traced"]["segments_ms"].items()]
        t = report["lean_target"]
        notes.append(f"Against the lean loop: p50 {t['p50_ratio']:.2f}x (target ≤ {t['p50_max']:g}x), p99 "
                     f"{t['p99_ratio']:.2f}x (target ≤ {t['p99_max']:g}x): {_met(t['met'])}.")
    return ["figure", "p50 ms", "p99 ms", "max ms"], rows, notes


def take_heartbeat(reports: Sequence[dict[str, Any]]) -> Table:
    (report,) = reports
    rows = [[_num(r["in_flight"]), _ms(r["p50_ms"]), _ms(r["p99_ms"]), _ms(r["max_ms"]),
             _ms(r["statement_server_ms"])] for r in report["results"]]
    rows += [[f"2 CPU-bound actors, {r['isolation']} isolation (interval 0.1 s)", _ms(r["p50_ms"]),
              _ms(r["p99_ms"]), _ms(r["max_ms"]), "-"] for r in report.get("cpu_bound", [])]
    target = report["target"]
    notes = [f"Target p99 < {target['p99_ms_at_1000']:g} ms at 1,000 in flight: {_met(target['met'])}; "
             f"flat in the jobs held ({target['flat_rule']}): {_met(target['flat'])}."]
    return ["in flight", "p50 ms", "p99 ms", "max ms", "statement (server) ms"], rows, notes


def take_cancel_latency(reports: Sequence[dict[str, Any]]) -> Table:
    (report,) = reports
    rows = [[mode, _ms(r["p50"]), _ms(r["p99"]), _ms(r["max"]), _num(r["n"])]
            for mode, r in report["results"].items()]
    target = report["target"]
    notes = [f"Target p99 < {target['p99_ms_notify']:g} ms with NOTIFY: {_met(target['met'])}."]
    return ["mode", "p50 ms", "p99 ms", "max ms", "cancels"], rows, notes


def take_shutdown(reports: Sequence[dict[str, Any]]) -> Table:
    (report,) = reports
    rows = [[_num(r["jobs"]), _num(r["exit_s"], 2), f"{r['released']:,} / {r['jobs']:,}", str(r["exit_code"])]
            for r in report["results"]]
    target = report["target"]
    notes = [f"Target under {target['seconds']:g} s with every job released: {_met(target['met'])}."]
    return ["in flight", "SIGTERM → exit (s)", "released", "exit code"], rows, notes


def take_enqueue(reports: Sequence[dict[str, Any]]) -> Table:
    (report,) = reports
    results = report["results"]
    rows = [[results[key]["label"], _num(results[key]["median"]), _num(results[key]["client_cpu_us_per_job"], 1),
             _num(results[key]["server_cpu_us_per_job"], 1)]
            for key in ("enqueue_single", "raw_insert_single", "enqueue_many_100", "enqueue_many_1000",
                        "enqueue_single_keyed", "enqueue_many_100_keyed", "raw_copy_100", "raw_unnest_100",
                        "lean_single", "lean_many_100", "pgqueuer_single", "pgqueuer_many_100")
            if key in results]
    targets = results["targets"]
    single, many = targets["enqueue_single_vs_raw"], targets["enqueue_many_100"]
    notes = [f"(a) / (b) = {single['ratio']:.2f} (target {single['target']}): {_met(single['met'])}; "
             f"(c) {many['jobs_per_s']:,.0f} jobs/s (target {many['target']}): {_met(many['met'])}."]
    peers = [(f"{label} = {targets[key]['ratio']:.2f} (target {targets[key]['target']}): {_met(targets[key]['met'])}")
             for key, label in (("enqueue_single_vs_lean", "(a) / (g)"), ("enqueue_many_100_vs_lean", "(c) / (h)"),
                                ("enqueue_single_vs_pgqueuer", "(a) / (i)"),
                                ("enqueue_many_100_vs_pgqueuer", "(c) / (j)"))
             if key in targets]
    if peers:
        notes.append("Issue 34's producer targets: " + "; ".join(peers) + ".")
    return ["measurement", "jobs/s", "client µs/job", "server µs/job"], rows, notes


def take_throughput(reports: Sequence[dict[str, Any]]) -> Table:
    (report,) = reports
    rows = []
    for workers, s in report["summary"].items():
        rounds = " / ".join(_num(x) for x in s["rounds_jobs_per_s"])
        rows.append([workers, _num(s["jobs_per_s"]), rounds, _num(s["worker_cpu_us_per_job"], 1),
                     _num(s["server_cpu_us_per_job"], 1), f"{100 * (s['machine_busy_fraction'] or 0):.0f} %",
                     _num(s["commits_per_job"], 3)])
    target = report["target"]
    notes = [f"Target {target['two_workers_jobs_per_s']:,.0f} jobs/s with 2 workers: {_met(target['met'])}."]
    return (["workers", "jobs/s", "rounds", "worker µs/job", "PG µs/job", "machine busy", "commits/job"],
            rows, notes)


def take_sync_client(reports: Sequence[dict[str, Any]]) -> Table:
    (report,) = reports
    rows = [[f"batch of {size}", _num(s["async_jobs_per_s"]), _num(s["sync_jobs_per_s"]), _pct(s["share"]),
             _num(s["async_client_cpu_us_per_job"], 1), _num(s["sync_client_cpu_us_per_job"], 1)]
            for size, s in report["summary"].items()]
    return (["enqueue", "async jobs/s", "sync jobs/s", "sync / async (target ≥ 90 %)", "async CPU µs/job",
             "sync CPU µs/job"], rows, [])


def take_otel(reports: Sequence[dict[str, Any]]) -> Table:
    (report,) = reports
    rows = [[mode, _num(s["jobs_per_s"]), _num(s["worker_cpu_us_per_job"]),
             _pct(s["slower_than_not_installed"], signed=True)] for mode, s in report["summary"].items()]
    notes = ["Target: the documented sampling set-up (parent-based, 10 %) at most 10 % slower than not installed; "
             "installed but not configured no different from not installed."]
    return ["mode", "jobs/s", "worker CPU µs/job", "slower than not installed"], rows, notes


def take_otel_overhead(reports: Sequence[dict[str, Any]]) -> Table:
    (report,) = reports
    counted = all("instructions" in r for r in report["results"].values())  # a run with --instructions
    rows = []
    for setup, r in report["results"].items():
        row = [setup, _num(r["bare_us"], 1), _num(r["taskq_us"], 1), f"{r['taskq_own_us']:+.1f}"]
        if counted:
            i = r["instructions"]
            own = f"{i['taskq_own']:+,.0f} ({i['taskq_own'] / i['bare']:+.0%})"
            row += [_num(i["bare"], 0), _num(i["taskq"], 0), own]
        rows.append(row)
    target = report["target"]
    notes = [f"Target: taskq's own work per traced job (all sampled) ≤ {target['taskq_own_us']:g} µs: "
             f"{_met(target['met'])}."]
    columns = ["set-up", "bare SDK span µs", "taskq consumer span µs", "taskq's own µs"]
    if counted:
        columns += ["bare SDK span, instructions", "taskq consumer span, instructions", "taskq's own, instructions"]
    return columns, rows, notes


def take_summary(reports: Sequence[dict[str, Any]]) -> Table:
    """Issue 34's one table: the drain at the defaults (defaults.py), the producers (enqueue.py) and the
    pickup at light load (latency.py), for taskq, PgQueuer and the lean loop, from three results files."""
    by_name = {r.get("benchmark"): r for r in reports}
    if set(by_name) != {"defaults", "enqueue", "latency"}:
        raise SystemExit("summary: give the results of defaults.py, enqueue.py and latency.py")
    drains, enq, lat = by_name["defaults"]["summary"], by_name["enqueue"]["results"], by_name["latency"]

    def drain(system: str, workers: int, what: str, case: str = "defaults") -> str:
        s = drains.get(f"{system}/{case}/{workers}")
        if s is None:
            return "-"
        if what == "cpu":
            return f"{s['pg_us_per_job']:.1f} / {s['py_us_per_job']:.1f}"
        if what == "wal":
            return _num(s.get("wal_bytes_per_job"))
        return _num(s[what], 3 if what == "commits_per_job" else 0)

    def produce(key: str) -> str:
        return _num(enq[key]["median"]) if key in enq else "-"

    def pickup(figures: dict[str, Any] | None) -> str:
        return "-" if figures is None else f"{figures['p50']:.2f} / {figures['p99']:.2f}"

    rows = []
    for label, system, single, many, picked in (
            ("taskq, no settings", "taskq", "enqueue_single", "enqueue_many_100",
             lat["results"]["enqueue_to_start_ms"]),
            ("PgQueuer 1.6, its defaults", "pgqueuer", "pgqueuer_single", "pgqueuer_many_100", None),
            ("lean psycopg loop", None, "lean_single", "lean_many_100", lat["lean"]["enqueue_to_start_ms"])):
        rows.append([label, *(drain(system, w, "jobs_per_s") if system else "-" for w in (1, 2)),
                     drain(system, 1, "cpu") if system else "-", drain(system, 1, "commits_per_job") if system else "-",
                     drain(system, 1, "wal") if system else "-", produce(single), produce(many), pickup(picked)])
        if system == "pgqueuer":  # awa-pg, when defaults.py ran it: its drains only (enqueue.py has no awa leg)
            for case, label in (("defaults", "200 handlers"), ("wide", "500 handlers")):
                if f"awa/{case}/1" in drains:
                    rows.append([f"awa-pg 0.6.9, {label} a process",
                                 *(drain("awa", w, "jobs_per_s", case) for w in (1, 2)), drain("awa", 1, "cpu", case),
                                 drain("awa", 1, "commits_per_job", case), drain("awa", 1, "wal", case), "-", "-", "-"])
        if system == "taskq" and "taskq/wide/1" in drains:  # the tuned drain (issue 34's target 2), when it ran
            rows.append(["taskq, --concurrency 500 --claim-batch-size 200",
                         *(drain(system, w, "jobs_per_s", "wide") for w in (1, 2)), drain(system, 1, "cpu", "wide"),
                         drain(system, 1, "commits_per_job", "wide"), drain(system, 1, "wal", "wide"), "-", "-", "-"])
    m, server = by_name["defaults"]["machine"], by_name["defaults"]["server"]
    notes = [f"Machine: {m.get('cpu_model') or 'CPU not recorded'}, {m['cpus']} CPUs; PostgreSQL {server['version']} "
             f"(synchronous_commit {server['synchronous_commit']}, fsync {server.get('fsync', '?')}, "
             f"shared_buffers {server.get('shared_buffers', '?')}). "
             f"Drains of {by_name['defaults']['params']['jobs']:,} no-op jobs (defaults.py), producers (enqueue.py), "
             "pickup at "
             f"{lat['params']['rate']:g} jobs/s (latency.py): three runs of one session, each system in the same run."]
    return (["system", "drain, 1 worker (jobs/s)", "drain, 2 workers (jobs/s)", "PG / Python µs per job (1 worker)",
             "commits per job", "WAL bytes per job", "enqueue, 1 job/commit (jobs/s)", "enqueue_many(100) (jobs/s)",
             "pickup p50 / p99 (ms)"], rows, notes)


WORKFLOW_FIGURES: tuple[tuple[str, str, float | None], ...] = (
    ("terminal_tx_ms", "fan-out: the parent's terminal transaction (ms)", 200.0),
    ("fanout_settled_in_parent_tx", "fan-out: children settled in that transaction", None),
    ("commit_to_claimable_ms", "fan-out: its commit → every child pending, 1 worker (ms)", 1000.0),
    ("fanin_last_batch_tx_ms", "fan-in: the last finish batch's transaction (ms)", None),
    ("fanin_commit_to_claimable_ms", "fan-in: the last parent's commit → child pending (ms)", 100.0),
    ("last_parent_to_child_started_ms", "fan-in, 1 worker: the last parent's finish → child started (ms)", None),
    ("link_p50_ms", "chain: per-link latency p50 (ms)", None),
    ("link_p99_ms", "chain: per-link latency p99 (ms)", None),
    ("link_max_ms", "chain: per-link latency max (ms)", None),
)


def take_workflows(reports: Sequence[dict[str, Any]]) -> Table:
    (report,) = reports
    rows = []
    for key, label, target in WORKFLOW_FIGURES:
        if key not in report["medians"]:
            continue
        median = report["medians"][key]
        verdict = "-" if target is None else f"≤ {target:,.0f}: {_met(median <= target)}"
        decimals = 0 if key == "fanout_settled_in_parent_tx" else 1
        rounds = " / ".join(_num(r[key], decimals) for r in report["rounds"])
        rows.append([label, rounds, _num(median, decimals), verdict])
    p = report["params"]
    notes = [f"Fan-out of {p['fan_out']:,} children, fan-in of {p['fan_in']:,} parents in finish batches of "
             f"{p['fan_in_batch']}, a chain of {p['chain']:,} jobs."]
    return ["figure", "rounds", "median", "target"], rows, notes


def take_unique(reports: Sequence[dict[str, Any]]) -> Table:
    by_mode = {r["params"]["synchronous_commit"]: r["results"] for r in reports}
    if set(by_mode) != {"on", "off"}:
        raise SystemExit("unique: give two results files, one run with --synchronous-commit on and one with off")
    on, off = by_mode["on"], by_mode["off"]
    rows = []
    for key, r in on.items():
        if key == "targets":
            continue
        o = off[key]
        cpu = f"{o['client_cpu_us_per_job']:.1f} + {o['server_cpu_us_per_job']:.1f}"
        rows.append([r["label"], _num(r["median"]), _num(o["median"]), cpu])
    notes = [f"{on[key]['label']}: {_pct(t['slowdown'], signed=True)} slower than its reference with sync on, "
             f"{_pct(off['targets'][key]['slowdown'], signed=True)} with sync off (target {t['target']})."
             for key, t in on["targets"].items()]
    return (["measurement", "jobs/s (sync on)", "jobs/s (sync off)", "CPU µs/job, client + server (sync off)"],
            rows, notes)


IMPORTERS: dict[str, Callable[[Sequence[dict[str, Any]]], Table]] = {
    "cancel_latency": take_cancel_latency,
    "enqueue": take_enqueue,
    "heartbeat": take_heartbeat,
    "latency": take_latency,
    "otel": take_otel,
    "otel_overhead": take_otel_overhead,
    "shutdown": take_shutdown,
    "summary": take_summary,
    "sync_client": take_sync_client,
    "throughput": take_throughput,
    "unique": take_unique,
    "workflows": take_workflows,
}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=BENCH_DIR, check=True, capture_output=True, text=True).stdout.strip()


def checkout_commit() -> str:
    commit = _git("rev-parse", "--short", "HEAD")
    return f"{commit}-dirty" if _git("status", "--porcelain", "--untracked-files=no") else commit


def describe_machine(report: dict[str, Any], machine: str | None) -> str:
    m = report.get("machine", {})
    facts = [f"{m['cpus']} CPUs"] if m.get("cpus") else []
    if m.get("loadavg"):
        facts.append(f"load average {m['loadavg'][0]:g} at the start")
    server = report.get("server") or {}
    if server.get("version"):
        facts.append(f"PostgreSQL {server['version']}")
    text = ", ".join(facts)
    return f"{machine} ({text})" if machine else text


def take(name: str, paths: Sequence[Path], machine: str | None, command: str | None) -> Path:
    if name not in IMPORTERS:
        known = ", ".join(sorted(IMPORTERS))
        raise SystemExit(f"no importer for {name!r} (these have one: {known}); edit benchmarks/current/{name}.json "
                         "by hand instead")
    reports = [json.loads(path.read_text()) for path in paths]
    columns, rows, notes = IMPORTERS[name](reports)
    first = reports[0]
    target = CURRENT_DIR / f"{name}.json"
    script = json.loads(target.read_text())["script"] if target.exists() else f"{name}.py"
    current = {
        "script": script,
        "provenance": {
            "date": str(first.get("when", ""))[:10] or None,
            "machine": describe_machine(first, machine),
            "commit": checkout_commit(),
            "command": command or f"python benchmarks/{script}",
            "params": [r.get("params") for r in reports],
            "transcribed": False,
            "source": None,
        },
        "columns": columns,
        "rows": rows,
        "notes": notes,
    }
    CURRENT_DIR.mkdir(exist_ok=True)
    target.write_text(json.dumps(current, indent=2, ensure_ascii=False) + "\n")
    return target


# -- the command line --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the README is stale")
    parser.add_argument("--take", nargs="+", metavar=("NAME", "RESULTS"),
                        help="make benchmarks/results/*.json the current figures of NAME, then rewrite")
    parser.add_argument("--machine", help="with --take: what the machine was (CPU, VM, what else ran)")
    parser.add_argument("--command", help="with --take: the command that was run")
    parser.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)
    if args.take:
        if len(args.take) < 2:
            parser.error("--take needs a NAME and at least one results file")
        print(f"wrote {take(args.take[0], [Path(p) for p in args.take[1:]], args.machine, args.command)}")
    text = args.readme.read_text()
    new, problems = rewrite(text, load_current())
    for problem in problems:
        print(f"report: {problem}", file=sys.stderr)
    if args.check:
        if new != text:
            print(f"report: {args.readme} is stale: run python benchmarks/report.py", file=sys.stderr)
            return 1
        return 1 if problems else 0
    if new != text:
        args.readme.write_text(new)
        print(f"rewrote the tables of {args.readme}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
