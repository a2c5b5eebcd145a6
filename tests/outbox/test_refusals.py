"""What a connection refuses: at dispatch, what a direct dispatch would refuse
raises before the caller commits; at the relay, a job its connection refuses
is set aside on its own (its unique lock given back), never holding up the
rows behind it, and can be listed, put back and forgotten; a push that fails
part way deletes what went through, so nothing is sent twice."""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import pytest

from rainier_sync import Job, JobContext, JobRegistry, QueueManager
from rainier_sync.drivers import RedisQueue
from rainier_sync.drivers.base import BaseQueue
from rainier_sync.drivers.database import DatabaseLockStore
from rainier_sync.errors import PayloadError, QueueUnavailableError, RedisUnavailableError, UnknownQueueError
from rainier_sync.outbox import Outbox, Relay
from rainier_sync.types import QueuedJob

from .conftest import clean_redis, take
from .jobs import Note, registry

BIG = "x" * 1_100_000  # over what an SQS message and a Kafka record (by default) hold


def sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def send(manager: QueueManager, url: str, *dispatches: Any) -> list[str | None]:
    """Each of ``dispatches`` (a job, or a pending dispatch) within one committed transaction."""
    with closing(sqlite3.connect(sqlite_path(url))) as conn, conn:
        return [
            (manager.pending(item) if isinstance(item, Job) else item).within(conn).send() for item in dispatches
        ]


@pytest.fixture
def sqs_queues(sqs_endpoint: str) -> Iterator[Any]:
    """Make SQS queues (attributes as given) on moto; deleted afterwards."""
    from tests.services.moto import sqs_client_for, unique_queue_name

    client = sqs_client_for(endpoint=sqs_endpoint)
    made: list[str] = []

    def make(name: str, **attributes: str) -> str:
        queue = unique_queue_name(name, fifo=attributes.get("FifoQueue") == "true")
        url = str(client.create_queue(QueueName=queue, Attributes=attributes)["QueueUrl"])
        made.append(url)
        return url

    make.client = client  # type: ignore[attr-defined]
    yield make
    for url in made:
        client.delete_queue(QueueUrl=url)


def sqs_driver(sqs_endpoint: str, queue_url: str, failed_url: str, **options: Any) -> Any:
    from rainier_sync.drivers.sqs import SqsQueue
    from tests.services.moto import REGION

    return SqsQueue(
        queue_url, failed_queue_url=failed_url, endpoint=sqs_endpoint, region=REGION, key="testing", secret="testing",
        wait_time=0, **options,
    )  # fmt: skip


def on_sqs(client: Any, url: str) -> int:
    attributes = client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesDelayed"])


# -- refused at dispatch, before the commit -----------------------------------------------------


def test_what_a_direct_dispatch_to_sqs_refuses_is_refused_before_the_commit(
    sqlite_outbox_url: str, sqs_endpoint: str, sqs_queues: Any
) -> None:
    fifo = sqs_queues("orders", FifoQueue="true")
    driver = sqs_driver(sqs_endpoint, sqs_queues("plain"), sqs_queues("failed"), queue_urls={"orders": fifo})
    manager = QueueManager(connections={"sqs": driver}, registry=registry(), outbox=Outbox(sqlite_outbox_url))
    with pytest.raises(UnknownQueueError, match="queue 'nowhere' has no SQS URL on connection 'sqs'"):
        send(manager, sqlite_outbox_url, manager.pending(Note("x")).on_queue("nowhere"))
    with pytest.raises(PayloadError, match="SQS takes at most 1048576"):
        send(manager, sqlite_outbox_url, Note(BIG))
    with pytest.raises(PayloadError, match="'orders' is a FIFO queue, and SQS FIFO queues take no per-message delay"):
        send(manager, sqlite_outbox_url, manager.pending(Note("later")).on_queue("orders").delay(60))
    assert manager.outbox is not None and manager.outbox.size() == 0 and manager.outbox.refused_count() == 0
    manager.close()


def test_a_record_over_the_kafka_producers_limit_is_refused_before_the_commit(
    sqlite_outbox_url: str, kafka_target: BaseQueue
) -> None:
    manager = QueueManager(connections={"k": kafka_target}, registry=registry(), outbox=Outbox(sqlite_outbox_url))
    with pytest.raises(PayloadError, match="takes records of at most 1000000 bytes \\(message.max.bytes"):
        send(manager, sqlite_outbox_url, Note("before"), Note(BIG))
    with pytest.raises(PayloadError, match="cannot be a Kafka topic"):
        send(manager, sqlite_outbox_url, manager.pending(Note("x")).on_queue("no spaces"))
    assert manager.outbox is not None and manager.outbox.size() == 0, "the whole transaction rolled back"
    manager.close()


# -- refused at the relay: set aside on its own ---------------------------------------------------


def test_a_job_sqs_refuses_at_the_relay_is_set_aside_and_the_rows_behind_it_go(
    sqlite_outbox_url: str, sqs_endpoint: str, sqs_queues: Any
) -> None:
    """A queue whose MaximumMessageSize is 1 KiB refuses a 2 KB job the
    driver cannot know of: only that row is set aside."""
    url = sqs_queues("small", MaximumMessageSize="1024")
    manager = QueueManager(
        connections={"sqs": sqs_driver(sqs_endpoint, url, sqs_queues("failed"))}, registry=registry(),
        outbox=Outbox(sqlite_outbox_url),
    )  # fmt: skip
    ids = send(manager, sqlite_outbox_url, Note("x" * 2000), *(Note(f"ok {i}") for i in range(5)))
    relay = Relay(manager)
    assert relay.run_once() == 5, "no outage: run_once returns"
    assert (relay.stats.relayed, relay.stats.refused) == (5, 1)
    assert on_sqs(sqs_queues.client, url) == 5
    outbox = manager.outbox
    assert outbox is not None and outbox.size() == 0
    [row] = outbox.refused()
    assert row.error.startswith("connection 'sqs' (sqs) refused it: ") and "shorter than 1024 bytes" in row.error
    assert (row.connection, row.job["id"], row.job["name"]) == ("sqs", ids[0], "outbox.note")
    assert relay.run_once() == 0, "set aside: not taken again"
    manager.close()


def test_a_job_the_relays_kafka_refuses_is_set_aside_and_nothing_is_produced_twice(
    sqlite_outbox_url: str, kafka_brokers: str
) -> None:
    """The relay's producer takes smaller records than the dispatcher's (settings that
    differ between deploys): the records before the refused one reach Kafka once."""
    from rainier_sync.drivers.kafka import KafkaQueue
    from rainier_sync.locks import MemoryLockStore
    from tests.services.tansu import FAST_GROUP

    tag = uuid.uuid4().hex[:10]

    def kafka(**producer: Any) -> Any:
        return KafkaQueue(
            kafka_brokers, group=f"outbox-{tag}", topic_prefix=f"outbox-{tag}.", lease=30, locks=MemoryLockStore(),
            producer_config={"batch.num.messages": 1, **producer}, consumer_config=FAST_GROUP,
        )  # fmt: skip

    dispatcher = QueueManager(
        connections={"k": kafka(**{"message.max.bytes": 2_000_000})}, registry=registry(),
        outbox=Outbox(sqlite_outbox_url),
    )  # fmt: skip
    send(dispatcher, sqlite_outbox_url, *(Note(f"ok {i}") for i in range(3)), Note(BIG), Note("after"))
    target = kafka()
    manager = QueueManager(connections={"k": target}, registry=registry(), outbox=Outbox(sqlite_outbox_url))
    relay = Relay(manager)
    for _ in range(3):
        relay.run_once()
    assert (relay.stats.relayed, relay.stats.refused) == (4, 1)
    texts = [job.payload["text"] for job in take(target, 4)]
    assert sorted(texts) == ["after", "ok 0", "ok 1", "ok 2"]
    assert manager.outbox is not None and "message.max.bytes" in manager.outbox.refused()[0].error
    manager.close()
    dispatcher.close()


@dataclass
class Report(Job):
    NAME = "outbox.report"

    key: str
    blob: str

    def unique_id(self) -> str | None:
        return self.key

    def handle(self, context: JobContext) -> None:
        pass


def test_a_unique_job_set_aside_gives_its_lock_back(
    sqlite_outbox_url: str, sqs_endpoint: str, sqs_queues: Any
) -> None:
    url = sqs_queues("small", MaximumMessageSize="1024")
    locks = DatabaseLockStore.from_url(sqlite_outbox_url)
    manager = QueueManager(
        connections={"sqs": sqs_driver(sqs_endpoint, url, sqs_queues("failed"))},
        registry=JobRegistry().with_job(Report), outbox=Outbox(sqlite_outbox_url), locks=locks,
    )  # fmt: skip
    send(manager, sqlite_outbox_url, Report("r1", "x" * 2000))
    relay = Relay(manager)
    relay.run_once()
    assert relay.stats.refused == 1
    assert locks.owner("outbox.report:r1") is None, "its lock went with it"
    [second] = send(manager, sqlite_outbox_url, Report("r1", "small"))
    assert second is not None, "not dropped as the duplicate of a job that exists nowhere"
    assert relay.run_once() == 1 and relay.stats.duplicates == 0
    assert on_sqs(sqs_queues.client, url) == 1
    manager.close()
    locks.close()


# -- set aside, then put back or forgotten --------------------------------------------------------


def test_a_row_for_a_queue_the_relay_does_not_know_yet_is_put_back_once_it_does(
    sqlite_outbox_url: str, sqs_endpoint: str, sqs_queues: Any
) -> None:
    """A rolling deploy: the web app knows queue 'new', the relay's configuration not yet."""
    default, failed, new = sqs_queues("default"), sqs_queues("failed"), sqs_queues("new")
    web = QueueManager(
        connections={"sqs": sqs_driver(sqs_endpoint, default, failed, queue_urls={"new": new})},
        registry=registry(), outbox=Outbox(sqlite_outbox_url),
    )  # fmt: skip
    send(web, sqlite_outbox_url, web.pending(Note("to new")).on_queue("new"), Note("to default"))
    old = QueueManager(
        connections={"sqs": sqs_driver(sqs_endpoint, default, failed)}, registry=registry(),
        outbox=Outbox(sqlite_outbox_url),
    )  # fmt: skip
    assert Relay(old).run_once() == 1
    outbox = old.outbox
    assert outbox is not None
    [row] = outbox.refused()
    assert "queue 'new' has no SQS URL on connection 'sqs'" in row.error
    assert outbox.retry_refused(row.seq) == 1 and outbox.refused_count() == 0
    assert Relay(web).run_once() == 1, "the new relay knows the queue"
    assert (on_sqs(sqs_queues.client, new), on_sqs(sqs_queues.client, default)) == (1, 1)
    assert outbox.retry_refused() == 0 and not outbox.forget_refused(row.seq)
    web.close()
    old.close()


def test_refused_rows_are_forgotten_one_by_one(sqlite_outbox_url: str, redis_target: BaseQueue) -> None:
    outbox = Outbox(sqlite_outbox_url)
    with closing(sqlite3.connect(sqlite_path(sqlite_outbox_url))) as conn, conn:
        for body in ("not json", "[]"):
            conn.execute("INSERT INTO rainier_outbox (connection, body) VALUES ('fast', ?)", (body,))
    manager = QueueManager(connections={"fast": redis_target}, registry=registry(), outbox=outbox)
    Relay(manager).run_once()
    rows = outbox.refused()
    assert [row.error.split(":")[0] for row in rows] == ["unreadable", "unreadable"] and rows[0].job == {}
    assert outbox.forget_refused(rows[0].seq) and not outbox.forget_refused(rows[0].seq)
    assert [row.seq for row in outbox.refused()] == [rows[1].seq]
    manager.close()


# -- a push that fails part way ---------------------------------------------------------------------


def test_a_push_to_sqs_cut_off_part_way_deletes_what_went_through(
    sqlite_outbox_url: str, sqs_endpoint: str, sqs_queues: Any
) -> None:
    """The connection drops on the third SendMessageBatch of a relay batch of
    30: the 20 sent are deleted, the next pass sends the other 10."""
    import botocore.exceptions

    url = sqs_queues("default")
    driver = sqs_driver(sqs_endpoint, url, sqs_queues("failed"), timeout=1)
    calls = {"cut": True}

    def cut_off_the_third(params: dict[str, Any], **_: Any) -> None:
        # Known by what it carries (notes n20 to n29), not by counting calls: on a
        # busy machine a slow reply to the second is sent again, which is a call too.
        third = any('n25"' in entry["MessageBody"] for entry in params.get("Entries", []))
        if calls["cut"] and third:
            raise botocore.exceptions.EndpointConnectionError(endpoint_url=sqs_endpoint)

    driver.client.meta.events.register("before-parameter-build.sqs.SendMessageBatch", cut_off_the_third)
    manager = QueueManager(connections={"sqs": driver}, registry=registry(), outbox=Outbox(sqlite_outbox_url))
    send(manager, sqlite_outbox_url, *(Note(f"n{i}") for i in range(30)))
    relay = Relay(manager)
    with pytest.raises(QueueUnavailableError) as caught:
        relay.run_once()
    assert "did not take 10 job(s) (outbox rows 21 (job " in str(caught.value)
    outbox = manager.outbox
    assert outbox is not None and outbox.size() == 10 and relay.stats.relayed == 20
    calls["cut"] = False
    relay._resting.clear()
    assert relay.run_once() == 10
    assert on_sqs(sqs_queues.client, url) == 30
    manager.close()


class CountingRedis(RedisQueue):
    """A Redis connection that records each ``push_many`` (its queue and size),
    and fails the one numbered ``fail_at`` as a Redis out of reach would."""

    fail_at: int | None = None

    def push_many(self, jobs: Sequence[QueuedJob]) -> list[str]:
        self.sizes.append((jobs[0].queue, len(jobs)))
        if self.fail_at == len(self.sizes):
            raise RedisUnavailableError("redis connection 'fast': gone for a moment")
        return super().push_many(jobs)

    @classmethod
    def on(cls, redis_url: str) -> CountingRedis:
        driver = cls.from_url(redis_url, prefix=f"rsoutbox:{uuid.uuid4().hex[:12]}:")
        driver.sizes = []
        return driver


def test_a_relay_pushes_to_redis_what_one_script_call_stores_whole(sqlite_outbox_url: str, redis_url: str) -> None:
    """A batch of 2,500 over two queues goes per queue in pieces of 1,000 at most;
    one that fails leaves the pieces after it, and nothing is pushed twice."""
    driver = CountingRedis.on(redis_url)
    driver.fail_at = 3
    manager = QueueManager(connections={"fast": driver}, registry=registry(), outbox=Outbox(sqlite_outbox_url))
    with closing(sqlite3.connect(sqlite_path(sqlite_outbox_url))) as conn, conn:
        jobs = [manager.build(Note(f"n{i}"), connection="fast", queue="b" if i % 5 == 4 else "a") for i in range(2500)]
        manager.send_queued("fast", jobs, within=conn)
    relay = Relay(manager, batch=2500)
    with pytest.raises(QueueUnavailableError, match="did not take 500 job\\(s\\)"):
        relay.run_once()
    assert driver.sizes == [("a", 1000), ("a", 1000), ("b", 500)]
    relay._resting.clear()
    assert relay.run_once() == 500
    assert (driver.size("a"), driver.size("b")) == (2000, 500)
    clean_redis(driver)
    manager.close()
