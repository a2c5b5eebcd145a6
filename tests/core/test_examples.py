from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_script_app_example_runs() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "script_app.py")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "thumbnails: uploads/cat.png, uploads/dog.png, uploads/flaky.png, uploads/owl.png"
    assert lines[1].startswith("retried: uploads/flaky.png (ConnectionError: image service timed out)")
    assert lines[2] == "processed 4, released 1, failed 0"
