"""moto's AWS server on loopback: SQS for the SQS driver, and every other moto
API (S3 for tansu's ``s3://`` engine, say).

- ``sqs_endpoint`` (session): the URL of a moto server started in this process
  on 127.0.0.1 and a free port, or ``SQS_ENDPOINT`` when that is set (then
  nothing is started). Fake credentials and a region are set for the session,
  and AWS config files are ignored, so nothing can reach a real AWS account;
  always pass the endpoint explicitly too.
- ``moto_server_process`` (function): a :class:`MotoServer` of the test's own,
  which ``stop()`` takes off the network and ``start()`` brings back on the same
  port, for outage tests. moto keeps its state in the process, so queues and
  messages survive the restart, as they would on SQS.
- ``sqs_client``: a boto3 SQS client on ``sqs_endpoint``.

Tests isolate by unique queue names; nothing resets moto's state, which other
suites (tansu's buckets) may be using.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Iterable, Iterator
from urllib.parse import urlsplit

import pytest

from tests.support import missing_service

REGION = "us-east-1"
_FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
_HOW_TO_START = (
    ".venv/bin/pip install 'moto[server]' (the tests start it), "
    "or run moto_server -H 127.0.0.1 -p 5000 and set SQS_ENDPOINT=http://127.0.0.1:5000"
)


def _serialize_moto_queues() -> None:
    """Hold each queue's own lock around moto's receive, delete and visibility change.

    moto's ``Queue.delete_message`` rebuilds the queue's message list outside
    any lock, so two deletes at once can bring a deleted message back (and a
    send during a delete can vanish), and its receive checks a message is
    visible and marks it received without one, so two receives at once can
    both take it. SQS does none of this, and tests that count runs see it. The
    lock is moto's own (a Condition over an RLock), which a long poll releases
    while it waits.
    """
    from moto.sqs import models

    if getattr(models, "_rainier_serialized", False):
        return
    backend_class, queue_class = models.SQSBackend, models.Queue

    def per_queue(method: Any) -> Any:
        def locked(self: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
            try:
                queue = self.get_queue(queue_name)
            except Exception:  # noqa: BLE001 - moto's own error, from the call itself
                return method(self, queue_name, *args, **kwargs)
            with queue._messages_lock:
                return method(self, queue_name, *args, **kwargs)

        return locked

    def own_lock(method: Any) -> Any:
        def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
            with self._messages_lock:
                return method(self, *args, **kwargs)

        return locked

    backend_class.receive_message = per_queue(backend_class.receive_message)
    backend_class.change_message_visibility = per_queue(backend_class.change_message_visibility)
    queue_class.delete_message = own_lock(queue_class.delete_message)
    queue_class.add_message = own_lock(queue_class.add_message)
    models._rainier_serialized = True


def in_flight_now(queue_urls: Iterable[str]) -> set[tuple[str, str]] | None:
    """The messages on ``queue_urls`` received and neither deleted nor visible
    again, as (message id, receipt handle of the last receive), read in one
    pass from the moto server in this process (a count over HTTP takes a call
    per queue, while reservations go on lapsing); None when the server is not
    in this process."""
    from moto.sqs.models import sqs_backends

    found: set[tuple[str, str]] = set()
    for url in queue_urls:
        account, name = urlsplit(url).path.strip("/").split("/")[-2:]
        try:
            queue = sqs_backends[account][REGION].queues[name]
        except KeyError:
            return None
        found.update((m.id, m.receipt_handle) for m in list(queue._messages) if not m.visible)
    return found


class MotoServer:
    """moto's server in this process, on 127.0.0.1; stoppable and restartable on one port."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> str:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        _serialize_moto_queues()
        if self._server is None:
            server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            server.start()
            self.port = server.get_host_and_port()[1]
            self._server = server
        return self.url

    def stop(self) -> None:
        """Stop serving and close the listening socket (connections are refused)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            # ThreadedMotoServer.stop() leaves the socket bound, which would accept
            # connections nobody answers and keep the port from a restart.
            server._server.server_close()


def _moto_importable() -> bool:
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session")
def _aws_fake_env() -> Iterator[None]:
    patch = pytest.MonkeyPatch()
    for name, value in _FAKE_ENV.items():
        patch.setenv(name, value)
    try:
        yield
    finally:
        patch.undo()


@pytest.fixture(scope="session")
def sqs_endpoint(_aws_fake_env: None) -> Iterator[str]:
    external = os.environ.get("SQS_ENDPOINT")
    if external:
        yield external
        return
    if not _moto_importable():
        missing_service("moto's server", _HOW_TO_START)
    server = MotoServer()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def moto_server_process(_aws_fake_env: None) -> Iterator[MotoServer]:
    if not _moto_importable():
        missing_service("moto's server", _HOW_TO_START)
    server = MotoServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def sqs_client_for(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture(scope="session")
def sqs_client(sqs_endpoint: str) -> Any:
    return sqs_client_for(sqs_endpoint)


def unique_queue_name(prefix: str = "t", fifo: bool = False) -> str:
    """A queue name no other test uses (SQS names: up to 80 of [A-Za-z0-9_-])."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}" + (".fifo" if fifo else "")
