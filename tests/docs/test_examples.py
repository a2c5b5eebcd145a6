"""Every Python example in docs/ runs (or, where it cannot, is compiled and
listed in tests/docs/stage.py with the reason), so an example cannot drift
from the code."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.docs import stage
from tests.docs.examples import ROOT, blocks

PAGES = sorted(
    page.relative_to(ROOT).as_posix() for page in (ROOT / "docs").rglob("*.rst") if blocks(page)
)


@pytest.mark.parametrize("page", PAGES)
def test_the_examples_of_a_page_run(page: str, tmp_path: pathlib.Path, redis_url: str, postgres_url: str) -> None:
    out = tmp_path / "outcomes.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DOCS_REDIS_URL": redis_url, "DOCS_POSTGRES_URL": postgres_url}
    done = subprocess.run(
        [sys.executable, "-m", "tests.docs.examples", str(ROOT / page), str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    outcomes = [json.loads(line) for line in out.read_text().splitlines()]
    assert [o["line"] for o in outcomes if o["how"] != "test"] == [b.line for b in blocks(ROOT / page)]
    failed = [f"{page}:{o['line']} ({o['first']})\n{o['error']}" for o in outcomes if o["error"]]
    assert not failed, "\n\n".join(failed)


def test_every_listed_exception_names_an_example_that_is_there() -> None:
    """A stale entry (its block edited or gone) fails here rather than hiding nothing."""
    firsts = {(b.page, b.first.strip()) for page in PAGES for b in blocks(ROOT / page)}
    codes = {b.page: [] for page in PAGES for b in blocks(ROOT / page)}
    for page in PAGES:
        for b in blocks(ROOT / page):
            codes[b.page].append(b.code)
    for key in (*stage.COMPILE_ONLY, *stage.RAISES):
        assert key in firsts, key
    for page, text in stage.SUBSTITUTE:
        assert any(text in code for code in codes.get(page, [])), (page, text)
    for page in (*stage.STUBS, *stage.SETUP):
        assert page in codes, page


def test_most_examples_run_rather_than_compile() -> None:
    total = sum(len(blocks(ROOT / page)) for page in PAGES)
    assert len(stage.COMPILE_ONLY) * 5 < total, "more than a fifth of the examples only compile"
