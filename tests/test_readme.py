"""README.rst's two set-up commands stay true, and CI runs the same test command."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

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


def test_quickstart_runs() -> None:
    script = re.search(r"\.venv/bin/python (examples/\S+)", readme_commands()[0])
    assert script is not None
    done = subprocess.run(
        [sys.executable, str(ROOT / script.group(1))], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert "processed" in done.stdout and "failed 0" in done.stdout
