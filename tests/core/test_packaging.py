"""``import rainier_sync`` needs only blinker and tenacity; optional drivers say which extra they need."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCK = textwrap.dedent(
    """
    import sys
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"psycopg", "redis", "boto3", "botocore", "confluent_kafka", "flask", "pymysql"}:
                raise ImportError(f"blocked: {name}")
            return None
    sys.meta_path.insert(0, Blocker())
    """
)


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60)


def test_import_needs_only_blinker_and_tenacity() -> None:
    done = run(
        """
        import rainier_sync, rainier_sync.drivers, rainier_sync.locks, rainier_sync.testing
        from rainier_sync.drivers import MemoryQueue, SyncQueue
        from rainier_sync.locks import MemoryLockStore
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {"psycopg", "redis", "boto3", "confluent_kafka"})
        print("ok", loaded)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok []"


def test_the_command_line_answers_help_and_version() -> None:
    for args in (["--version"], ["--help"]):
        done = subprocess.run([sys.executable, "-m", "rainier_sync", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "rainier-sync" in done.stdout


def test_metrics_and_tracing_name_their_extra_when_it_is_missing() -> None:
    done = run(
        """
        class BlockTelemetry:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {"prometheus_client", "opentelemetry"}:
                    raise ImportError(f"blocked: {name}")
                return None
        sys.meta_path.insert(0, BlockTelemetry())
        import rainier_sync
        from rainier_sync.errors import DriverUnavailableError
        for module in ("rainier_sync.metrics", "rainier_sync.tracing"):
            try:
                __import__(module)
            except DriverUnavailableError as exc:
                print(exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "rainier_sync.metrics needs prometheus_client: pip install 'rainier_sync[prometheus]'",
        "rainier_sync.tracing needs opentelemetry-api: pip install 'rainier_sync[otel]'",
    ]
