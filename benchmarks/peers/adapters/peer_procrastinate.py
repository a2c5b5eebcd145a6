"""Procrastinate on PostgreSQL (psycopg 3).

Worker: ``procrastinate --app adapters.peer_procrastinate.app worker --concurrency C``.
"""

from __future__ import annotations

from collections.abc import Sequence

import procrastinate

from adapters.base import Adapter, Settings, record_run, script

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=Settings.from_env().pg_dsn))


@app.task(name="noop")
def noop(index: int) -> None:
    record_run(index)


class ProcrastinateAdapter(Adapter):
    name = "procrastinate"
    library = "procrastinate"
    backend = "postgres"
    job_module = "adapters.peer_procrastinate"
    batch_api = "task.batch_defer(...)"

    def prepare(self) -> None:
        app.open()
        app.schema_manager.apply_schema()

    def reset(self) -> None:
        import psycopg

        with psycopg.connect(self.settings.pg_dsn, autocommit=True) as conn:
            conn.execute(
                "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers,"
                " procrastinate_workers CASCADE"
            )

    def worker_commands(self) -> list[list[str]]:
        concurrency = str(self.settings.concurrency)
        return [
            script(
                "procrastinate",
                "--app",
                f"{self.job_module}.app",
                "--log-level",
                "warning",
                "worker",
                "--concurrency",
                concurrency,
            )
        ]

    def enqueue_one(self, index: int) -> None:
        noop.defer(index=index)

    def enqueue_many(self, indices: Sequence[int]) -> None:
        noop.batch_defer(*({"index": index} for index in indices))

    def close(self) -> None:
        app.close()
