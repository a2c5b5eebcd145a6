"""The database examples run as their documentation says."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_transactional_dispatch_example(tmp_path: pathlib.Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "transactional_dispatch.py"), f"sqlite:///{tmp_path / 'shop.db'}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "order 2 rolled back (payment declined)" in out
    assert "orders stored: [1]; jobs queued: 1" in out
    assert "receipt sent for order 1" in out and "receipt sent for order 2" not in out
    assert "processed 1, failed 0" in out


def test_quickstart_uses_sqlite_and_drains(tmp_path: pathlib.Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "processed 1, failed 0" in done.stdout
    assert (tmp_path / "quickstart.db").exists()
