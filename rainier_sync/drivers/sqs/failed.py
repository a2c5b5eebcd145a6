"""The failed store on SQS: a queue of its own (``failed_queue_url``), since
SQS keeps no failed jobs itself."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any, Sequence

from ... import _clock
from ...errors import PayloadError
from ...types import FailedJob
from ..base import FailedStore
from . import wire
from .client import BATCH, SYSTEM_ATTRIBUTES, SqsLink, chunks, is_fifo, reaching

#: Failed-store entries one listing looks at, at most.
SCAN_LIMIT = 1_000


class SqsFailedQueue(FailedStore):
    """Failed jobs, and messages that carried none, as entries on the failed queue."""

    def __init__(self, link: SqsLink) -> None:
        self.link = link
        self.url = link.failed_queue_url

    def store(self, body: str) -> None:
        """Send one entry (trimmed to SQS's size limit) to the failed queue."""
        extra: dict[str, Any] = {}
        if is_fifo(self.url):
            extra = {"MessageGroupId": "rainier-failed", "MessageDeduplicationId": uuid.uuid4().hex}
        self.link.client.send_message(QueueUrl=self.url, MessageBody=wire.fit(body), **extra)

    def _scan(self) -> list[tuple[FailedJob, str]]:
        """Receive the failed queue's entries (hidden for 30 s while we look),
        up to :data:`SCAN_LIMIT`; with their receipt handles."""
        link = self.link
        expected = link.attributes(self.url)["ApproximateNumberOfMessages"]
        found: list[tuple[FailedJob, str]] = []
        empty = 0
        # Until a receive comes back empty, and SQS's (lagging) count is reached
        # or three receives in a row were empty.
        while len(found) < SCAN_LIMIT:
            response = link.client.receive_message(
                QueueUrl=self.url,
                MaxNumberOfMessages=BATCH,
                VisibilityTimeout=30,
                WaitTimeSeconds=0,
                **{link.attributes_param: SYSTEM_ATTRIBUTES},
            )
            messages = response.get("Messages", [])
            if not messages:
                empty += 1
                if len(found) >= expected or empty >= 3:
                    break
                continue
            empty = 0
            for message in messages:
                found.append((wire.failed_entry(message, link.connection), message["ReceiptHandle"]))
        return found

    def _unhide(self, handles: Sequence[str]) -> None:
        for chunk in chunks(list(handles)):
            self.link.client.change_message_visibility_batch(
                QueueUrl=self.url,
                Entries=[{"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0} for i, h in enumerate(chunk)],
            )

    def _delete(self, handles: Sequence[str]) -> None:
        for chunk in chunks(list(handles)):
            self.link.client.delete_message_batch(
                QueueUrl=self.url,
                Entries=[{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(chunk)],
            )

    @reaching("list failed jobs")
    def failed_jobs(self, limit: int = 50) -> list[FailedJob]:
        """The newest failed jobs among the first :data:`SCAN_LIMIT` entries of
        the failed queue (each listing receives them all, then lets them go)."""
        found = self._scan()
        self._unhide([handle for _, handle in found])
        entries = sorted((failed for failed, _ in found), key=lambda f: f.failed_at, reverse=True)
        return entries[:limit]

    @reaching("count failed jobs")
    def failed_count(self) -> int:
        """The failed queue's approximate depth."""
        counts = self.link.attributes(self.url)
        return counts["ApproximateNumberOfMessages"] + counts["ApproximateNumberOfMessagesNotVisible"]

    @reaching("retry a failed job")
    def retry_failed(self, id: str) -> bool:
        """Queue a failed job again with fresh attempts (and remove it from the failed queue)."""
        found = self._scan()
        matches = [(failed, handle) for failed, handle in found if failed.id == id]
        others = [handle for failed, handle in found if failed.id != id]
        try:
            if not matches:
                return False
            failed = matches[0][0]
            if failed.job is None:
                others.extend(handle for _, handle in matches)
                raise PayloadError(
                    f"failed message {id} is not a rainier_sync job (unreadable); it can only be forgotten"
                )
            job = replace(failed.job, attempts=0, available_at=_clock.now(), receipt=None)
            url = self.link.url_of(job.queue)
            self.link.client.send_message(QueueUrl=url, **wire.entry(job, url, _clock.now(), fresh_dedup=True))
            self._delete([handle for _, handle in matches])
            return True
        finally:
            self._unhide(others)

    @reaching("forget a failed job")
    def forget_failed(self, id: str) -> bool:
        found = self._scan()
        matches = [handle for failed, handle in found if failed.id == id]
        self._unhide([handle for failed, handle in found if failed.id != id])
        if matches:
            self._delete(matches)
        return bool(matches)
