"""The backend's tests again, on Django 6.1's own ``django.tasks`` (Python 3.12)."""

from __future__ import annotations

import os
import subprocess

import pytest

from . import django6


@pytest.mark.timeout(1200)
def test_the_backend_on_django_6() -> None:
    if os.environ.get(django6.INNER):
        pytest.skip("this is the Django 6 run itself")
    try:
        python = django6.build()
    except django6.Unavailable as exc:
        pytest.skip(f"no Django 6 run: {exc}")
    except subprocess.CalledProcessError as exc:  # Python 3.12 is there, but the venv could not be built
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"no Django 6 run: building {django6.VENV} failed: {exc}")
    done = django6.run_tests(python)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and "failed" not in done.stdout, tail
