"""The dashboard's screenshots in the docs, taken with headless Chromium.

    .venv/bin/python -m tests.flask.screenshots [--out docs/_static]

Builds a demo app (memory driver, memory lock store): forty minutes of work
run by real workers under frozen clocks (so the Workers page has throughput
and wait times to chart), jobs ready, delayed and reserved, three workers
recorded with the jobs they run, a few failed jobs; serves it on 127.0.0.1 and
saves ``dashboard.png`` (the queues), ``workers.png``, ``browse.png`` (a
queue's ready jobs, filtered by name), ``browse-reserved.png`` and
``job.png`` (a reserved job's page).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import secrets
import time
from dataclasses import dataclass

from flask import Flask
from freezegun import freeze_time

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions, backoff
from rainier_sync.drivers import MemoryQueue
from rainier_sync.flask import RainierSync
from rainier_sync.fleet import RECORD_TTL, RunningJob, WorkerInfo, worker_key, workers_group
from rainier_sync.locks import MemoryLockStore

from .chromium import chromium, screenshot, serving

DOCS_STATIC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "_static"


@dataclass
class SendWelcome(Job):
    NAME = "app.send-welcome-email"
    QUEUE = "mail"

    user: int

    def handle(self, context: JobContext) -> None:
        pass


@dataclass
class ResizeImage(Job):
    NAME = "app.resize-image"

    upload: str
    width: int = 640

    def handle(self, context: JobContext) -> None:
        pass


@dataclass
class SyncInvoices(Job):
    NAME = "app.sync-invoices"
    QUEUE = "billing"
    TRIES = 3
    BACKOFF = backoff.fixed(60)

    account: int

    def handle(self, context: JobContext) -> None:
        if self.account % 23 == 0:
            raise ConnectionError(f"billing API timed out for account {self.account}")


def demo_app() -> tuple[Flask, QueueManager]:
    """The app the screenshots show, with its history and its present."""
    registry = JobRegistry().with_job(SendWelcome).with_job(ResizeImage).with_job(SyncInvoices)
    manager = QueueManager(
        {"primary": MemoryQueue(reservation=300)}, registry=registry, container=Container(), locks=MemoryLockStore()
    )
    app = Flask("demo")
    app.config["SECRET_KEY"] = secrets.token_hex(32)
    RainierSync(app, manager=manager, authorize=lambda: True)
    _history(manager)
    _present(manager)
    return app, manager


def _history(manager: QueueManager) -> None:
    """Forty minutes of work: each minute a burst of jobs, run after a wait that grows and eases off."""
    now = time.time()
    for back in range(40, 0, -1):
        minute = datetime.datetime.fromtimestamp(now - back * 60, tz=datetime.timezone.utc)
        with freeze_time(minute) as frozen:
            load = 6 + (40 - back) % 9 + (12 if 18 <= back <= 24 else 0)
            slow = 8.0 if 18 <= back <= 24 else 0.3 * (back % 5)
            # Three bursts a few moments apart, all run at once: the first waited longest.
            for burst in range(3):
                manager.dispatch_many([SendWelcome(user=1000 * back + 10 * burst + n) for n in range(load // 3)])
                manager.dispatch_many([ResizeImage(upload=f"u{back}-{burst}-{n}.png") for n in range(load // 6)])
                manager.dispatch(SyncInvoices(account=back * 3 + burst))
                frozen.tick(0.02 + slow / (1 + 2 * burst))
            Worker(manager, options=WorkerOptions(queues=["mail", "default", "billing"], once=True)).run()


def _present(manager: QueueManager) -> None:
    """Jobs waiting now, three workers running some, a few failed."""
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    manager.dispatch_many([ResizeImage(upload=f"camera-{n:04d}.jpg", width=320 * (1 + n % 3)) for n in range(140)])
    manager.dispatch_many([SendWelcome(user=5000 + n) for n in range(60)])
    for n in range(12):
        manager.dispatch_after(600 + 60 * n, SyncInvoices(account=900 + n))
    reserved = driver.reserve_many(["default", "mail"], 9)
    now = time.time()
    for index in range(3):
        running = reserved[index * 3 : index * 3 + 3]
        info = WorkerInfo(
            id=f"worker-{index + 1}-{4100 + index}-{secrets.token_hex(4)}",
            host=f"worker-{index + 1}",
            pid=4100 + index,
            connection="primary",
            queues=("mail", "default", "billing"),
            concurrency=8,
            version="1.4.0",
            started=now - 3600 * (index + 1) - 120,
            last_heartbeat=now - 2 - index,
            running=tuple(RunningJob(job.id, job.name, job.queue, now - 4 - 7 * n) for n, job in enumerate(running)),
            running_count=len(running),
        )
        assert manager.locks is not None
        manager.locks.put_value(worker_key(info.id), json.dumps(info.to_dict()), RECORD_TTL * 20)
        manager.locks.set_flag(workers_group("primary"), info.id, True)


def take(out: pathlib.Path) -> list[pathlib.Path]:
    """Build the demo app, serve it, and save the screenshots under ``out``."""
    from selenium.webdriver.common.by import By

    app, manager = demo_app()
    driver = manager.connection()
    assert isinstance(driver, MemoryQueue)
    reserved = driver.list_jobs("default", "reserved", limit=1)
    saved: list[pathlib.Path] = []
    with serving(app) as base, chromium(1280, 900) as browser:
        browser.get(f"{base}/queues/")
        saved.append(screenshot(browser, out / "dashboard.png", most=1100))
        browser.get(f"{base}/queues/workers")
        saved.append(screenshot(browser, out / "workers.png"))
        browser.get(f"{base}/queues/primary/queues/default?state=ready&name=resize")
        assert browser.find_elements(By.CSS_SELECTOR, "tr.listed-job")
        saved.append(screenshot(browser, out / "browse.png", most=1000))
        browser.get(f"{base}/queues/primary/queues/default?state=reserved")
        saved.append(screenshot(browser, out / "browse-reserved.png"))
        browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{reserved[0].job.id}"] td a').click()
        assert browser.find_element(By.CSS_SELECTOR, "dd.worker code").text.startswith("worker-")
        saved.append(screenshot(browser, out / "job.png"))
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, default=DOCS_STATIC)
    args = parser.parse_args()
    for path in take(args.out):
        print(path)


if __name__ == "__main__":
    main()
