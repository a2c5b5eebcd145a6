"""The dashboard in a real browser: headless Chromium (the system one, driven by
the system chromedriver through Selenium, see ``chromium.py``) against the app
served by werkzeug on 127.0.0.1. Every page is checked for CSP violations
(the dashboard runs no script and loads nothing from elsewhere). Saves a
screenshot to build/dashboard.png."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from rainier_sync import WorkerOptions
from rainier_sync.drivers import MemoryQueue
from rainier_sync.flask import FlaskWorker
from tests.support import IN_CI

from .apps import Explode, Quiet, RecordApp, Shout, fail_jobs, fleet_app, make_app, put_failed
from .chromium import accessibility_problems, chromium, click_to_load, csp_violations, missing, notice_reads, serving

pytestmark = pytest.mark.browser

SCREENSHOT = pathlib.Path(__file__).resolve().parents[2] / "build" / "dashboard.png"


@pytest.fixture
def browser() -> Iterator[Any]:
    absent = missing()
    if absent:
        message = f"{', '.join(absent)} not installed; install with: apt-get install chromium chromium-driver"
        if IN_CI:
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message)
    with chromium() as driver:
        yield driver
        assert csp_violations(driver) == [], "a page broke its Content Security Policy"


def accessible(browser: Any) -> None:
    """The page labels its controls, names its buttons, links and charts, and its text is legible."""
    problems = accessibility_problems(browser)
    assert problems == [], f"{browser.current_url}: {problems}"


@pytest.fixture
def served() -> Iterator[tuple[str, Any]]:
    app, manager = make_app(name="browser_app", authorize=lambda: True)
    with serving(app) as base:
        yield base, (app, manager)


def test_dashboard_shows_counts_and_retry_takes_the_job_off_the_failed_list(
    browser: Any, served: tuple[str, Any]
) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    base, (app, manager) = served
    for label in ("one", "two", "three", "four", "five"):
        manager.dispatch(RecordApp(label))
    manager.dispatch(Explode("ran once"))
    FlaskWorker(app, options=WorkerOptions(queues=["default", "mail"], once=True)).run()
    timeout_id, script_id = fail_jobs(manager, "SMTP server said 421: try again later", "<script>alert(1)</script>")
    for label in ("a", "b", "c"):
        manager.dispatch(RecordApp(label))
    manager.dispatch_after(300, RecordApp("later"))
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)

    browser.get(f"{base}/queues/")
    cell = browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="default"] td.ready')
    assert cell.text == "3"
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="default"] td.delayed').text == "1"
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="mail"] td.failed').text == "3"
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.failed-job")
    assert len(rows) == 3
    escaped = browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{script_id}"] code.payload')
    assert "<script>alert(1)</script>" in escaped.text, "the payload is shown as text"
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - the payload's script must not have run
    assert browser.find_elements(By.CSS_SELECTOR, "svg#throughput"), "the fleet's chart, from the queue's own store"
    assert not browser.find_elements(By.ID, "untracked-throughput")
    accessible(browser)

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOT))

    click_to_load(browser, browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{timeout_id}"] button.retry'))
    notice_reads(browser, f"Job {timeout_id} was queued again.")
    assert browser.find_element(By.ID, "notice").text == f"Job {timeout_id} was queued again."
    assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{timeout_id}"]')
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr.failed-job")) == 2
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="mail"] td.ready').text == "1"
    assert timeout_id in [job.id for job in driver.jobs]
    assert timeout_id not in [failed.id for failed in driver.failed]


def test_jobs_with_awkward_ids_open_retry_and_forget_in_a_browser(browser: Any, served: tuple[str, Any]) -> None:
    """A browser resolves ``..`` and may rewrite a path before sending it: the links must survive that."""
    from selenium.webdriver.common.by import By

    base, (_, manager) = served
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    ids = ["emails/1700000000000-0", "..", "tenant/../emails 50% ?#ü"]
    for job_id in ids:
        put_failed(driver, job_id)

    for job_id in ids[:2]:
        browser.get(f"{base}/queues/")
        click_to_load(browser, browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{job_id}"] td a'))
        assert browser.find_element(By.CSS_SELECTOR, "h2 small code").text == job_id
        accessible(browser)
        click_to_load(browser, browser.find_element(By.CSS_SELECTOR, "button.retry"))
        notice_reads(browser, f"Job {job_id} was queued again.")
        assert job_id in [job.id for job in driver.jobs]

    # The page shows the last retry's notice: only once it is replaced is the next one read.
    click_to_load(browser, browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{ids[2]}"] button.forget'))
    notice_reads(browser, f"Job {ids[2]} was deleted.")
    assert browser.find_element(By.ID, "notice").text == f"Job {ids[2]} was deleted."
    assert driver.failed == []


def test_a_long_error_is_cut_on_its_page_and_opens_whole_as_plain_text(browser: Any, served: tuple[str, Any]) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    base, (_, manager) = served
    job_id = manager.dispatch(Shout(3000))  # about 180 KB of error
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    driver.drain()
    (failed,) = driver.failed

    browser.get(f"{base}/queues/primary/failed/{job_id}")
    shown = browser.find_element(By.CSS_SELECTOR, "dd.error-text").text
    assert shown.startswith("RuntimeError: <script>alert('owned')</script> & line 0000000 of the failure\n")
    assert "line 0002999" not in shown and failed.error.startswith(shown)
    assert "(then the error, shown above)" in browser.find_element(By.CSS_SELECTOR, "pre.traceback").text
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - the error's script must not have run
    accessible(browser)

    click_to_load(browser, browser.find_element(By.CSS_SELECTOR, "a.whole-error"))
    assert browser.current_url == f"{base}/queues/primary/failed/{job_id}/error"
    # Chromium shows plain text in a <pre> of its own; WebDriver's text drops the final line break.
    assert browser.find_element(By.TAG_NAME, "pre").text == failed.error.rstrip("\n")
    assert not browser.find_elements(By.TAG_NAME, "script")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018


@pytest.fixture
def fleet_served() -> Iterator[tuple[str, Any]]:
    app, manager = fleet_app(name="browser_fleet_app")
    with serving(app) as base:
        yield base, (app, manager)


def test_the_workers_page_lists_the_fleet_and_charts_its_throughput_and_waits(
    browser: Any, fleet_served: tuple[str, Any]
) -> None:
    from selenium.webdriver.common.by import By

    from rainier_sync import Worker

    base, (_, manager) = fleet_served
    manager.dispatch_many([Quiet() for _ in range(6)])
    manager.dispatch(Explode("no"))
    Worker(manager, options=WorkerOptions(queues=["default", "mail"], once=True)).run()
    running = Worker(manager, options=WorkerOptions(queues=["default", "mail"], concurrency=3))
    assert running.fleet is not None
    running.fleet.refresh()  # recorded as a running worker records itself

    browser.get(f"{base}/queues/")
    def bars(chart: str) -> list[tuple[str, str]]:
        """Each bar's colour and figures (not its place, which moves as the minutes go by)."""
        return [
            (bar.get_attribute("fill"), bar.find_element(By.TAG_NAME, "title").get_attribute("textContent"))
            for bar in browser.find_elements(By.CSS_SELECTOR, f"svg#{chart} rect")
        ]

    index_bars = bars("throughput")
    assert index_bars, "the index charts the fleet"
    accessible(browser)
    click_to_load(browser, browser.find_element(By.LINK_TEXT, "Workers"))
    assert browser.find_element(By.CSS_SELECTOR, 'nav a[aria-current="page"]').text == "Workers"
    (row,) = browser.find_elements(By.CSS_SELECTOR, "tr.worker")
    assert row.get_attribute("data-worker-id") == running.fleet.id
    assert "default, mail" in row.text and "idle" in row.text
    drawn = browser.find_elements(By.CSS_SELECTOR, "svg#fleet-throughput rect")
    assert drawn and all(float(bar.get_attribute("height")) > 0 for bar in drawn)
    assert bars("fleet-throughput") == index_bars, "one chart on both pages"
    assert browser.find_elements(By.CSS_SELECTOR, "svg#fleet-waits circle")
    default = browser.find_element(By.CSS_SELECTOR, 'table.fleet-queues tr[data-queue="default"]')
    assert default.find_element(By.CSS_SELECTOR, "td.processed").text == "6"
    assert default.find_element(By.CSS_SELECTOR, "td.wait.p50").text.endswith(("ms", "s"))
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="mail"] td.failed').text == "1"
    assert "over 7 first attempts" in browser.find_element(By.ID, "waits-legend").text
    accessible(browser)


def test_pause_and_continue_a_queue_in_a_browser(browser: Any, fleet_served: tuple[str, Any]) -> None:
    from selenium.webdriver.common.by import By

    base, (_, manager) = fleet_served
    browser.get(f"{base}/queues/")
    pause = browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="default"] td.pause button')
    assert pause.text == "Pause" and pause.get_attribute("aria-label") == "pause queue default"
    click_to_load(browser, pause)
    notice_reads(browser, "Queue default is paused")
    assert manager.paused("primary") == {"default"}
    cell = browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="default"] td.pause')
    assert cell.find_element(By.CSS_SELECTOR, "span.paused").text == "paused"
    click_to_load(browser, cell.find_element(By.CSS_SELECTOR, "button"))
    notice_reads(browser, "Queue default is worked again.")
    assert manager.paused("primary") == set()
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="default"] td.pause button').text == "Pause"


def test_browsing_a_queue_filtering_paging_and_opening_a_reserved_job(
    browser: Any, fleet_served: tuple[str, Any]
) -> None:
    import time

    from selenium.webdriver.common.by import By

    from rainier_sync.fleet import FleetRecorder

    base, (_, manager) = fleet_served
    ids = [manager.dispatch(RecordApp(f"n{n}")) for n in range(60)]
    quiet = [manager.dispatch(Quiet()) for _ in range(3)]
    (taken,) = manager.connection().reserve_many(["default"], 1)
    worker = FleetRecorder(
        manager.locks, "primary", ["default"], 2, report=lambda op, exc: None, running=lambda: [(taken, time.time())]
    )
    worker.refresh()

    def rows() -> list[str]:
        return [row.get_attribute("data-job-id") for row in browser.find_elements(By.CSS_SELECTOR, "tr.listed-job")]

    browser.get(f"{base}/queues/")
    click_to_load(browser, browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="default"] a.browse'))
    tabs = {tab.get_attribute("data-state"): tab.text for tab in browser.find_elements(By.CSS_SELECTOR, "nav.states a")}
    assert tabs == {"ready": "Ready 62", "delayed": "Delayed 0", "reserved": "Reserved 1"}
    assert rows() == ids[1:51]
    accessible(browser)
    click_to_load(browser, browser.find_element(By.CSS_SELECTOR, 'a[rel="next"]'))
    assert rows() == [*ids[51:], *quiet]

    browser.find_element(By.ID, "name-filter").send_keys("QUIET")
    click_to_load(browser, browser.find_element(By.CSS_SELECTOR, "form.filter button"))
    assert rows() == quiet and "name=QUIET" in browser.current_url
    accessible(browser)

    click_to_load(browser, browser.find_element(By.CSS_SELECTOR, 'nav.states a[data-state="reserved"]'))
    assert rows() == [], "the filter is kept across the tabs"
    click_to_load(browser, browser.find_element(By.LINK_TEXT, "clear"))
    assert rows() == [taken.id]
    assert browser.find_element(By.CSS_SELECTOR, "td.worker code").text == worker.id
    accessible(browser)

    click_to_load(browser, browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{taken.id}"] td a'))
    assert browser.find_element(By.CSS_SELECTOR, "dd.state").text == "reserved"
    assert browser.find_element(By.CSS_SELECTOR, "dd.worker code").text == worker.id
    accessible(browser)
    click_to_load(browser, browser.find_element(By.CSS_SELECTOR, "dd.worker a"))
    assert browser.current_url.endswith(f"/queues/workers#worker-{worker.id}")
    assert browser.find_element(By.ID, f"worker-{worker.id}").is_displayed()
