"""The dashboard needs no web framework: Jinja2 only, and says so when it is missing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from .support import ROOT, command


def blocked(names: set[str], code: str) -> subprocess.CompletedProcess[str]:
    prelude = textwrap.dedent(
        f"""
        import sys
        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {sorted(names)!r}:
                    raise ImportError(f"blocked: {{name}}")
                return None
        sys.meta_path.insert(0, Blocker())
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_the_standalone_pages_render_without_flask() -> None:
    done = blocked(
        {"flask", "werkzeug", "django"},
        """
        import io
        from wsgiref.util import setup_testing_defaults
        from rainier_sync import Container, JobRegistry, QueueManager
        from rainier_sync.drivers import MemoryQueue
        from rainier_sync.dashboard.server import DashboardApp

        manager = QueueManager({"main": MemoryQueue()}, registry=JobRegistry(), container=Container())
        environ = {"PATH_INFO": "/", "HTTP_HOST": "127.0.0.1"}
        setup_testing_defaults(environ)
        seen = []
        body = b"".join(DashboardApp(manager, None)(environ, lambda status, headers: seen.append(status)))
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {"flask", "werkzeug", "django"})
        print(seen[0], b'data-queue="default"' in body, loaded)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "200 OK True []"


def test_the_command_names_its_extra_without_jinja2() -> None:
    argv, env = command("--no-auth", "--bind", "127.0.0.1:0", token=None)
    done = blocked(
        {"jinja2"},
        f"import sys; sys.argv = {argv[2:]!r}; import runpy; runpy.run_module('rainier_sync', run_name='__main__')",
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'rainier_sync[dashboard]'" in done.stderr
