"""The dashboard in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`, which
.ci/run installs) driven by Selenium with the system driver, against a real `taskq web` process, a real
worker process and a real database. Log in, filter the jobs, open one, cancel it and watch its timeline
update without a reload, and see its dependent job's edge; pause a schedule and a queue; log out and
find the old session cookie refused; take a
screenshot of every page (into $TASKQ_WEB_SCREENSHOTS when set, e.g. docs/web, else the test's tmp dir)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait
from testkit import WebServer, query, wait_until

from taskq import SyncJobsClient

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    assert Path(CHROMEDRIVER).exists() and Path(CHROMIUM).exists(), (
        "the browser tests need Debian's chromium and chromium-driver: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1400,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Callable[[WebDriver, str], Path]:
    folder = Path(os.environ.get("TASKQ_WEB_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)

    def shot(driver: WebDriver, name: str) -> Path:
        path = folder / f"{name}.png"
        assert driver.save_screenshot(str(path)), f"no screenshot of {name}"
        assert path.stat().st_size > 5000, f"screenshot {name} is empty"
        return path

    return shot


def taskq_token(dsn: str, name: str, *grants: str) -> str:
    import subprocess
    import sys

    args = [sys.executable, "-m", "taskq.cli", "--dsn", dsn, "tokens", "create", name]
    for g in grants:
        args += ["--grant", g]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def enqueue(dsn: str, actor: str, payload: Any, queue: str = "default", tags: tuple[str, ...] = ()) -> UUID:
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, queue, payload, tags) VALUES (%s, %s, %s::jsonb, %s)"
                        " RETURNING id", actor, queue, json.dumps(payload), list(tags))
    query(dsn, "SELECT pg_notify('taskq_jobs', %s)", queue)
    return UUID(str(row[0]))


def click(element: Any) -> bool:
    element.click()
    return True


def type_into(element: Any, text: str) -> bool:
    element.send_keys(text)
    return True


def waiting(driver: WebDriver, timeout: float) -> WebDriverWait[WebDriver]:
    """A wait that reads again when the page's polling swapped the element out between finding it and
    reading it (a stale element reference is a moment of the live page, not a failure)."""
    return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,))


def wait_css(driver: WebDriver, css: str, timeout: float = 20) -> Any:
    return WebDriverWait(driver, timeout).until(lambda d: d.find_elements(By.CSS_SELECTOR, css) or False)[0]


def live_text(
    driver: WebDriver, css: str, ready: Callable[[str], bool] = lambda text: True, timeout: float = 20
) -> str:
    """The text of an element of a page's live region, which the page's polling swaps out at any moment
    (between finding the element and reading it, too): read again until it is read whole and `ready`.
    After `timeout`, the last text read, for the caller's assertion to show."""
    texts: list[str] = []

    def read(d: WebDriver) -> bool:
        texts.append(d.find_element(By.CSS_SELECTOR, css).text)
        return ready(texts[-1])

    try:
        waiting(driver, timeout).until(read)
    except TimeoutException:
        if not texts:
            raise
    return texts[-1]


def test_dashboard_in_a_real_browser(
    dsn: str, tmp_path: Path, spawn_worker: Any, browser: WebDriver, shots: Callable[[WebDriver, str], Path]
) -> None:
    token = taskq_token(dsn, "operator", "*@*")
    query(dsn, "INSERT INTO taskq.schedules (name, actor, queue, every_seconds, definition, next_run_at, owner)"
               " VALUES ('nightly-report', 'test.noop', 'reports', 86400, 'every 86400s',"
               " now() + interval '9 h', 'app')")
    worker = spawn_worker(cancellation_grace_period=60, cleanup_grace_period=5, concurrency=4)
    worker.worker_id()
    for n in range(3):
        enqueue(dsn, "test.noop", n, queue="default")
    for n in range(4):
        enqueue(dsn, "test.report", {"n": n}, queue="billing-eu", tags=("tenant-a",))
    target = enqueue(dsn, "test.sleep", {"seconds": 120}, queue="default", tags=("demo",))
    stubborn = enqueue(dsn, "test.sleep", {"seconds": 120, "cooperative": False}, queue="default")
    wait_until(lambda: query(dsn, "SELECT count(*) FROM taskq.jobs WHERE id IN (%s, %s) AND status = 'running'",
                             target, stubborn)[0][0] == 2, timeout=30)
    with SyncJobsClient.connect(dsn) as client:  # waits on the job the test cancels (a cascade cancels it)
        follower = client.enqueue("test.noop", "after", depends_on=[target], queue="default").job_id
    web = WebServer(dsn, "--poll-interval", "0.5", "--cancellation-grace-period", "60", "--cleanup-grace-period",
                    "5", log_path=tmp_path / "web.log")
    try:
        b = browser
        # log in (a page without a session goes to the login page)
        b.get(web.url + "/jobs")
        wait_css(b, "#token")
        shots(b, "login")
        b.find_element(By.ID, "token").send_keys("tq_wrong")
        b.find_element(By.ID, "login").click()
        assert "unknown or revoked token" in wait_css(b, "#login-error").text
        b.find_element(By.ID, "token").send_keys(token)
        b.find_element(By.ID, "login").click()
        wait_css(b, "#jobs")
        cookie = b.get_cookie("taskq_session")
        assert cookie is not None and cookie["sameSite"] == "Strict" and cookie["httpOnly"] is True

        b.get(web.url + "/")
        wait_css(b, "#queues")
        waiting(b, 20).until(lambda d: "billing-eu" in d.find_element(By.ID, "queues").text)
        shots(b, "overview")

        # filter the jobs
        b.get(web.url + "/jobs")
        Select(wait_css(b, "#f-status")).select_by_value("running")
        b.find_element(By.ID, "f-queue").send_keys("default")
        b.find_element(By.ID, "apply").click()
        waiting(b, 20).until(lambda d: "status=running" in d.current_url)
        rows = b.find_elements(By.CSS_SELECTOR, "#jobs tr.job")
        assert {r.find_element(By.CSS_SELECTOR, "a.job-link").text for r in rows} == {str(target), str(stubborn)}
        shots(b, "jobs")

        # open one and cancel it; its timeline updates without a reload
        b.find_element(By.LINK_TEXT, str(target)).click()
        wait_css(b, "#cancel")
        assert str(follower) in live_text(b, "#children")
        shots(b, "job")
        # the form is in the page's live region (polled every 0.5 s): find and act again if it was swapped
        waiting(b, 20).until(lambda d: type_into(d.find_element(By.ID, "cancel-reason"), "demo cancel"))
        waiting(b, 20).until(lambda d: click(d.find_element(By.ID, "cancel")))
        assert "202" in wait_css(b, "#message").text
        b.execute_script("window.__same_page = 'yes';")
        waiting(b, 30).until(lambda d: d.find_element(By.ID, "status").text == "cancelled")
        assert b.execute_script("return window.__same_page;") == "yes", "the page reloaded"
        timeline = live_text(b, "#timeline")
        assert "operator" in timeline and "cancel_requested" in timeline and "running → cancelled" in timeline
        shots(b, "job-cancelled")
        b.get(web.url + f"/jobs/{follower}")
        # the edge's resolution may be written after the cancel (a backlog the resolver settles): wait for it
        parents = live_text(b, "#parents", lambda text: "resolved" in text)
        assert str(target) in parents and "resolved cancelled" in parents, parents

        # a cancel the actor ignores stays in phase 1 with its grace clock running
        b.get(web.url + f"/jobs/{stubborn}")
        waiting(b, 20).until(lambda d: click(d.find_element(By.ID, "cancel")))
        wait_css(b, "#message")
        b.get(web.url + "/cancellations")
        waiting(b, 20).until(lambda d: str(stubborn) in d.find_element(By.CSS_SELECTOR, "table.phase-1").text)
        shots(b, "cancellations")

        b.get(web.url + "/workers")
        waiting(b, 20).until(lambda d: worker.worker_id() in d.find_element(By.ID, "workers").text)
        shots(b, "workers")

        # pause a schedule
        b.get(web.url + "/schedules")
        waiting(b, 20).until(lambda d: click(d.find_element(By.CSS_SELECTOR, "button.sched-pause")))
        waiting(b, 20).until(lambda d: "paused" in d.find_element(By.CSS_SELECTOR, "td.state").text)
        assert query(dsn, "SELECT paused_by FROM taskq.schedules")[0][0] == "operator"
        shots(b, "schedules")

        # pause a queue from the overview (its row's form; the page polls, so a row can be swapped under us)
        b.get(web.url + "/")
        row = "//table[@id='queues']//tr[td/a[text()='billing-eu']]"
        waiting(b, 20).until(
            lambda d: click(d.find_element(By.XPATH, row + "//button[contains(@class, 'queue-pause')]")))
        waiting(b, 20).until(
            lambda d: "paused by operator" in d.find_element(By.XPATH, row + "/td[@class='queue-state']").text)
        assert query(dsn, "SELECT paused_by FROM taskq.queues WHERE name = 'billing-eu' AND paused_at IS NOT NULL"
                     ) == [("operator",)]
        assert query(dsn, "SELECT kind, done_by FROM taskq.queue_events WHERE queue = 'billing-eu'") == [
            ("paused", "operator")]
        shots(b, "overview-paused")

        # limit the queue from its row's edit link: a form, a confirmation, then the overview shows it
        waiting(b, 20).until(lambda d: click(d.find_element(By.XPATH, row + "//a[contains(@class, 'queue-limits')]")))
        wait_css(b, "#limit-form")
        b.find_element(By.ID, "concurrency").send_keys("2")
        b.find_element(By.ID, "rate_limit").send_keys("30")
        b.find_element(By.ID, "rate_period").send_keys("60")
        b.find_element(By.ID, "limit-preview").click()
        assert "concurrency" in wait_css(b, "#limit-change").text
        assert query(dsn, "SELECT concurrency_limit FROM taskq.queues WHERE name = 'billing-eu'") == [(None,)]
        shots(b, "queue-limit-confirm")
        b.find_element(By.ID, "confirm").click()
        waiting(b, 20).until(
            lambda d: "concurrency 2, 30 per 60s" in d.find_element(By.XPATH, row + "/td[contains(@class, 'limits')]"
                                                                    ).text)
        assert query(dsn, "SELECT concurrency_limit, rate_limit, rate_period FROM taskq.queues"
                          " WHERE name = 'billing-eu'") == [(2, 30, 60.0)]

        # bulk cancel by filter, behind a confirmation
        b.get(web.url + "/jobs?queue=billing-eu")
        wait_css(b, "#bulk-cancel").click()
        wait_css(b, "#confirm")
        shots(b, "bulk-confirm")
        b.find_element(By.ID, "confirm").click()
        assert "cancel: 4 of 4 matched" in wait_css(b, "#message").text
        assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE queue = 'billing-eu' AND status = 'cancelled'"
                     )[0][0] == 4
        assert query(dsn, "SELECT action, count(*) FROM taskq.operator_audit WHERE principal = 'operator'"
                          " GROUP BY action ORDER BY action") == [
            ("jobs:cancel", 6), ("queues:limit", 1), ("queues:pause", 1), ("schedules:pause", 1)]

        # log out: the session ends on the server, so the old cookie, sent again, opens nothing
        session = b.get_cookie("taskq_session")
        assert session is not None and session["value"] != token  # the cookie holds a session id, never the token
        b.find_element(By.XPATH, "//header//form[contains(@action, '/logout')]//button").click()
        wait_css(b, "#token")
        assert b.get_cookie("taskq_session") is None
        assert query(dsn, "SELECT count(*) FROM taskq.web_sessions WHERE ended_at IS NULL") == [(0,)]
        b.add_cookie({"name": "taskq_session", "value": session["value"], "path": "/"})
        b.get(web.url + "/jobs")
        wait_css(b, "#token")  # the login page again
        assert "/login" in b.current_url
    finally:
        web.stop()


def test_workflow_page_draws_the_members_links_each_node_and_cancels_the_workflow(
    dsn: str, tmp_path: Path, browser: WebDriver, shots: Callable[[WebDriver, str], Path]
) -> None:
    with SyncJobsClient.connect(dsn) as client:
        with client.workflow() as wf:
            first = wf.enqueue("test.noop", 1, queue="wf-idle")
            second = wf.enqueue("test.noop", 2, queue="wf-idle", depends_on=[first])
            wf.enqueue("test.noop", 3, queue="wf-idle", depends_on=[first, second])
    # a child the first member enqueued with ctx.jobs.enqueue (as the worker writes it: parent_id, workflow_id)
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, queue, payload, parent_id, workflow_id)"
                        " VALUES ('test.noop', 'wf-idle', '4', %s, %s) RETURNING id", first.job_id, wf.id)
    spawned = UUID(str(row[0]))
    web = WebServer(dsn, "--no-auth", "--poll-interval", "0.5", log_path=tmp_path / "web.log")
    try:
        b = browser
        b.get(web.url + f"/workflows/{wf.id}")
        wait_css(b, "#workflow-graph")
        waiting(b, 20).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#workflow-graph a.node")) == 4)
        drawn = {n.get_attribute("data-job") for n in b.find_elements(By.CSS_SELECTOR, "#workflow-graph a.node")}
        assert drawn == {str(first.job_id), str(second.job_id), str(spawned)} | {
            str(n.job_id) for n in wf.nodes}
        assert len(b.find_elements(By.CSS_SELECTOR, "#workflow-graph .edge")) == 4  # 3 dependencies + 1 spawn
        assert "pending 2" in live_text(b, "#counts") or "awaiting_parents" in live_text(b, "#counts")
        shots(b, "workflow")

        # a node links to its job, whose page links back to the workflow
        node = f'#workflow-graph a.node[data-job="{second.job_id}"]'
        waiting(b, 20).until(lambda d: click(d.find_element(By.CSS_SELECTOR, node)))
        waiting(b, 20).until(lambda d: d.current_url.endswith(f"/jobs/{second.job_id}"))
        assert wait_css(b, "#workflow-link").text == str(wf.id)
        b.find_element(By.ID, "workflow-link").click()

        # the workflow's cancel button: every member waits, so all end cancelled at once
        waiting(b, 20).until(lambda d: click(d.find_element(By.ID, "workflow-cancel")))
        assert "cancelled 4 waiting" in wait_css(b, "#message").text
        waiting(b, 20).until(lambda d: {n.get_attribute("data-status") for n in d.find_elements(
            By.CSS_SELECTOR, "#workflow-graph a.node")} == {"cancelled"})
        assert not b.find_elements(By.ID, "workflow-cancel")
        shots(b, "workflow-cancelled")
    finally:
        web.stop()
    assert {r[0] for r in query(dsn, "SELECT status FROM taskq.jobs WHERE workflow_id = %s", wf.id)} == {"cancelled"}
