"""Each module of tests/django/inner in a pytest process of its own, in which
its conftest configures Django over the real servers (other tests of a
suite's process may have configured Django already, with settings of theirs)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.django.conftest import INNER

pytestmark = [pytest.mark.postgres, pytest.mark.mysql, pytest.mark.redis]

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = sorted(path.name for path in (pathlib.Path(__file__).parent / "inner").glob("test_*.py"))


@pytest.mark.parametrize("module", MODULES)
def test_in_a_django_process_of_its_own(module: str) -> None:
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    env[INNER] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "-rfE",
         f"tests/django/inner/{module}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
