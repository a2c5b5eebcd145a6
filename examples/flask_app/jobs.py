"""The example's job: welcome a new signup."""

from __future__ import annotations

import logging
import sqlite3
import threading
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timezone

from flask import current_app

from rainier_sync import Job, JobContext

log = logging.getLogger(__name__)


def open_db(path: str | None = None) -> sqlite3.Connection:
    """A connection to the app's SQLite file (the queue's file too)."""
    return sqlite3.connect(path or current_app.config["APP_DATABASE"], timeout=10)


class Mailer:
    """Stands in for an SMTP client: remembers what it sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def send(self, to: str, subject: str) -> None:
        with self._lock:
            self.sent.append((to, subject))
        log.info("mail to %s: %s", to, subject)


@dataclass
class SendWelcome(Job):
    NAME = "signups.send-welcome"
    QUEUE = "mail"
    TRIES = 3

    signup_id: int

    def handle(self, context: JobContext) -> None:
        # A job runs inside an app context: current_app and its config work here.
        with closing(open_db()) as db, db:
            row = db.execute("SELECT name, email FROM signups WHERE id = ?", (self.signup_id,)).fetchone()
            if row is None:
                raise LookupError(f"signup {self.signup_id} does not exist")
            name, email = row
            context.resolve(Mailer).send(email, f"Welcome, {name}!")
            db.execute(
                "UPDATE signups SET welcomed_at = ? WHERE id = ?",
                (datetime.now(timezone.utc).isoformat(timespec="seconds"), self.signup_id),
            )
