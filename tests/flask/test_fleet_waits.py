"""The Workers page's wait times: p50 and p95 from the histogram every worker adds to its counts."""

from __future__ import annotations

import re

from freezegun import freeze_time

from rainier_sync import Worker, WorkerOptions
from rainier_sync.flask.charts import build_wait_chart, duration
from rainier_sync.fleet import MinuteCounts

from .apps import Quiet, fleet_app


def test_the_workers_page_shows_wait_percentiles_per_queue_and_for_the_fleet() -> None:
    app, manager = fleet_app()
    with freeze_time("2026-05-01 09:30:00") as frozen:
        manager.dispatch_many([Quiet() for _ in range(10)])
        frozen.tick(3)  # each waits 3 s: bucket (2.5, 5]
        Worker(manager, options=WorkerOptions(queues=["default"], once=True)).run()
        frozen.move_to("2026-05-01 09:31:00")
        for _ in range(4):
            manager.dispatch_on("mail", Quiet())
        frozen.tick(0.2)  # each waits 200 ms: bucket (0.1, 0.25]
        Worker(manager, options=WorkerOptions(queues=["mail"], once=True)).run()
        response = app.test_client().get("/queues/workers")
    assert response.status_code == 200
    page = response.get_data(as_text=True)

    def cells(queue: str) -> tuple[str, str]:
        row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', page, re.S)
        assert row is not None, f"no row for queue {queue}"
        found = re.findall(r'<td class="wait p(?:50|95)">([^<]*)</td>', row.group(1))
        assert len(found) == 2
        return found[0], found[1]

    # Interpolated within the bucket: 2.5 + 2.5 * 0.5 and 2.5 + 2.5 * 0.95; 0.1 + 0.15 * 0.5 and 0.1 + 0.15 * 0.95.
    assert cells("default") == ("3.8 s", "4.9 s")
    assert cells("mail") == ("175 ms", "242 ms")
    # The fleet: 14 waits, 4 short; rank 7 and 13.3 fall in the 3 s bucket.
    assert '<span class="wait-p50">3.2 s</span>' in page and '<span class="wait-p95">4.8 s</span>' in page
    assert "over 14 first attempts" in page
    assert 'id="fleet-waits"' in page
    lines = re.findall(r'<polyline class="wait-line (p50|p95)" points="([^"]+)"', page)
    assert [name for name, _ in lines] == ["p50", "p95"]
    assert all(len(points.split()) == 2 for _, points in lines), "one point for each of the two minutes"
    assert "09:30 UTC: p95 wait 4.9 s (10 first attempts started)" in page
    assert "09:31 UTC: p50 wait 175 ms (4 first attempts started)" in page


def test_without_waits_the_page_says_so() -> None:
    app, _ = fleet_app()
    page = app.test_client().get("/queues/workers").get_data(as_text=True)
    assert 'id="no-waits"' in page and 'id="fleet-waits"' not in page


def test_the_wait_chart_breaks_its_lines_where_no_job_started_and_uses_a_log_scale() -> None:
    rows = [MinuteCounts(60 * n, waits={"q": {0.01: 2}} if n in (0, 1, 3) else {}) for n in range(5)]
    rows[3] = MinuteCounts(180, waits={"q": {10.0: 1}})
    chart = build_wait_chart(rows)
    assert not chart.empty
    p50 = [line["points"] for line in chart.lines if line["words"] == "p50"]
    assert [len(points.split()) for points in p50] == [2, 1], "minute 2 had no wait: the line breaks there"
    assert [rule["text"] for rule in chart.grid] == ["1 ms", "10 ms", "100 ms", "1 s", "10 s"]
    assert (chart.labels[0]["anchor"], chart.labels[-1]["anchor"]) == ("start", "end"), "kept inside the chart"
    ys = {dot["title"].split(" UTC")[0]: dot["y"] for dot in chart.dots if "p50" in dot["title"]}
    assert ys["00:00"] > ys["00:03"], "a longer wait is drawn higher"


def test_durations_read_as_people_write_them() -> None:
    assert [duration(s) for s in (0.0042, 0.175, 1.24, 35.2, 200, 7500)] == [
        "4.2 ms",
        "175 ms",
        "1.2 s",
        "35 s",
        "3m 20s",
        "2h 5m",
    ]
