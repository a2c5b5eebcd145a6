"""The dashboard in a real browser: headless Chromium (the system one, driven by
the system chromedriver through Selenium) against the app served by werkzeug
on 127.0.0.1. Saves a screenshot to build/dashboard.png."""

from __future__ import annotations

import pathlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from rainier_sync import WorkerOptions
from rainier_sync.drivers import MemoryQueue
from rainier_sync.flask import FlaskWorker
from tests.support import IN_CI, free_port

from .apps import Explode, RecordApp, fail_jobs, make_app, put_failed

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOT = pathlib.Path(__file__).resolve().parents[2] / "build" / "dashboard.png"
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1000",
]


def _need_chromium() -> None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not pathlib.Path(path).exists()]
    if missing:
        message = f"{', '.join(missing)} not installed; install with: apt-get install chromium chromium-driver"
        if IN_CI:
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message)


@pytest.fixture
def browser() -> Iterator[Any]:
    _need_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="rainier-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def served() -> Iterator[tuple[str, Any]]:
    from werkzeug.serving import make_server

    app, manager = make_app(name="browser_app", authorize=lambda: True)
    server = make_server("127.0.0.1", free_port(), app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="dashboard-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", (app, manager)
    finally:
        server.shutdown()
        thread.join(10)


def test_dashboard_shows_counts_and_retry_takes_the_job_off_the_failed_list(
    browser: Any, served: tuple[str, Any]
) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

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
    assert browser.find_element(By.CSS_SELECTOR, "svg#throughput rect") is not None

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOT))

    browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{timeout_id}"] button.retry').click()
    WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.ID, "notice"))
    assert browser.find_element(By.ID, "notice").text == f"Job {timeout_id} was queued again."
    assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{timeout_id}"]')
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr.failed-job")) == 2
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="mail"] td.ready').text == "1"
    assert timeout_id in [job.id for job in driver.jobs]
    assert timeout_id not in [failed.id for failed in driver.failed]


def test_jobs_with_awkward_ids_open_retry_and_forget_in_a_browser(browser: Any, served: tuple[str, Any]) -> None:
    """A browser resolves ``..`` and may rewrite a path before sending it: the links must survive that."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    base, (_, manager) = served
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    ids = ["emails/1700000000000-0", "..", "tenant/../emails 50% ?#ü"]
    for job_id in ids:
        put_failed(driver, job_id)

    for job_id in ids[:2]:
        browser.get(f"{base}/queues/")
        browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{job_id}"] td a').click()
        WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.CSS_SELECTOR, "h2 small code"))
        assert browser.find_element(By.CSS_SELECTOR, "h2 small code").text == job_id
        browser.find_element(By.CSS_SELECTOR, "button.retry").click()
        WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.ID, "notice"))
        assert browser.find_element(By.ID, "notice").text == f"Job {job_id} was queued again."
        assert job_id in [job.id for job in driver.jobs]

    browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{ids[2]}"] button.forget').click()
    WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.ID, "notice"))
    assert browser.find_element(By.ID, "notice").text == f"Job {ids[2]} was deleted."
    assert driver.failed == []
