"""What the dependency triggers cost a job without dependents: the same UPDATEs of taskq.jobs with the
triggers enabled and disabled, interleaved, in one database.

    python benchmarks/settle_triggers.py [--dsn DSN] [--jobs 20000] [--batch 200] [--rounds 6]
                                         [--json out.json]

Each round inserts `--jobs` pending rows and drives them through two UPDATEs per batch of `--batch` rows
(pending -> running -> succeeded: the shape of a claim batch and a finish batch), once with every
trigger of migration 11 enabled (jobs_note_settled, jobs_settle_dependents) and once with both
disabled (ALTER TABLE ... DISABLE TRIGGER). The figure is the PostgreSQL backend's CPU per job, read
from /proc (so the server must run on this machine, as the embedded one does); wall time per job is
printed too. Medians of the rounds are reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    DSN_HELP,
    RESULTS_DIR,
    announce,
    bench_database,
    header,
    machine,
    print_table,
    server_facts,
    write_report,
)

TRIGGERS = ("jobs_note_settled", "jobs_settle_dependents")


def backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(conn: psycopg.Connection[Any], jobs: int, batch: int, enabled: bool) -> tuple[float, float]:
    conn.execute("TRUNCATE taskq.jobs, taskq.job_events")
    conn.execute("INSERT INTO taskq.jobs (actor, payload) SELECT 'bench.noop', to_jsonb(g) "
                 "FROM generate_series(1, %s) AS g", (jobs,))
    conn.execute("VACUUM ANALYZE taskq.jobs")
    for name in TRIGGERS:
        conn.execute(f"ALTER TABLE taskq.jobs {'ENABLE' if enabled else 'DISABLE'} TRIGGER {name}")
    ids = [r[0] for r in conn.execute("SELECT id FROM taskq.jobs ORDER BY id")]
    pid = conn.info.backend_pid
    cpu0, wall0 = backend_cpu_s(pid), time.perf_counter()
    for i in range(0, jobs, batch):
        chunk = ids[i:i + batch]
        conn.execute("UPDATE taskq.jobs SET status = 'running', attempt = attempt + 1, started_at = now(), "
                     "lock_expires_at = now() + interval '1 minute', worker_id = 'bench', revision = revision + 1 "
                     "WHERE id = ANY(%s)", (chunk,))
        conn.execute("UPDATE taskq.jobs SET status = 'succeeded', finished_at = now(), result = 'null', "
                     "revision = revision + 1 WHERE id = ANY(%s)", (chunk,))
    return (backend_cpu_s(pid) - cpu0) / jobs * 1e6, (time.perf_counter() - wall0) / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=200, help="rows per UPDATE")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "settle_triggers.json")
    args = parser.parse_args()
    params = {"jobs": args.jobs, "batch": args.batch, "rounds": args.rounds}
    info = machine()
    figures: dict[str, list[tuple[float, float]]] = {"enabled": [], "disabled": []}
    with bench_database(args.dsn, "settle_triggers") as dsn:
        server = server_facts(dsn)
        announce("settle_triggers", params, info, server)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(args.rounds):
                for enabled in (True, False):
                    cpu, wall = one_round(conn, args.jobs, args.batch, enabled)
                    key = "enabled" if enabled else "disabled"
                    figures[key].append((cpu, wall))
                    print(f"round {i + 1}, triggers {key}: backend CPU {cpu:.1f} µs/job, wall {wall:.1f} µs/job",
                          flush=True)
    medians = {k: {"cpu_us_per_job": statistics.median(c for c, _ in v),
                   "wall_us_per_job": statistics.median(w for _, w in v)} for k, v in figures.items()}
    print_table(("triggers", "backend CPU µs/job (median)", "wall µs/job (median)"),
                [(k, f"{m['cpu_us_per_job']:.1f}", f"{m['wall_us_per_job']:.1f}") for k, m in medians.items()])
    report: dict[str, Any] = header("settle_triggers", params, info, server) | {"rounds": figures, "medians": medians}
    print(f"wrote {write_report('settle_triggers', report, args.json)}")


if __name__ == "__main__":
    main()
