"""README.rst's two set-up commands stay true, and CI runs the same test command."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.rst").read_text()
    return [line.strip() for line in text.splitlines() if line.strip().startswith("python3 -m venv .venv &&")]


def test_readme_has_the_two_setup_commands() -> None:
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert "examples/quickstart.py" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_commands()[1] in ci.splitlines()


def readme_block(after: str, marker: str) -> str:
    """The indented block that follows ``marker`` in README.rst's section after ``after``, dedented."""
    text = (ROOT / "README.rst").read_text()
    rest = text[text.index(after) :]
    rest = rest[rest.index(marker) + len(marker) :].lstrip("\n")
    lines: list[str] = []
    for line in rest.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines).strip("\n") + "\n"


def test_the_quick_start_block_is_the_example_script_whole() -> None:
    block = readme_block("Quick start\n=====", ".. code-block:: python\n")
    assert block == (ROOT / "examples" / "quickstart.py").read_text()


def test_quickstart_runs_and_prints_what_readme_shows(tmp_path: pathlib.Path) -> None:
    script = re.search(r"\.venv/bin/python (examples/\S+)", readme_commands()[0])
    assert script is not None and script.group(1) == "examples/quickstart.py"
    shown = readme_block("Quick start\n=====", "It prints::\n")
    for _ in range(2):  # a second run in the same folder finds the tables made and prints the same
        done = subprocess.run(
            [sys.executable, str(ROOT / script.group(1))], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == shown


def test_the_server_checks_look_where_the_test_urls_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``TEST_*_URL`` override moves the "is it running?" check too: a server on
    the default port does not stand in for the one the URL names."""
    from tests import support
    from tests.services import servers

    monkeypatch.setattr(support, "IN_CI", False)
    port = support.free_port()
    for url in (
        f"postgresql://postgres@127.0.0.1:{port}/test",
        f"mysql://root@127.0.0.1:{port}/test",
        f"redis://127.0.0.1:{port}/13",
    ):
        with pytest.raises(pytest.skip.Exception, match=f"on 127.0.0.1:{port} is not reachable"):
            servers.require(url)


def test_readme_says_what_the_tests_need() -> None:
    from tests.services import servers

    text = " ".join((ROOT / "README.rst").read_text().split())
    for default in (servers.DEFAULT_POSTGRES_URL, servers.DEFAULT_MYSQL_URL, servers.DEFAULT_REDIS_URL):
        assert f"``{default}``" in text
    for variable in ("TEST_POSTGRES_URL", "TEST_MYSQL_URL", "TEST_REDIS_URL", "CI=true"):
        assert f"``{variable}" in text
    assert "database number 13" in text and servers.DEFAULT_REDIS_URL.endswith("/13")
    # The dashboard's browser tests and the pgbouncer tests skip without these packages.
    for package in ("``pgbouncer``", "``chromium``", "``chromium-driver``", "``bash .ci/services.sh``"):
        assert package in text, package
    services = (ROOT / ".ci" / "services.sh").read_text()
    assert "need_apt+=(pgbouncer)" in services and "need_apt+=(chromium)" in services
    assert "need_apt+=(chromium-driver)" in services
