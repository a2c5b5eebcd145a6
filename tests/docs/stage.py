"""What the docs' examples assume is already there.

A page's examples are fragments of one program: they use a ``registry``, a
``manager`` and the jobs the page speaks of without defining them again. The
stage gives each page those names (``PRELUDE``, ``STUBS``, ``SETUP``), fills
the ``...`` an example leaves for the reader with the test servers
(``SUBSTITUTE``, written out here so what runs is plain), and lists the few
blocks that are only compiled, each with the reason.
"""

from __future__ import annotations

import os
import sys
import types
import uuid
from dataclasses import make_dataclass
from typing import Any

from tests.docs.examples import Block

PRELUDE = """
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from datetime import timedelta

from rainier_sync import (Connections, Container, Job, JobContext, JobRegistry, QueueManager, QueueResources,
                          Schedule, Worker, WorkerOptions)
from rainier_sync.drivers import DatabaseQueue, MemoryQueue, RedisQueue
from rainier_sync.locks import MemoryLockStore, RedisLockStore

registry = JobRegistry()
container = Container()
queue = MemoryQueue()
manager = QueueManager({"main": queue}, registry=registry, container=container, locks=MemoryLockStore())
"""

#: Jobs a page names without defining (class name, NAME, fields); each does nothing.
STUBS: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    "docs/batches.rst": [
        ("ImportRow", "docs.import-row", ("n",)),
        ("ImportDone", "docs.import-done", ("n",)),
        ("ImportFailed", "docs.import-failed", ("n",)),
        ("CleanUp", "docs.clean-up", ("n",)),
    ],
    "docs/cli.rst": [
        ("NotifyAuthor", "blog.notify-author", ("post_id",)),
        ("SendInvoice", "billing.send-invoice", ("invoice_id",)),
        ("PruneSessions", "docs.prune-sessions", ()),
        ("Ping", "docs.ping", ("target",)),
    ],
    "docs/dispatching.rst": [("NotifyAuthor", "blog.notify-author", ("post_id",))],
    "docs/drivers/database.rst": [("SendReceipt", "shop.send-receipt", ("order_id",))],
    "docs/integrations.rst": [
        ("SendReceipt", "shop.send-receipt", ("order_id",)),
        ("SendWelcome", "app.send-welcome", ("signup_id",)),
    ],
    "docs/jobs.rst": [],
    "docs/scheduling.rst": [
        ("PruneSessions", "docs.prune-sessions", ()),
        ("NightlyReport", "docs.nightly-report", ()),
        ("Ping", "docs.ping", ("target",)),
    ],
    "docs/testing.rst": [
        ("SendWelcome", "app.send-welcome", ("email",)),
        ("SendReport", "app.send-report", ()),
    ],
    "docs/workflows.rst": [
        ("FetchInvoice", "billing.fetch-invoice", ("invoice_id",)),
        ("RenderPdf", "billing.render-pdf", ("invoice_id",)),
        ("MailInvoice", "billing.mail-invoice", ("invoice_id",)),
        ("InvoiceFailed", "billing.invoice-failed", ("invoice_id",)),
    ],
}

#: Code run after the prelude and the stubs, before a page's first block.
SETUP: dict[str, str] = {
    "docs/batches.rst": "rows = [1, 2, 3]\n",
    "docs/configuration.rst": (
        "import os\n"
        "os.environ['QUEUE_DRIVER'] = 'memory'\n"
        "os.environ['DATABASE_URL'] = 'sqlite:///jobs.db'\n"
        "BULK_URL = 'https://sqs.us-east-1.amazonaws.com/123456789012/bulk'\n"
        "BULK_FAILED_URL = 'https://sqs.us-east-1.amazonaws.com/123456789012/bulk-failed'\n"
        "open('queues.toml', 'w').write('[queues]\\ndefault = \"main\"\\n[queues.connections.main]\\n"
        "driver = \"memory\"\\n')\n"
    ),
    "docs/metrics.rst": (
        "import os, tempfile\n"
        "os.environ['PROMETHEUS_MULTIPROC_DIR'] = tempfile.mkdtemp()\n"
    ),
    "docs/workflows.rst": "price = lambda cart_id: 1299\nshow = print\n",
    "docs/drivers/database.rst": (
        "import psycopg\n"
        "url = POSTGRES_URL\n"
        "order_id, total = 7, 1299\n"
        "with psycopg.connect(url) as _c:\n"
        "    _c.execute('CREATE TABLE IF NOT EXISTS orders (id int, total int)')\n"
        "    _c.execute('DELETE FROM orders WHERE id = 7')\n"
        "job_id = None\n"
    ),
    "docs/drivers/memory-and-sync.rst": "job_id = None\n",
    # The page's orders app: its jobs module is the page's own jobs block.
    "docs/django.rst": (
        "import pathlib\n"
        "pathlib.Path('orders').mkdir(exist_ok=True)\n"
        "pathlib.Path('orders/__init__.py').touch()\n"
        "pathlib.Path('orders/jobs.py').write_text('from docs_example import send_receipt\\n')\n"
    ),
    "docs/drivers/redis.rst": "job_id = None\n",
    "docs/integrations.rst": (
        "name, email = 'Ada', 'ada@example.com'\n"
        "with closing(sqlite3.connect('app.db')) as _db, _db:\n"
        "    _db.execute('CREATE TABLE IF NOT EXISTS signups (name text, email text)')\n"
        "_q = DatabaseQueue.from_url('sqlite:///app.db')\n"
        "_q.migrate()\n"
        "manager = QueueManager({'main': _q}, registry=registry, container=container)\n"
    ),
    "docs/testing.rst": "reports_sent = []\n",
    "docs/operations.rst": (
        "import pathlib\n"
        "pathlib.Path('myapp').mkdir(exist_ok=True)\n"
        "pathlib.Path('myapp/__init__.py').touch()\n"
        "pathlib.Path('myapp/queues.py').write_text('from docs_example import *\\n'\n"
        "    'def create_manager():\\n    return manager\\n')\n"
    ),
    "docs/worker.rst": "",
    "docs/django-tasks.rst": (
        "import django\n"
        "from django.conf import settings\n"
        "settings.configure(USE_TZ=True, TASKS={'default': {\n"
        "    'BACKEND': 'rainier_sync.django.tasks.TasksBackend', 'QUEUES': ['default', 'mail']}})\n"
        "django.setup()\n"
    ),
}

#: (page, text in an example) -> what runs in its place: the reader's ``...``
#: filled with the test servers.
SUBSTITUTE: dict[tuple[str, str], str] = {
    ("docs/configuration.rst", "manager = QueueManager.from_config(\"queues.toml\""): (
        "os.environ.pop('QUEUE_DRIVER')  # the example's two lines are two alternatives\n"
        "manager = QueueManager.from_config(\"queues.toml\""
    ),
    ("docs/drivers/database.rst", 'DatabaseQueue.from_url("sqlite:///jobs.db", reservation=90)'): (
        "DatabaseQueue.from_url(POSTGRES_URL, reservation=90)"
    ),
    ("docs/metrics.rst", "start_http_server(9100, registry=registry)"): (
        "start_http_server(0, addr='127.0.0.1', registry=registry)"
    ),
    ("docs/workflows.rst", ".on_connection(\"mail\")"): ".on_connection(\"main\")",
    # run() blocks until stopped, as the page says: here it returns once the queue is empty.
    ("docs/worker.rst", "max_jobs=None, timeout=60, once=False))"): "max_jobs=None, timeout=60, once=True))",
    ("docs/worker.rst", "worker.start(); ...; worker.stop(); worker.join()"): (
        "worker = Worker(manager); worker.start(); ...; worker.stop(); worker.join()"
    ),
    ("docs/batches.rst", "connections=..."): "connections={'main': MemoryQueue()}",
    ("docs/batches.rst", "RedisLockStore.from_url(...)"): "RedisLockStore.from_url(REDIS_URL, prefix=PREFIX)",
    ("docs/scheduling.rst", "connections=..."): "connections={'main': MemoryQueue()}",
    ("docs/scheduling.rst", "RedisLockStore(...)"): "RedisLockStore.from_url(REDIS_URL, prefix=PREFIX)",
    ("docs/scheduling.rst", "WorkerOptions(schedule=True)"): "WorkerOptions(schedule=True, once=True)",
}

#: Blocks that show a refusal: (page, first line) -> the exception they raise.
RAISES: dict[tuple[str, str], str] = {
    ("docs/configuration.rst", "connections.check_reservations(longest_job_seconds=300)"): "ConfigurationError",
}

#: Tests a page shows that need the reader's own app: name -> why they are not called.
SKIP_TESTS: dict[str, str] = {
    "test_signup_sends_a_welcome": "calls the reader's register_user",
    "test_the_welcome_mail": "uses the reader's FakeMailer",
    "test_an_order_sends_its_receipt": "posts to the reader's Django project with pytest-django's client",
    "test_out_of_stock_queues_nothing": "posts to the reader's Django project with pytest-django's client",
}

#: Blocks compiled but not run: (page, first line) -> why.
COMPILE_ONLY: dict[tuple[str, str], str] = {
    ("docs/dispatching.rst", "manager.dispatch(job)                                  # its own QUEUE -> id | None"): (
        "a summary of the calls, with ``...`` for more jobs and a second connection; "
        "tests/core/test_manager.py runs each"
    ),
    ("docs/dispatching.rst", "manager = QueueManager("): "names an SQS queue URL and a Redis store the reader fills in",
    ("docs/drivers/writing.rst", "from __future__ import annotations"): (
        "a module of a driver package: its relative imports need that package"
    ),
    ("docs/drivers/writing.rst", '"""What configuration knows of the Acme driver."""'): (
        "a module of a driver package: its relative imports need that package"
    ),
    ("docs/django.rst", "from django.db import transaction"): (
        "a view of a Django project; tests/django/test_example.py runs examples/django_app's"
    ),
    ("docs/flask.rst", '@app.post("/signup")'): (
        "a view of the app above; tests/flask/test_example.py runs examples/flask_app"
    ),
    ("docs/flask.rst", "app.config.update("): (
        "names an SQS queue and a Redis server the reader fills in; tests/config/test_locks_url.py boots the same "
        "app.config on moto and Redis"
    ),
    ("docs/flask.rst", 'worker = queues.start_worker(app, queues=["mail", "default"], concurrency=2)'): (
        "needs the app above; tests/flask/ start the embedded worker"
    ),
    ("docs/integrations.rst", "from sqlalchemy import create_engine"): (
        "needs the application's Order model; tests/drivers/database/test_sqlalchemy.py runs the same calls"
    ),
    ("docs/integrations.rst", '@app.post("/orders")'): (
        "a Flask-SQLAlchemy view; tests/drivers/database/test_sqlalchemy.py runs the same calls"
    ),
    ("docs/integrations.rst", 'queue = DatabaseQueue.from_url("postgresql://app@pgbouncer:6432/app?listen=false")'): (
        "names the application's pgbouncer; the contract suite runs the driver through pgbouncer"
    ),
    ("docs/integrations.rst", "from rainier_sync import QueueManager"): (
        "needs the application's hosts and Order model; tests/outbox/test_dispatch.py runs the same calls"
    ),
    ("docs/testing.rst", "with freeze_time(\"2026-03-01 12:00:00\") as frozen:"): (
        "continues the test function above, inside it"
    ),
}


def _stub(cls_name: str, job_name: str, fields: tuple[str, ...], namespace: dict[str, Any]) -> type:
    def handle(self: Any, context: Any) -> None:
        namespace.setdefault("ran", []).append(cls_name)
        if cls_name == "SendReport":
            namespace["reports_sent"].append(self)

    return make_dataclass(
        cls_name,
        [(field, Any, None) for field in fields],
        bases=(__import__("rainier_sync").Job,),
        namespace={"NAME": job_name, "handle": handle, "__module__": "docs_example"},
    )


def namespace_for(page: str) -> dict[str, Any]:
    module = types.ModuleType("docs_example")
    sys.modules["docs_example"] = module
    namespace = module.__dict__
    namespace["REDIS_URL"] = os.environ.get("DOCS_REDIS_URL", "redis://127.0.0.1:6379/13")
    namespace["POSTGRES_URL"] = os.environ.get("DOCS_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    namespace["PREFIX"] = f"docs:{uuid.uuid4().hex[:8]}:"
    exec(PRELUDE, namespace)
    for cls_name, job_name, fields in STUBS.get(page, []):
        cls = _stub(cls_name, job_name, fields, namespace)
        namespace[cls_name] = cls
        namespace["registry"].register(cls)
    exec(SETUP.get(page, ""), namespace)
    return namespace


def prepare(block: Block) -> str:
    code = block.code
    for (page, old), new in SUBSTITUTE.items():
        if page == block.page:
            code = code.replace(old, new)
    return code


def raises(block: Block) -> str | None:
    return RAISES.get((block.page, block.first.strip()))


def before_test(namespace: dict[str, Any]) -> None:
    namespace["reports_sent"] = namespace.get("reports_sent", [])
    namespace["reports_sent"].clear()


def how(block: Block) -> str:
    return "compile" if (block.page, block.first.strip()) in COMPILE_ONLY else "run"


def finish(namespace: dict[str, Any]) -> None:
    """Close what the page opened; delete the Redis keys it wrote."""
    for value in list(namespace.values()):
        if isinstance(value, __import__("rainier_sync").QueueManager):
            value.close()
    prefix = namespace["PREFIX"]
    try:
        import redis

        client = redis.Redis.from_url(namespace["REDIS_URL"])
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
    except Exception:  # noqa: BLE001 - cleaning up is best effort; the keys carry a page's own prefix
        pass
