"""Any benchmark script, before and after, in one run: the script of each checkout under that checkout's
interpreter, in turn, round by round, and every figure of the JSON it writes paired with the first
checkout's figure of the same round.

    python benchmarks/ab.py --checkout before=/work/base:/work/venv-base --checkout after=.:/work/venv \
        [--rounds 3] [--figures REGEX] [--json out.json] -- fairness.py --jobs 4000 --workers 1

Each run is the script as that checkout has it (`ROOT/benchmarks/SCRIPT`), started from ROOT with
`VENV/bin/python`, so its workers, its database (created and migrated by that checkout's taskq) and its own
measuring are the checkout's; the arguments after `--` go to every run, and `--json` to a file of the run's
own. `--script-from ROOT` runs that checkout's copy of the script under every interpreter instead (an older
copy may be broken against its own taskq, or lack a flag). The order of the checkouts alternates from
round to round (before, after; after, before; ...), so that neither always runs on a cooler or a warmer
machine. On these VMs the speed drifts by up to 1.4-2x within a run: a figure's ratio is taken within
each round, where both sides ran minutes apart at most.

A figure is any number in the script's JSON, named by its path (`results[0 backlog 1:1].jobs_per_s`: a list
element is named by its text fields, with its index where they do not name it alone), the run's header
(params, machine, server) left out. `--figures` keeps the paths a regular expression finds; each known
script has a default (FIGURES). Printed and written per figure: each checkout's median over the rounds,
and the median, lowest and highest of the rounds' ratios to the first checkout.

What a change to the hot path must show for the capabilities' own benchmarks (fairness.py, durable.py,
workflows.py, unique.py, queue_control.py): their figures within a few percent of before, in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR, checkout_spec, machine, print_table, write_report

HEADER = {"benchmark", "when", "params", "machine", "machine_after", "load_warning", "server", "command"}

FIGURES = {
    "fairness.py": r"jobs_per_s|max_deviation|b_last_start_after_enqueue",
    "durable.py": r"jobs_per_s|us_per_job|p50_ms|p99_ms",
    "workflows.py": r"^medians\.",
    "unique.py": r"\.(median|client_cpu_us_per_job|server_cpu_us_per_job)$",
    "queue_control.py": r"jobs_per_s|p50|p99",
}
"""The figures worth a row, per known script (its rounds' raw lists and counts are left out)."""


def figures(report: Any, path: str = "") -> dict[str, float]:
    """Every number in a results JSON by its path, the header left out. A list element that is an object is
    named by its index and its text fields, so that a row reads as what it measured."""
    found: dict[str, float] = {}
    if isinstance(report, dict):
        for key, value in report.items():
            if not path and key in HEADER:
                continue
            found |= figures(value, f"{path}.{key}" if path else str(key))
    elif isinstance(report, list):
        names = [" ".join(str(v) for v in value.values() if isinstance(v, str)) if isinstance(value, dict) else ""
                 for value in report]
        for i, (value, name) in enumerate(zip(report, names, strict=True)):
            # by its text when that names it alone (rows whose order may differ between checkouts), else by index
            label = name if name and names.count(name) == 1 else " ".join(filter(None, (str(i), name)))
            found |= figures(value, f"{path}[{label}]")
    elif isinstance(report, (int, float)) and not isinstance(report, bool):
        found[path] = float(report)
    return found


def parse_checkouts(specs: list[str], parser: argparse.ArgumentParser) -> list[tuple[str, Path, Path]]:
    checkouts: list[tuple[str, Path, Path]] = []
    for spec in specs:
        parsed = checkout_spec(spec)
        if parsed is None or parsed[0] in [c[0] for c in checkouts]:
            parser.error(f"--checkout {spec!r}: expected a new NAME=ROOT:VENV")
        name, root, venv = parsed
        python = venv / "bin" / "python"
        if not python.exists():
            parser.error(f"--checkout {spec!r}: no {python}")
        checkouts.append((name, root.resolve(), python))
    if len(checkouts) < 2:
        parser.error("give two --checkout (or more): the first is what the others are compared with")
    return checkouts


def run_once(root: Path, script_root: Path, python: Path, script: str, args: list[str], out: Path,
             log: Path) -> dict[str, Any]:
    """One run of SCRIPT_ROOT's copy of the script from ROOT (whose workers it starts); its JSON report."""
    command = [str(python), str(script_root / "benchmarks" / script), *args, "--json", str(out)]
    with open(log, "ab") as sink:
        sink.write(f"\n$ {' '.join(command)}\n".encode())
        sink.flush()
        done = subprocess.run(command, cwd=root, stdout=sink, stderr=subprocess.STDOUT,
                              env=os.environ | {"PYTHONUNBUFFERED": "1"}, check=False)
    if done.returncode != 0:
        raise SystemExit(f"ab: {script} of {root} exited with {done.returncode}; its output is in {log}")
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def compare(rounds: list[dict[str, dict[str, float]]], names: list[str], keep: re.Pattern[str]) -> dict[str, Any]:
    """Per figure: each checkout's median, and the round-by-round ratios of the others to the first."""
    first = names[0]
    paths = sorted({p for r in rounds for side in r.values() for p in side if keep.search(p)})
    out: dict[str, Any] = {}
    for path in paths:
        row: dict[str, Any] = {}
        for name in names:
            values = [r[name][path] for r in rounds if path in r[name]]
            row[name] = statistics.median(values) if values else None
        for name in names[1:]:
            ratios = [r[name][path] / r[first][path] for r in rounds
                      if path in r[name] and r[first].get(path)]
            if ratios:
                row[f"{name}/{first}"] = {"median": statistics.median(ratios), "low": min(ratios),
                                          "high": max(ratios), "ratios": ratios}
        out[path] = row
    return out


def main() -> None:
    usage = "%(prog)s --checkout NAME=ROOT:VENV --checkout ... [options] -- SCRIPT [ARGS]"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage=usage)
    parser.add_argument("--checkout", action="append", default=[], metavar="NAME=ROOT:VENV",
                        help="a checkout and its virtualenv; the first is the reference (repeatable)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each checkout, alternating")
    parser.add_argument("--figures", default=None, help="a regular expression over the figures' paths")
    parser.add_argument("--json", type=Path, default=None, help="where to write results (benchmarks/results/)")
    parser.add_argument("--script-from", type=Path, default=None, metavar="ROOT",
                        help="run this checkout's copy of the script under every checkout's interpreter")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]: the benchmark, its arguments")
    args = parser.parse_args()
    command = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not command:
        parser.error("name the benchmark script after --, e.g. -- fairness.py --jobs 4000")
    script, script_args = Path(command[0]).name, command[1:]
    if "--json" in script_args:
        parser.error("leave --json out of the script's arguments: each run writes its own")
    checkouts = parse_checkouts(args.checkout, parser)
    script_from = args.script_from.resolve() if args.script_from is not None else None
    for root in [script_from] if script_from is not None else [c[1] for c in checkouts]:
        if not (root / "benchmarks" / script).exists():
            parser.error(f"{root} has no benchmarks/{script}")
    try:
        keep = re.compile(args.figures or FIGURES.get(script, "."))
    except re.error as exc:
        parser.error(f"--figures: {exc}")
    names = [c[0] for c in checkouts]
    info = machine()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    log = RESULTS_DIR / "logs" / f"ab-{Path(script).stem}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"ab: {script} {' '.join(script_args)}; {args.rounds} rounds of {', '.join(names)}; output in {log}",
          flush=True)
    rounds: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for rnd in range(args.rounds):
            order = checkouts if rnd % 2 == 0 else checkouts[::-1]
            seen: dict[str, dict[str, float]] = {}
            for name, root, python in order:
                started = time.monotonic()
                report = run_once(root, script_from or root, python, script, script_args,
                                  Path(scratch) / f"{name}-{rnd}.json", log)
                seen[name] = figures(report)
                print(f"  round {rnd + 1}, {name}: {time.monotonic() - started:.0f} s", flush=True)
            rounds.append(seen)
    table = compare(rounds, names, keep)
    others = names[1:]
    print_table(["figure", *names, *(f"{o}/{names[0]} median (low-high)" for o in others)],
                [[path, *(row[n] if row[n] is not None else "-" for n in names),
                  *(f"{row[f'{o}/{names[0]}']['median']:.3f} ({row[f'{o}/{names[0]}']['low']:.3f}-"
                    f"{row[f'{o}/{names[0]}']['high']:.3f})" if f"{o}/{names[0]}" in row else "-" for o in others)]
                 for path, row in table.items()])
    report = {"benchmark": "ab", "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": info,
              "machine_after": machine(), "script": script, "args": script_args, "rounds": args.rounds,
              "checkouts": {n: {"root": str(r), "python": str(p)} for n, r, p in checkouts},
              "script_from": None if script_from is None else str(script_from),
              "figures": table, "runs": rounds}
    print(f"wrote {write_report(f'ab-{Path(script).stem}', report, args.json)}")


if __name__ == "__main__":
    main()
