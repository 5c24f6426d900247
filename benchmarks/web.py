"""The web API and dashboard: list and detail latency at a million jobs, and what open dashboards cost a drain.

    python benchmarks/web.py [--dsn DSN] [--jobs 1000000] [--requests 200] [--drain-jobs 30000]
                             [--rounds 2] [--dashboards 3] [--skip-latency] [--skip-drain] [--json out.json]

Latency: a table of `--jobs` jobs (mostly succeeded, some failed, cancelled, pending and running, in ten
queues, each with a timeline event and an attempts row) is written with generate_series and analyzed;
then a real `taskq web` process answers `--requests` requests of each kind, over HTTP from this process
(one at a time): the first page of the jobs list, a later page (cursor), the list filtered by status,
by queue and by tag, and the detail of a random job. p50 and p95 per kind, in milliseconds, end to end.

Drain: benchmarks/throughput.py's round (a backlog of `--drain-jobs` no-op jobs, two worker processes)
with 0 and with `--dashboards` open dashboards, interleaved over `--rounds` (the side that goes first
alternates). An open dashboard is what a browser tab does: its page's live region re-fetched every poll
interval (2 s); the three are the overview, a job's detail and the cancellations page, each over its own
session. Per side: jobs/s, the web process's CPU per drained job, the workers' and PostgreSQL's CPU per
job, and the 1-minute load average at each round's start; the CPU cost is the extra web + PostgreSQL CPU
per job with the dashboards open, as a share of all CPU per job with none (noise moves it much less
than jobs/s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
from _common import (
    DSN_HELP,
    RESULTS_DIR,
    ServerCpu,
    announce,
    bench_database,
    cpu_seconds,
    header,
    machine,
    percentile,
    print_table,
    server_facts,
    write_report,
)
from throughput import APP, run_round

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from testkit import WebServer

from taskq.backend import Backend
from taskq.ops.tokens import create_token

FILL_SQL = """
INSERT INTO taskq.jobs (id, actor, queue, payload, status, tags, created_at, scheduled_at, started_at, finished_at,
                        worker_id, lock_expires_at, attempt, claim_epoch, cancel_requested_at)
SELECT gen_random_uuid(), 'actor.' || (i %% 20), 'q' || (i %% 10), jsonb_build_object('n', i), s.status,
       CASE WHEN i %% 10000 = 0 THEN '{rare}'::text[] ELSE '{}'::text[] END,
       now() - (%(n)s - i) * interval '10 ms', now() - (%(n)s - i) * interval '10 ms',
       CASE WHEN s.status NOT IN ('pending') THEN now() - (%(n)s - i) * interval '10 ms' END,
       CASE WHEN s.status NOT IN ('pending', 'running') THEN now() - (%(n)s - i) * interval '10 ms' END,
       CASE WHEN s.status = 'running' THEN 'w1' END, CASE WHEN s.status = 'running' THEN now() + interval '1 h' END,
       CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END, CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN s.status = 'cancelled' THEN now() END
FROM generate_series(%(lo)s, %(hi)s) AS i
CROSS JOIN LATERAL (SELECT CASE WHEN i > %(n)s - 5000 THEN 'pending' WHEN i > %(n)s - 5200 THEN 'running'
                                WHEN i %% 40 = 0 THEN 'failed' WHEN i %% 97 = 0 THEN 'cancelled'
                                ELSE 'succeeded' END AS status) AS s
"""


def fill(dsn: str, n: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for lo in range(1, n + 1, 200_000):
            conn.execute(FILL_SQL, {"n": n, "lo": lo, "hi": min(n, lo + 199_999)})
        conn.execute("INSERT INTO taskq.job_events (job_id, kind, from_status, to_status) "
                     "SELECT id, 'state_change', 'pending', status FROM taskq.jobs WHERE status <> 'pending'")
        conn.execute("INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id) "
                     "SELECT id, 1, 1, 'w1' FROM taskq.jobs WHERE attempt = 1")
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


async def admin_token(dsn: str, name: str) -> str:
    backend = await Backend.open(dsn)
    try:
        return (await create_token(backend, name, ["*@*"]))[1]
    finally:
        await backend.close()


def latency(dsn: str, requests: int) -> dict[str, dict[str, float]]:
    token = asyncio.run(admin_token(dsn, "bench"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [str(r[0]) for r in conn.execute("SELECT id FROM taskq.jobs TABLESAMPLE SYSTEM (1) LIMIT 5000")]
    web = WebServer(dsn, log_path=RESULTS_DIR / "logs" / "web-latency.log")
    kinds: dict[str, Any] = {
        "jobs list, first page": lambda c, rnd: c.get("/jobs"),
        "jobs list, later page": None,
        "jobs list by status=failed": lambda c, rnd: c.get("/jobs", params={"status": "failed"}),
        "jobs list by queue": lambda c, rnd: c.get("/jobs", params={"queue": f"q{rnd.randrange(10)}"}),
        "jobs list by tag (rare)": lambda c, rnd: c.get("/jobs", params={"tag": "rare"}),
        "job detail": lambda c, rnd: c.get(f"/jobs/{rnd.choice(ids)}"),
    }
    out: dict[str, dict[str, float]] = {}
    rnd = random.Random(20)
    try:
        with httpx.Client(base_url=web.url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as c:
            cursors: list[str] = []
            page = c.get("/jobs", params={"limit": 50}).json()
            while len(cursors) < 50 and page["next_cursor"]:
                cursors.append(page["next_cursor"])
                page = c.get("/jobs", params={"limit": 50, "cursor": page["next_cursor"]}).json()
            kinds["jobs list, later page"] = lambda c, rnd: c.get("/jobs", params={"cursor": rnd.choice(cursors)})
            for name, call in kinds.items():
                for _ in range(10):  # warm the server's caches and connections
                    call(c, rnd).raise_for_status()
                times = []
                for _ in range(requests):
                    started = time.perf_counter()
                    call(c, rnd).raise_for_status()
                    times.append((time.perf_counter() - started) * 1000)
                out[name] = {"p50_ms": percentile(times, 50), "p95_ms": percentile(times, 95),
                             "max_ms": max(times), "requests": requests}
    finally:
        web.stop()
    return out


DETAIL = "<a job's detail>"


class Dashboards:
    """`n` open dashboards: each re-fetches its page every `poll` seconds over its own session."""

    def __init__(self, url: str, token: str, pages: list[str], poll: float = 2.0) -> None:
        self.stop = threading.Event()
        self.fetches = 0
        self.errors: list[BaseException] = []
        self.job: str | None = None
        self.threads = [threading.Thread(target=self._run, args=(url, token, p, poll), daemon=True) for p in pages]

    def _run(self, url: str, token: str, page: str, poll: float) -> None:
        try:
            with httpx.Client(base_url=url, timeout=60, follow_redirects=True) as c:
                c.post("/login", data={"token": token}).raise_for_status()
                while not self.stop.is_set():
                    r = self._detail(c, token) if page == DETAIL else c.get(page)
                    r.raise_for_status()
                    assert "<h1>" in r.text and "Log in" not in r.text, r.text[:200]
                    self.fetches += 1
                    self.stop.wait(poll)
        except BaseException as exc:
            self.errors.append(exc)
            raise

    def _detail(self, c: httpx.Client, token: str) -> httpx.Response:
        """A tab open on a job's detail. Each drain round replaces the table's jobs, so when its job is
        gone (404) it opens the newest one, as a user would (the jobs list while there is none)."""
        r = c.get(f"/jobs/{self.job}") if self.job else None
        if r is None or r.status_code == 404:
            found = c.get("/api/v1/jobs", params={"limit": 1}, headers={"Authorization": f"Bearer {token}"}).json()
            self.job = found["jobs"][0]["id"] if found["jobs"] else None
            r = c.get(f"/jobs/{self.job}" if self.job else "/jobs")
        return r

    def __enter__(self) -> Dashboards:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        if self.errors:
            raise RuntimeError(f"an open dashboard failed: {self.errors[0]!r}")


def drain(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    server = ServerCpu(dsn)
    token = asyncio.run(admin_token(dsn, "drain"))
    (RESULTS_DIR / "logs").mkdir(parents=True, exist_ok=True)
    web = WebServer(dsn, log_path=RESULTS_DIR / "logs" / "web-drain.log")
    ns = argparse.Namespace(jobs=args.drain_jobs, enqueue_batch=5000, concurrency=500, claim_batch_size=200, app=APP,
                            timeout=300.0, py_spy=False)
    sides = (0, args.dashboards)
    rates: dict[int, list[float]] = {n: [] for n in sides}
    fetched: list[int] = []
    web_cpu: dict[int, list[float]] = {n: [] for n in sides}
    per_job: dict[int, dict[str, list[float]]] = {n: {"web": [], "worker": [], "server": []} for n in sides}
    loads: dict[int, list[float]] = {n: [] for n in sides}
    try:
        for r in range(args.rounds):
            for n in sides if r % 2 == 0 else sides[::-1]:  # alternate which side goes first
                pages = (["/", DETAIL, "/cancellations"] * args.dashboards)[:n]
                loads[n].append(os.getloadavg()[0])
                cpu_before = cpu_seconds(web.proc.pid) or 0.0
                with Dashboards(web.url, token, pages) as boards:
                    result = run_round(dsn, ns, 2, server, f"web-{n}-{r}")
                web_s = (cpu_seconds(web.proc.pid) or 0.0) - cpu_before
                # the web process's CPU per second of the drain (its share of the 2 cores), and per job
                web_cpu[n].append(web_s / float(result["drain_s"]))
                per_job[n]["web"].append(1e6 * web_s / args.drain_jobs)
                per_job[n]["worker"].append(float(result["worker_cpu_us_per_job"]))
                per_job[n]["server"].append(float(result["server_cpu_us_per_job"]))
                if n:
                    fetched.append(boards.fetches)
                rates[n].append(float(result["jobs_per_s"]))
                print(f"round {r + 1}: {n} dashboards: {result['jobs_per_s']:,.0f} jobs/s, web "
                      f"{per_job[n]['web'][-1]:.2f} µs/job, PG {per_job[n]['server'][-1]:.1f} µs/job, load "
                      f"{loads[n][-1]:.1f}", flush=True)
    finally:
        web.stop()
    base, loaded = statistics.median(rates[0]), statistics.median(rates[args.dashboards])
    med = {str(n): {k: statistics.median(v) for k, v in per_job[n].items()} for n in sides}
    return {"rates": {str(k): v for k, v in rates.items()}, "median_0": base, "median_loaded": loaded,
            "cost_pct": 100.0 * (base - loaded) / base, "dashboard_fetches": fetched,
            "web_cores": {str(k): statistics.median(v) for k, v in web_cpu.items()},
            "us_per_job": {str(n): per_job[n] for n in sides}, "us_per_job_median": med,
            "loadavg_1m": {str(n): loads[n] for n in sides},
            "cpu_cost_pct": 100.0 * ((med[str(args.dashboards)]["web"] + med[str(args.dashboards)]["server"])
                                     - (med["0"]["web"] + med["0"]["server"]))
                            / (med["0"]["worker"] + med["0"]["server"] + med["0"]["web"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--drain-jobs", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dashboards", type=int, default=3)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "web.json")
    args = parser.parse_args()
    info = machine()
    params = {k: v for k, v in vars(args).items() if k not in ("dsn", "json")}
    report: dict[str, Any] = {}
    if not args.skip_latency:
        with bench_database(args.dsn, "web") as dsn:
            server = server_facts(dsn)
            announce("web", params, info, server)
            seconds = fill(dsn, args.jobs)
            print(f"filled {args.jobs:,} jobs in {seconds:.0f} s", flush=True)
            report["latency"] = latency(dsn, args.requests)
        print_table(("request", "p50 ms", "p95 ms", "max ms"),
                    [(k, v["p50_ms"], v["p95_ms"], v["max_ms"]) for k, v in report["latency"].items()])
    if not args.skip_drain:
        with bench_database(args.dsn, "webdrain") as dsn:
            server = server_facts(dsn)
            report["drain"] = drain(dsn, args)
        d = report["drain"]
        m = d["us_per_job_median"]
        print_table(("open dashboards", "drain jobs/s (median)", "rounds", "web µs/job", "worker µs/job",
                     "PG µs/job", "load (1 min) per round"),
                    [(n, d["median_0"] if n == 0 else d["median_loaded"], d["rates"][str(n)], m[str(n)]["web"],
                      m[str(n)]["worker"], m[str(n)]["server"], d["loadavg_1m"][str(n)])
                     for n in (0, args.dashboards)])
        print(f"CPU cost of {args.dashboards} open dashboards (web + PG µs/job, against all CPU per job with none "
              f"open): {d['cpu_cost_pct']:.2f} %")
        print(f"cost of {args.dashboards} open dashboards: {d['cost_pct']:.1f} % of drain throughput (median of the "
              f"rounds); the web process used {d['web_cores'][str(args.dashboards)]:.3f} cores meanwhile "
              f"({d['web_cores']['0']:.3f} with none open)")
    path = write_report("web", header("web", params, info, report.get("server", {})) | report, args.json)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
