"""The example's job: welcome a new signup."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timezone

from rainier_sync import Job, JobContext

from .models import Signup, db

log = logging.getLogger(__name__)


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
        # A job runs inside an app context: db.session is this job's own session.
        signup = db.session.get(Signup, self.signup_id)
        if signup is None:
            raise LookupError(f"signup {self.signup_id} does not exist")
        context.resolve(Mailer).send(signup.email, f"Welcome, {signup.name}!")
        signup.welcomed_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        db.session.commit()
