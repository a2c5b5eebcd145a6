"""SQS driver benchmark against moto's server on loopback.

    .venv/bin/python tests/benchmarks/bench_sqs.py [--jobs 1000] [--depth 200] [--threads 10] [--probes 20]

Starts ``python -m moto.server`` on 127.0.0.1 and a free port (its own
process, so it does not share this one's GIL), then measures:

- dispatch: ``dispatch`` one at a time, and ``dispatch_many`` (SendMessageBatch);
- drain: a ``once`` worker with ``--threads`` threads runs no-op jobs, the
  backlog refilled to ``--depth`` between rounds (moto slows with queue depth,
  so the queue is kept shallow);
- the API calls each phase made, jobs per ReceiveMessage / DeleteMessageBatch
  call, and the share of calls that carried a batch;
- wake-up: an idle worker (sleep 60 s, long polling) and one probe at a time,
  from just before ``dispatch`` to the first line of ``handle``.

Figures are for comparing runs on one machine: moto is not SQS (a real SQS
call costs 10-30 ms of network rather than moto's few ms of Python).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import boto3
from benchjobs import Noop, Probe, probe_started, started_at

from rainier_sync import Container, JobRegistry, QueueManager, Worker, WorkerOptions
from rainier_sync.drivers.sqs import SqsQueue

BATCHED = {"SendMessageBatch", "DeleteMessageBatch", "ChangeMessageVisibilityBatch"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("moto's server did not start within 15 s")


class Calls:
    """API calls made through one boto3 client, by operation, plus jobs moved per call."""

    def __init__(self, client: Any) -> None:
        self.counts: dict[str, int] = {}
        self.entries: dict[str, int] = {}
        self.multi = 0  # calls that carried more than one job
        client.meta.events.register("before-parameter-build.sqs", self._before)
        client.meta.events.register("after-call.sqs", self._after)

    def _before(self, model: Any, params: dict[str, Any], **_: Any) -> None:
        self.counts[model.name] = self.counts.get(model.name, 0) + 1
        if isinstance(params.get("Entries"), list):
            self.entries[model.name] = self.entries.get(model.name, 0) + len(params["Entries"])
            self.multi += len(params["Entries"]) > 1

    def _after(self, model: Any, parsed: dict[str, Any], **_: Any) -> None:
        if model.name == "ReceiveMessage":
            got = len(parsed.get("Messages", []))
            self.entries["ReceiveMessage"] = self.entries.get("ReceiveMessage", 0) + got
            self.multi += got > 1

    def reset(self) -> None:
        self.counts.clear()
        self.entries.clear()
        self.multi = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=200)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--probes", type=int, default=20)
    args = parser.parse_args()

    proc, endpoint = start_moto()
    try:
        run(endpoint, args)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run(endpoint: str, args: argparse.Namespace) -> None:
    admin = boto3.client(
        "sqs", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    suffix = os.urandom(4).hex()
    url = admin.create_queue(QueueName=f"bench-{suffix}")["QueueUrl"]
    failed = admin.create_queue(QueueName=f"bench-failed-{suffix}")["QueueUrl"]
    driver = SqsQueue(
        url,
        failed_queue_url=failed,
        endpoint=endpoint,
        region="us-east-1",
        key="x",
        secret="x",
        visibility_timeout=120,
        wait_time=20,
    )
    registry = JobRegistry().with_job(Noop).with_job(Probe)
    manager = QueueManager({"sqs": driver}, registry=registry, container=Container())
    calls = Calls(driver.client)
    load = os.getloadavg()
    print(f"moto_server at {endpoint}; load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"jobs={args.jobs} depth<={args.depth} threads={args.threads}")

    single = min(200, args.jobs)
    started = time.perf_counter()
    for _ in range(single):
        manager.dispatch(Noop())
    elapsed = time.perf_counter() - started
    print(f"dispatch, one at a time: {single / elapsed:8.0f} jobs/s ({single} jobs, {calls.counts})")
    admin.purge_queue(QueueUrl=url)

    rounds = max(1, args.jobs // args.depth)
    dispatch_time = drain_time = 0.0
    dispatch_calls: dict[str, int] = {}
    drained = 0
    drain_counts: dict[str, int] = {}
    drain_entries: dict[str, int] = {}
    drain_multi = 0
    for _ in range(rounds):
        calls.reset()
        started = time.perf_counter()
        manager.dispatch_many([Noop() for _ in range(args.depth)])
        dispatch_time += time.perf_counter() - started
        for name, n in calls.counts.items():
            dispatch_calls[name] = dispatch_calls.get(name, 0) + n
        calls.reset()
        worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=args.threads, once=True))
        started = time.perf_counter()
        stats = worker.run()
        drain_time += time.perf_counter() - started
        drained += stats.processed
        drain_multi += calls.multi
        for name, n in calls.counts.items():
            drain_counts[name] = drain_counts.get(name, 0) + n
        for name, n in calls.entries.items():
            drain_entries[name] = drain_entries.get(name, 0) + n
    total = rounds * args.depth
    print(
        f"dispatch_many:           {total / dispatch_time:8.0f} jobs/s ({total} jobs, {dispatch_calls}, "
        f"{total / max(1, dispatch_calls.get('SendMessageBatch', 1)):.1f} jobs per SendMessageBatch)"
    )
    receive_calls = drain_counts.get("ReceiveMessage", 0)
    delete_calls = drain_counts.get("DeleteMessageBatch", 0)
    all_calls = sum(drain_counts.values())
    print(f"drain ({args.threads} threads):   {drained / drain_time:8.0f} jobs/s ({drained} jobs, {drain_counts})")
    print(
        f"  jobs per ReceiveMessage: {drain_entries.get('ReceiveMessage', 0) / max(1, receive_calls):.1f}, "
        f"per DeleteMessageBatch: {drain_entries.get('DeleteMessageBatch', 0) / max(1, delete_calls):.1f}, "
        f"calls carrying more than one job: {drain_multi}/{all_calls} ({100 * drain_multi / max(1, all_calls):.0f}%)"
    )
    sends = dispatch_calls.get("SendMessageBatch", 0) + dispatch_calls.get("SendMessage", 0)
    print(
        f"  API calls per job, dispatch_many + drain: {(sends + all_calls) / max(1, drained):.2f} "
        f"(one at a time it would be 3: send, receive, delete)"
    )

    if args.probes:
        latency(manager, args.probes)
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    driver.close()
    for queue in (url, failed):
        admin.delete_queue(QueueUrl=queue)


def latency(manager: QueueManager, probes: int) -> None:
    worker = Worker(manager, options=WorkerOptions(queues=["default"], concurrency=2, sleep=60))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while worker.stats.idles < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        samples: list[float] = []
        for _ in range(probes):
            probe_started.clear()
            before = time.perf_counter()
            manager.dispatch(Probe())
            if not probe_started.wait(30):
                raise SystemExit("a probe did not start within 30 s")
            samples.append((started_at[-1] - before) * 1000)
            time.sleep(0.05)
    finally:
        worker.stop()
        worker.join(10)
    samples.sort()
    print(
        f"idle wake-up (dispatch to handle, {probes} probes): median {statistics.median(samples):.1f} ms, "
        f"p90 {samples[int(len(samples) * 0.9) - 1]:.1f} ms, max {samples[-1]:.1f} ms"
    )


if __name__ == "__main__":
    main()
