"""A Python 3.12 virtualenv with Django 6.1, where the backend runs on
Django's own ``django.tasks``: built once under ``.venv/django6`` and reused
while its requirements stay the same.

``python tests/django_tasks/django6.py`` builds it (if need be) and runs this
directory's tests in it; ``tests/django_tasks/test_django6.py`` does the same
from the main suite.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv" / "django6"
PYTHON_VERSION = "3.12.1"
REQUIREMENTS = [
    "Django>=6.1,<6.2",
    "blinker",
    "tenacity",
    "pytest>=8",
    "pytest-timeout>=2.2",
    "freezegun>=1.4",
    "psycopg[binary]>=3.1",
    "redis[hiredis]>=5.0",
]
#: Set in the inner run, so its copy of test_django6 does not start another.
INNER = "RAINIER_DJANGO6_INNER"


class Unavailable(Exception):
    """Python 3.12 is not on this machine."""


def base_python() -> pathlib.Path:
    """The Python 3.12 to build from: ``pyenv prefix 3.12.1``; Unavailable when there is none."""
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        raise Unavailable("pyenv is not installed, so Python 3.12 cannot be found")
    found = subprocess.run([pyenv, "prefix", PYTHON_VERSION], capture_output=True, text=True, check=False)
    if found.returncode != 0 or not found.stdout.strip():
        raise Unavailable(f"pyenv has no Python {PYTHON_VERSION}: {found.stderr.strip()}")
    python = pathlib.Path(found.stdout.strip()) / "bin" / "python"
    if not python.exists():
        raise Unavailable(f"{python} does not exist")
    return python


def build() -> pathlib.Path:
    """The venv's python, built (or rebuilt when its requirements changed) first."""
    base = base_python()
    stamp = VENV / "rainier-requirements.txt"
    wanted = "\n".join([str(base), *REQUIREMENTS]) + "\n"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "django6.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        python = VENV / "bin" / "python"
        if stamp.exists() and stamp.read_text() == wanted and python.exists():
            return python
        if VENV.exists():
            shutil.rmtree(VENV)
        subprocess.run([str(base), "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True)
        stamp.write_text(wanted)
        return python


def run_tests(python: pathlib.Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """This directory's tests, run by ``python`` on the repository's sources."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{INNER: "1"})
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q"]
    command += ["tests/django_tasks", *extra]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)


if __name__ == "__main__":
    try:
        made = build()
    except Unavailable as exc:
        print(f"skipped: {exc}")
        sys.exit(0)
    done = run_tests(made, *sys.argv[1:])
    print(done.stdout + done.stderr)
    sys.exit(done.returncode)
