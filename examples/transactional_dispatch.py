"""Transactional dispatch: an order and the job about it commit together, or not at all.

    python examples/transactional_dispatch.py [sqlite:///shop.db]

The job is written on the application's own sqlite3 connection, inside its
transaction. The order that commits gets its receipt; the order whose
transaction rolls back leaves no job behind for a worker to run.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
from dataclasses import dataclass

from rainier_sync import Container, Job, JobContext, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers import DatabaseQueue


@dataclass
class SendReceipt(Job):
    NAME = "shop.send-receipt"
    TRIES = 3

    order_id: int

    def handle(self, context: JobContext) -> None:
        print(f"receipt sent for order {self.order_id}")


def place_order(db: sqlite3.Connection, manager: QueueManager, order_id: int, *, fail: bool = False) -> None:
    """Insert the order and dispatch its receipt in one transaction."""
    try:
        with db:  # commits on success, rolls back on an exception
            db.execute("INSERT INTO orders (id) VALUES (?)", (order_id,))
            manager.pending(SendReceipt(order_id)).within(db).send()
            if fail:
                raise RuntimeError("payment declined")
    except RuntimeError as exc:
        print(f"order {order_id} rolled back ({exc}): no order, no receipt job")


def main() -> None:
    url = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'shop.db')}"
    queue = DatabaseQueue.from_url(url)
    queue.migrate()
    manager = QueueManager(
        connections={"main": queue}, registry=JobRegistry().with_job(SendReceipt), container=Container()
    )
    db = sqlite3.connect(url.removeprefix("sqlite:///"))
    db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
    db.commit()

    place_order(db, manager, 1)
    place_order(db, manager, 2, fail=True)
    orders = [row[0] for row in db.execute("SELECT id FROM orders ORDER BY id")]
    print(f"orders stored: {orders}; jobs queued: {queue.size()}")

    stats = Worker(manager, options=WorkerOptions(once=True)).run()
    print(f"processed {stats.processed}, failed {stats.failed}")
    db.close()
    manager.close()


if __name__ == "__main__":
    main()
