"""The ``listing`` capability on every driver: a driver that declares it lists
each state's jobs in that state's order, pages, filters by name and finds one
job by id; one that does not refuses both methods by name."""

from __future__ import annotations

import itertools
from typing import Iterator

import pytest

from rainier_sync import QueuedJob, _clock
from rainier_sync.drivers.base import BaseQueue
from rainier_sync.errors import CapabilityError
from rainier_sync.types import ListedJob

from .harness import Harness, harness_modules, load

_ids = itertools.count(1)


@pytest.fixture(params=harness_modules())
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from load(request.param)(request)


@pytest.fixture
def q(h: Harness) -> Iterator[BaseQueue]:
    driver = h.make()
    try:
        yield driver
    finally:
        driver.close()


@pytest.fixture
def lq(q: BaseQueue) -> BaseQueue:
    """A driver that declares ``listing``."""
    if not q.capabilities.listing:
        pytest.skip(f"{q.kind} does not declare listing: test_a_driver_without_listing_refuses_it holds it to that")
    return q


def job(
    name: str = "contract.listed", *, queue: str = "default", delay: float = 0.0, priority: int = 0, **payload: object
) -> QueuedJob:
    n = next(_ids)
    now = _clock.now()
    return QueuedJob(
        id=f"listed-{n:05d}-{id(payload)}",
        name=name,
        queue=queue,
        payload=dict(payload) or {"n": n},
        max_attempts=3,
        priority=priority,
        available_at=now + delay,
        dispatched_at=now,
    )


def ids(listed: list[ListedJob]) -> list[str]:
    return [entry.job.id for entry in listed]


def reserve_one_by_one(q: BaseQueue, queue: str = "default") -> list[QueuedJob]:
    taken: list[QueuedJob] = []
    for _ in range(100):
        got = q.reserve([queue])
        if got is None:
            break
        taken.append(got)
    return taken


# -- a driver that does not declare listing -------------------------------------------------------


def test_a_driver_without_listing_refuses_it(q: BaseQueue) -> None:
    if q.capabilities.listing:
        pytest.skip(f"{q.kind} declares listing: the tests below hold it to it")
    with pytest.raises(CapabilityError, match="'listing'"):
        q.list_jobs("default", "ready")
    with pytest.raises(CapabilityError, match="'listing'"):
        q.find_job("some-id")


# -- each state, in its order ---------------------------------------------------------------------


def test_ready_jobs_list_in_the_order_they_are_claimed(h: Harness, lq: BaseQueue) -> None:
    pushed = [
        job(priority=5),
        job(priority=0),
        job(priority=-3),
        job(priority=0, delay=-60),  # due a minute ago
        job(priority=5),
        job(priority=0),
    ]
    for one in pushed:
        lq.push(one)
    lq.push(job(priority=5, delay=h.delay))  # becomes due below, after the others
    lq.push(job(priority=0, delay=h.delay * 3))  # still delayed
    lq.push(job(queue="other"))
    h.advance(h.delay + 1)
    listed = lq.list_jobs("default", "ready", limit=100)
    assert len(listed) == 7
    assert all(entry.state == "ready" and entry.reserved_until is None for entry in listed)
    assert listed[0].job.id == pushed[2].id, "the lowest priority first"
    assert {entry.job.queue for entry in listed} == {"default"}
    claimed = reserve_one_by_one(lq)
    assert ids(listed) == [one.id for one in claimed], "ready lists in the order reserve hands out"


def test_delayed_jobs_list_by_due_time(h: Harness, lq: BaseQueue) -> None:
    later, soon, between = job(delay=h.delay * 3), job(delay=h.delay), job(delay=h.delay * 2, priority=-5)
    lq.push_many([later, soon, between, job(), job(queue="other", delay=h.delay)])
    listed = lq.list_jobs("default", "delayed")
    assert ids(listed) == [soon.id, between.id, later.id]
    assert all(entry.state == "delayed" and entry.reserved_until is None for entry in listed)
    assert listed[0].job.available_at == pytest.approx(soon.available_at, abs=0.01)
    assert listed[0].job.attempts == 0
    h.advance(h.delay + 1)
    assert ids(lq.list_jobs("default", "delayed")) == [between.id, later.id], "a job due now is ready"
    assert soon.id in ids(lq.list_jobs("default", "ready"))


def test_reserved_jobs_list_by_when_their_reservation_lapses(h: Harness, lq: BaseQueue) -> None:
    lq.push_many([job(), job(), job(), job()])
    first = lq.reserve(["default"])
    h.advance(1)
    second = lq.reserve(["default"])
    h.advance(1)
    third = lq.reserve(["default"])
    assert first is not None and second is not None and third is not None
    lq.extend(first, h.reservation * 2)
    now = _clock.now()
    listed = lq.list_jobs("default", "reserved")
    assert ids(listed) == [second.id, third.id, first.id]
    assert all(entry.state == "reserved" for entry in listed)
    until = [entry.reserved_until for entry in listed]
    assert until == [
        pytest.approx(now - 1 + h.reservation, abs=0.01),
        pytest.approx(now + h.reservation, abs=0.01),
        pytest.approx(now + h.reservation * 2, abs=0.01),
    ]
    assert [entry.job.attempts for entry in listed] == [1, 1, 1], "a reserved job counts its running attempt"
    assert len(lq.list_jobs("default", "ready")) == 1
    for entry in lq.list_jobs("default", "ready"):
        assert entry.reserved_until is None


def test_a_released_job_is_ready_again_with_its_attempts_and_a_delayed_one_waits(h: Harness, lq: BaseQueue) -> None:
    lq.push_many([job(), job()])
    first, second = lq.reserve(["default"]), lq.reserve(["default"])
    assert first is not None and second is not None
    lq.release(first, 0)
    lq.release(second, h.delay)
    [ready] = lq.list_jobs("default", "ready")
    assert (ready.job.id, ready.job.attempts) == (first.id, 1)
    [delayed] = lq.list_jobs("default", "delayed")
    assert delayed.job.id == second.id and delayed.job.attempts == 1
    assert delayed.job.available_at == pytest.approx(_clock.now() + h.delay, abs=0.01)
    assert lq.list_jobs("default", "reserved") == []


def test_a_job_acknowledged_is_listed_no_more(lq: BaseQueue) -> None:
    lq.push_many([job(), job()])
    done = lq.reserve(["default"])
    assert done is not None
    lq.acknowledge(done)
    assert lq.list_jobs("default", "reserved") == []
    assert done.id not in ids(lq.list_jobs("default", "ready"))
    assert lq.find_job(done.id) is None


# -- pages ----------------------------------------------------------------------------------------


def test_pages_follow_one_another(h: Harness, lq: BaseQueue) -> None:
    lq.push_many([job(priority=i % 3) for i in range(8)])
    lq.push_many([job(delay=h.delay + i) for i in range(5)])
    for state, total in (("ready", 8), ("delayed", 5)):
        whole = ids(lq.list_jobs("default", state, limit=100))  # type: ignore[arg-type]
        assert len(whole) == total
        paged = [ids(lq.list_jobs("default", state, offset=start, limit=3)) for start in range(0, total, 3)]  # type: ignore[arg-type]
        assert [len(page) for page in paged] == [3] * (total // 3) + ([total % 3] if total % 3 else [])
        assert sum(paged, []) == whole
        assert lq.list_jobs("default", state, offset=total) == []  # type: ignore[arg-type]
        assert lq.list_jobs("default", state, limit=0) == []  # type: ignore[arg-type]
    assert lq.list_jobs("nothing-here", "ready") == []


def test_a_page_asked_for_badly_is_refused_naming_what(lq: BaseQueue) -> None:
    with pytest.raises(ValueError, match="state"):
        lq.list_jobs("default", "running")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="offset"):
        lq.list_jobs("default", "ready", offset=-1)
    with pytest.raises(ValueError, match="limit"):
        lq.list_jobs("default", "ready", limit=-5)


# -- the name filter ------------------------------------------------------------------------------


NAMES = ["mail.Send", "mail.send_digest", "report%weekly", "reportXweekly", "report_x", "reportyx", "audit"]


def test_the_name_filter_keeps_names_that_contain_it_taking_wildcards_literally(lq: BaseQueue) -> None:
    pushed = {name: job(name) for name in NAMES}
    lq.push_many(list(pushed.values()))

    def named(text: str, offset: int = 0, limit: int = 100) -> list[str]:
        return [entry.job.name for entry in lq.list_jobs("default", "ready", name=text, offset=offset, limit=limit)]

    assert sorted(named("%")) == ["report%weekly"]
    assert sorted(named("t%w")) == ["report%weekly"]
    assert sorted(named("_")) == ["mail.send_digest", "report_x"]
    assert sorted(named("t_x")) == ["report_x"]
    assert sorted(named("SEND")) == ["mail.Send", "mail.send_digest"], "case is ignored"
    assert sorted(named("report")) == ["report%weekly", "reportXweekly", "report_x", "reportyx"]
    assert named("nothing like it") == []
    assert sorted(named("")) == sorted(NAMES), "an empty filter keeps every job"
    whole = named("report")
    assert named("report", offset=1, limit=2) == whole[1:3], "a filtered page counts matching jobs only"


def test_the_name_filter_applies_to_delayed_and_reserved_jobs(h: Harness, lq: BaseQueue) -> None:
    lq.push_many([job("a.keep", delay=h.delay), job("a.drop", delay=h.delay), job("b.keep"), job("b.drop")])
    taken = reserve_one_by_one(lq)
    assert len(taken) == 2
    assert [e.job.name for e in lq.list_jobs("default", "delayed", name="keep")] == ["a.keep"]
    assert [e.job.name for e in lq.list_jobs("default", "reserved", name="KEEP")] == ["b.keep"]
    assert lq.list_jobs("default", "reserved", name="%") == []


# -- one job by id --------------------------------------------------------------------------------


def test_find_job_finds_a_ready_a_delayed_and_a_reserved_job(h: Harness, lq: BaseQueue) -> None:
    running, ready, delayed = job("find.running"), job("find.ready", text="héllo ✓"), job("find.later", delay=h.delay)
    other_queue = job("find.elsewhere", queue="other")
    lq.push(running)
    taken = lq.reserve(["default"])
    assert taken is not None and taken.id == running.id
    lq.push_many([ready, delayed, other_queue])

    found = lq.find_job(ready.id)
    assert found is not None
    assert (found.state, found.reserved_until) == ("ready", None)
    assert (found.job.id, found.job.name, found.job.queue, found.job.payload) == (
        ready.id,
        "find.ready",
        "default",
        {"text": "héllo ✓"},
    )
    assert (found.job.attempts, found.job.max_attempts) == (0, 3)

    found = lq.find_job(delayed.id)
    assert found is not None and (found.state, found.reserved_until) == ("delayed", None)
    assert found.job.available_at == pytest.approx(delayed.available_at, abs=0.01)

    found = lq.find_job(running.id)
    assert found is not None and found.state == "reserved" and found.job.attempts == 1
    assert found.reserved_until == pytest.approx(_clock.now() + h.reservation, abs=0.01)

    found = lq.find_job(other_queue.id)
    assert found is not None and found.job.queue == "other"
    assert lq.find_job("no-such-job") is None


def test_a_listed_job_is_a_copy(lq: BaseQueue) -> None:
    pushed = job(items=[1, 2])
    lq.push(pushed)
    [listed] = lq.list_jobs("default", "ready")
    listed.job.payload["items"].append(3)  # type: ignore[attr-defined]
    found = lq.find_job(pushed.id)
    assert found is not None and found.job.payload == {"items": [1, 2]}
    taken = lq.reserve(["default"])
    assert taken is not None and taken.payload == {"items": [1, 2]}
