"""The Redis driver's listing where the contract suite does not reach: pages
across bands and the due part of the delayed set, the name filter's bound,
entries nobody can read, and ``find_job``: its id index, and the search of
a queue stored before the index, over several script calls."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from freezegun import freeze_time

from rainier_sync import QueuedJob, _clock
from rainier_sync.drivers import RedisQueue
from rainier_sync.drivers.paging import Page
from rainier_sync.drivers.redis import browse

from .test_driver import stream
from .test_unreadable import BAD

pytestmark = pytest.mark.redis


@pytest.fixture
def queue(redis_url: str, prefix: str) -> Iterator[RedisQueue]:
    with freeze_time("2026-03-01 12:00:00"):
        made = RedisQueue.from_url(redis_url, prefix=prefix)
        yield made
        made.close()


def job(name: str = "redis-tests.listed", *, delay: float = 0.0, priority: int = 0, **payload: Any) -> QueuedJob:
    now = _clock.now()
    return QueuedJob(
        id=uuid.uuid4().hex,
        name=name,
        queue="default",
        payload=payload or {"x": 1},
        priority=priority,
        available_at=now + delay,
        dispatched_at=now,
    )


def ids(page: list[Any]) -> list[str]:
    return [entry.job.id for entry in page]


@pytest.mark.parametrize("budget", [2, 3, 2000], ids=lambda n: f"{n}-a-call")
def test_pages_run_across_bands_and_the_due_delayed_jobs(
    queue: RedisQueue, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    # A reserve moves at most _PROMOTE due jobs per call; with 3, the rest come after every band.
    monkeypatch.setattr(browse, "_PROMOTE", 3)
    monkeypatch.setattr(browse, "CALL_BUDGET", budget)
    first = [job(priority=p) for p in (0, 2, 0, 2)]
    due = [job(priority=p, delay=5 + n) for n, p in enumerate((2, 0, 2, 0, 2))]
    queue.push_many(first + due)
    with freeze_time("2026-03-01 12:01:00"):
        whole = queue.list_jobs("default", "ready", limit=100)
        b0 = [first[0], first[2], due[1]]  # band 0: its entries, then the due jobs of the first 3
        b2 = [first[1], first[3], due[0], due[2]]
        assert ids(whole) == [j.id for j in b0 + b2 + [due[3], due[4]]]
        for size in (1, 2, 3, 4):
            paged = [queue.list_jobs("default", "ready", offset=start, limit=size) for start in range(0, 9, size)]
            assert sum((ids(p) for p in paged), []) == ids(whole), size
        assert [e.state for e in whole] == ["ready"] * 9
        assert whole[2].job.available_at == pytest.approx(due[1].available_at)
        kept = [e.job.id for e in queue.list_jobs("default", "ready", name="LISTED", offset=1, limit=7)]
        assert kept == ids(whole)[1:8], "a filtered walk resumes where each call stopped"


@pytest.mark.parametrize("budget", [3, 2000], ids=lambda n: f"{n}-a-call")
def test_a_name_filter_looks_at_a_bounded_number_of_jobs_and_says_so(
    queue: RedisQueue, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    monkeypatch.setattr(browse, "CALL_BUDGET", budget)
    queue.listing_scan = 20
    queue.push_many([job("other.kind") for _ in range(30)] + [job("wanted.kind")])

    page = queue.list_jobs("default", "ready", name="wanted")
    assert isinstance(page, Page)
    assert page == [] and not page.complete and page.bound == 20

    queue.push_many([job("wanted.kind") for _ in range(3)])
    assert len(queue.list_jobs("default", "ready", name="other", limit=5)) == 5
    found = queue.list_jobs("default", "ready", name="OTHER.K", limit=5)
    assert isinstance(found, Page) and found.complete and found.bound == 20
    unfiltered = queue.list_jobs("default", "ready", limit=100)
    assert isinstance(unfiltered, Page) and len(unfiltered) == 34 and unfiltered.complete
    assert unfiltered.bound is None


def test_a_name_filter_reads_names_that_json_escapes(queue: RedisQueue) -> None:
    names = ['say "hi"', "back\\slash", "tab\there", "naïve.Job"]
    queue.push_many([job(name) for name in names])
    for name, text in zip(names, ['"hi"', "\\", "\t", "NAïVE"], strict=True):
        assert [e.job.name for e in queue.list_jobs("default", "ready", name=text)] == [name], text
    assert [e.job.name for e in queue.list_jobs("default", "ready", name="naïve.j")] == ["naïve.Job"]


def test_entries_nobody_can_read_are_shown_not_raised(queue: RedisQueue, redis_client: Any, prefix: str) -> None:
    good = job()
    queue.push(good)
    for fields, _ in BAD.values():
        redis_client.xadd(stream(prefix), fields)
    redis_client.zadd(f"{prefix}default:delayed", {"not a delayed job": _clock.now() + 60})

    ready = queue.list_jobs("default", "ready", limit=100)
    assert ids(ready)[0] == good.id and len(ready) == 1 + len(BAD)
    for entry, (_, reason) in zip(ready[1:], BAD.values(), strict=True):
        meta = entry.job.meta or {}
        assert reason in meta["unreadable"] and entry.job.id.startswith("unreadable-default-")
        assert entry.job.payload == {} and meta["raw"]
    [delayed] = queue.list_jobs("default", "delayed")
    assert "not written by this driver" in (delayed.job.meta or {})["unreadable"]
    assert delayed.job.available_at == pytest.approx(_clock.now() + 60)


def counting_finds(queue: RedisQueue, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The first word of each ``find`` script reply, as ``find_job`` calls go."""
    calls: list[bytes] = []
    run = queue._run

    def counted(name: str, keys: list[str], args: list[Any]) -> Any:
        reply = run(name, keys, args)
        if name == "find":
            calls.append(reply[0])
        return reply

    monkeypatch.setattr(queue, "_run", counted)
    return calls


def index_of(queue: RedisQueue, redis_client: Any, name: str = "default") -> dict[str, str]:
    index = redis_client.hgetall(queue.keys.base(name) + "ids")
    return {key.decode(): value.decode() for key, value in index.items()}


def test_find_job_reads_a_queue_from_before_the_index_through_several_calls_once(
    queue: RedisQueue, monkeypatch: pytest.MonkeyPatch, redis_client: Any
) -> None:
    monkeypatch.setattr(browse, "CALL_BUDGET", 3)
    wanted = job(priority=4)
    lookalike = job(priority=-1, id=wanted.id)  # its payload holds "id":"<the id>", its envelope does not start so
    held = [job(priority=1) for _ in range(4)]
    queue.push_many(held)
    reserved = queue.reserve_many(["default"], 4)
    assert len(reserved) == 4
    later = [job(delay=60 + n) for n in range(4)]
    queue.push_many([lookalike, *[job(priority=2) for _ in range(5)], wanted, *later])
    base = queue.keys.base("default")
    redis_client.delete(base + "ids", base + "ids:whole")  # as a queue whose jobs were stored before the index

    calls = counting_finds(queue, monkeypatch)
    found = queue.find_job(wanted.id)
    assert found is not None and found.job.id == wanted.id and found.state == "ready"
    assert calls.count(b"found") == 1 and calls.count(b"more") >= 4, "three jobs a call"
    assert not redis_client.exists(base + "ids:whole"), "a search that stopped early read only part of the queue"
    calls.clear()
    assert queue.find_job("nowhere") is None
    assert calls.count(b"more") >= 4 and redis_client.exists(base + "ids:whole")
    assert len(index_of(queue, redis_client)) == 4 + 1 + 5 + 1 + 4

    calls.clear()
    found = queue.find_job(later[-1].id)
    assert found is not None and found.state == "delayed" and found.job.id == later[-1].id
    found = queue.find_job(reserved[-1].id)
    assert found is not None and found.state == "reserved" and found.reserved_until is not None
    assert queue.find_job("nowhere") is None
    assert calls == [b"found", b"found", b"end"], "one look in the index each"


def test_the_id_index_follows_a_job_wherever_it_goes_and_forgets_it_when_it_is_done(
    queue: RedisQueue, redis_client: Any
) -> None:
    moved = job(priority=3)
    queue.push(moved)
    assert queue.find_job(moved.id).state == "ready"  # type: ignore[union-attr]
    (taken,) = queue.reserve_many(["default"], 1)
    assert queue.find_job(moved.id).state == "reserved"  # type: ignore[union-attr]
    queue.release(taken, delay=30)
    assert index_of(queue, redis_client)[moved.id].startswith("d|")
    assert queue.find_job(moved.id).state == "delayed"  # type: ignore[union-attr]
    with freeze_time("2026-03-01 12:01:00"):
        (taken,) = queue.reserve_many(["default"], 1)  # promoted, then reserved
        assert queue.find_job(moved.id).state == "reserved"  # type: ignore[union-attr]
    with freeze_time("2026-03-01 13:00:00"):
        assert queue.reclaim_expired() == 1  # its reservation lapsed: a new entry of the stream
        found = queue.find_job(moved.id)
        assert found is not None and found.state == "ready"
        (taken,) = queue.reserve_many(["default"], 1)
        queue.acknowledge(taken)
        queue._sync()
    assert queue.find_job(moved.id) is None
    assert index_of(queue, redis_client) == {}

    failing = job()
    queue.push(failing)
    (taken,) = queue.reserve_many(["default"], 1)
    queue.fail(taken, "boom")
    assert queue.find_job(failing.id) is None and index_of(queue, redis_client) == {}
    queue.retry_failed(failing.id)
    assert queue.find_job(failing.id).state == "ready"  # type: ignore[union-attr]


def test_a_drain_leaves_the_id_index_empty_and_a_second_job_of_an_id_keeps_its_place(
    queue: RedisQueue, redis_client: Any
) -> None:
    jobs = [job() for _ in range(300)]
    queue.push_many(jobs)
    assert len(index_of(queue, redis_client)) == 300
    taken = queue.reserve_many(["default"], 300)
    queue.acknowledge_many(taken)
    queue._sync()
    assert index_of(queue, redis_client) == {}

    first, second = job(which=1), job(which=2)
    second.id = first.id
    queue.push(first)
    (held,) = queue.reserve_many(["default"], 1)
    queue.push(second)  # the index now points at the second
    queue.acknowledge(held)
    queue._sync()
    found = queue.find_job(first.id)
    assert found is not None and found.job.payload == {"which": 2} and found.state == "ready"


def test_ids_json_escapes_are_indexed_as_the_ids_they_spell(queue: RedisQueue, redis_client: Any) -> None:
    odd = [job() for _ in range(3)]
    for made, id in zip(odd, ['quote"d', "back\\slash", "naïve☃"], strict=True):
        made.id = id
    queue.push_many(odd)
    assert set(index_of(queue, redis_client)) == {made.id for made in odd}
    for made in odd:
        found = queue.find_job(made.id)
        assert found is not None and found.job.id == made.id
    queue.acknowledge_many(queue.reserve_many(["default"], 3))
    queue._sync()
    assert index_of(queue, redis_client) == {}


def test_a_second_job_of_an_id_is_found_after_the_one_the_index_pointed_at_is_done(
    queue: RedisQueue, redis_client: Any
) -> None:
    first, second = job(which=1), job(which=2)
    second.id = first.id  # a dispatch sent again after its reply was lost
    queue.push(first)
    queue.push(second)  # the index points at the second now
    taken = queue.reserve_many(["default"], 2)
    queue.acknowledge([one for one in taken if one.payload == {"which": 2}][0])
    queue._sync()
    found = queue.find_job(first.id)
    assert found is not None and found.job.payload == {"which": 1}
    queue.acknowledge([one for one in taken if one.payload == {"which": 1}][0])
    queue._sync()
    assert queue.find_job(first.id) is None
    assert not redis_client.sismember(queue.keys.base("default") + "ids:dup", first.id), "no longer marked"


def test_a_search_while_delayed_jobs_are_promoted_does_not_mark_the_index_whole(
    queue: RedisQueue, monkeypatch: pytest.MonkeyPatch, redis_client: Any
) -> None:
    monkeypatch.setattr(browse, "CALL_BUDGET", 3)
    delayed = [job(delay=30 + n / 100) for n in range(1200)]  # read 500 a call: a search of several calls
    queue.push_many(delayed)
    base = queue.keys.base("default")
    redis_client.delete(base + "ids", base + "ids:whole")  # as a queue stored before the index
    run = queue._run
    promoted = []

    def promoting(name: str, keys: list[str], args: list[Any]) -> Any:
        reply = run(name, keys, args)
        if name == "find" and not promoted and len(reply) > 1 and reply[1] == b"delayed":
            # a reserve promotes the first due jobs, which this search has read by position
            with freeze_time("2026-03-01 12:00:30.035"):
                promoted.extend(queue.reserve_many(["default"], 4))
        return reply

    monkeypatch.setattr(queue, "_run", promoting)
    assert queue.find_job("nowhere") is None
    assert len(promoted) == 4
    assert not redis_client.exists(base + "ids:whole"), "the search may have skipped jobs that moved"
    monkeypatch.setattr(queue, "_run", run)
    assert queue.find_job("nowhere") is None
    assert redis_client.exists(base + "ids:whole")
    for made in delayed[4:]:
        found = queue.find_job(made.id)
        assert found is not None and found.state == "delayed"
