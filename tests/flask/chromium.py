"""Headless Chromium for the dashboard: the system Chromium driven by the
system chromedriver through Selenium, and the app served by werkzeug on
127.0.0.1. Used by the browser tests and by the screenshot script."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from flask import Flask

from tests.support import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]


def missing() -> list[str]:
    """The Chromium programs that are not installed."""
    return [path for path in (CHROMIUM, CHROMEDRIVER) if not pathlib.Path(path).exists()]


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium (a Selenium ``WebDriver``) that keeps the console's
    messages, so a page's CSP violations can be read (:func:`csp_violations`)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="rainier-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--window-size={width},{height}", f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@contextlib.contextmanager
def serving(app: Flask) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 from a thread; its base URL."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", free_port(), app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="dashboard-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


def click_to_load(browser: Any, element: Any, timeout: float = 10) -> None:
    """Click what loads another page (a link, a form's button) and wait, bounded,
    until that page has replaced this one: an element looked up before then may
    belong to the page going away (the ``#notice`` of the last action, say), and
    reading it once the new page is in gives ``StaleElementReferenceException``."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    leaving = browser.find_element(By.TAG_NAME, "html")
    element.click()

    def gone(_: Any) -> bool:
        try:
            leaving.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            # Chromium, asked in the moment the page is replaced, answers with an
            # inspector error rather than a stale element: the node is gone all the same.
            if "does not belong to the document" in str(exc):
                return True
            raise
        return False

    WebDriverWait(browser, timeout).until(gone, message="the click did not load another page")


def notice_reads(browser: Any, text: str, timeout: float = 10) -> None:
    """Wait, bounded, until the page's notice says ``text``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, timeout).until(
        expected_conditions.text_to_be_present_in_element((By.ID, "notice"), text),
        message=f"the notice never read {text!r}",
    )


def csp_violations(browser: Any) -> list[str]:
    """The console's Content Security Policy complaints since the last call."""
    return [entry["message"] for entry in browser.get_log("browser") if "Content Security Policy" in entry["message"]]


def screenshot(browser: Any, path: pathlib.Path, most: int = 1600) -> pathlib.Path:
    """Save the page as a PNG at ``path``: all of it, up to ``most`` pixels high."""
    from selenium.webdriver.common.by import By

    size = browser.get_window_size()
    body = browser.find_element(By.TAG_NAME, "body")
    height = min(most, max(size["height"], int(body.size["height"]) + 40))
    browser.set_window_size(size["width"], height)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(path))
    finally:
        browser.set_window_size(size["width"], size["height"])
    return path


#: Run in the page by WebDriver (which the page's CSP does not govern; the page itself runs no script).
_ACCESSIBILITY = pathlib.Path(__file__).with_name("accessibility.js")


def accessibility_problems(browser: Any) -> list[str]:
    """What the page gets wrong of the basics: a form control without a label, a
    button or link with no name, a chart with no title, text (chart labels
    included) whose contrast with what is behind it is under WCAG AA's 4.5:1
    (3:1 for large text)."""
    found: list[str] = browser.execute_script(_ACCESSIBILITY.read_text(encoding="utf-8"))
    return found
