"""``rainier-sync dashboard`` in headless Chromium: log in with the token, read
the queues page and retry a failed job, with no CSP violation (the fixture
checks the console) and the hostile payload shown as text."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from rainier_sync import Worker, WorkerOptions
from tests.flask.chromium import accessibility_problems, click_to_load, notice_reads

from .app import Explode, build, driver
from .support import TOKEN, serving

pytestmark = pytest.mark.browser

HOSTILE = "<script>alert(1)</script>"


@pytest.mark.timeout(120)
def test_log_in_and_retry_a_failed_job_in_a_browser(browser: Any, tmp_path: pathlib.Path) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    queue = driver(url)
    manager = build(queue)
    manager.dispatch(Explode(HOSTILE))
    manager.dispatch(Explode("two"))
    assert Worker(manager, options=WorkerOptions(queues=["mail"], once=True)).run().failed == 2

    with serving(tmp_path, env={"DASHBOARD_QUEUE_URL": url}) as base:
        browser.get(f"{base}/")
        assert browser.current_url.startswith(f"{base}/login"), "sent to log in first"
        assert accessibility_problems(browser) == []
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        click_to_load(browser, browser.find_element(By.CSS_SELECTOR, "form button[type=submit]"))
        assert browser.current_url == f"{base}/", browser.page_source

        assert browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="mail"] td.failed').text == "2"
        rows = browser.find_elements(By.CSS_SELECTOR, "tr.failed-job")
        assert len(rows) == 2
        hostile = [row for row in rows if HOSTILE in row.find_element(By.CSS_SELECTOR, "code.payload").text]
        assert len(hostile) == 1, "the payload is shown as text"
        with pytest.raises(NoAlertPresentException):
            browser.switch_to.alert.text  # noqa: B018 - the payload's script must not have run
        assert accessibility_problems(browser) == []

        job_id = hostile[0].get_attribute("data-job-id")
        click_to_load(browser, hostile[0].find_element(By.CSS_SELECTOR, "button.retry"))
        notice_reads(browser, f"Job {job_id} was queued again.")
        assert len(browser.find_elements(By.CSS_SELECTOR, "tr.failed-job")) == 1
        assert browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="mail"] td.ready').text == "1"
    assert queue.failed_count() == 1 and queue.counts("mail").ready == 1
    queue.close()
