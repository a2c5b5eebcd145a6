"""Run the Python examples of one page of docs/ in order, in one namespace.

``python -m tests.docs.examples docs/PAGE.rst OUT`` writes one JSON line per
block to OUT: its line, and the error it raised (``null`` when it ran). Each page runs in a
process of its own, in a scratch folder, so a block that registers a signal
receiver or a metrics collector cannot leak into another page's blocks.
"""

from __future__ import annotations

import inspect
import json
import pathlib
import re
import sys
import traceback
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[2]
_START = re.compile(r"^(\s*)\.\. code-block:: python\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    code: str

    @property
    def first(self) -> str:
        return next(line for line in self.code.splitlines() if line.strip())


def blocks(page: pathlib.Path) -> list[Block]:
    """Every ``.. code-block:: python`` of ``page``, dedented, with the line it starts on."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _START.match(lines[i])
        if not match:
            i += 1
            continue
        indent = len(match.group(1))
        start = i + 1
        i += 1
        body: list[str] = []
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
            body.append(lines[i])
            i += 1
        body = [line for line in body if not line.strip().startswith(":") or line.strip().startswith("::")]
        width = min((len(line) - len(line.lstrip()) for line in body if line.strip()), default=0)
        code = "\n".join(line[width:] for line in body).strip("\n") + "\n"
        found.append(Block(page.relative_to(ROOT).as_posix(), start, code))
    return found


def run(page: pathlib.Path) -> list[dict[str, object]]:
    from tests.docs import stage

    namespace = stage.namespace_for(page.relative_to(ROOT).as_posix())
    outcomes: list[dict[str, object]] = []
    for block in blocks(page):
        how = stage.how(block)
        error: str | None = None
        try:
            if how == "run" and block.first.startswith("# myapp/") and block.first.strip().endswith(".py"):
                # A module of the reader's app: written where an import finds it, then run.
                target = pathlib.Path(block.first[2:].split(":")[0].strip())
                target.parent.mkdir(parents=True, exist_ok=True)
                (target.parent / "__init__.py").touch()
                target.write_text("from docs_example import *  # noqa: F403\n" + stage.prepare(block))
            compiled = compile(stage.prepare(block), f"{block.page}:{block.line}", "exec")
            if how == "run":
                exec(compiled, namespace)
                if stage.raises(block):
                    error = f"ran without raising {stage.raises(block)}"
        except BaseException as exc:  # noqa: BLE001 - any failure of an example is reported, whatever it is
            if type(exc).__name__ != stage.raises(block):
                error = traceback.format_exc(limit=-3)
        outcomes.append({"line": block.line, "first": block.first, "how": how, "error": error})
    for name, value in list(namespace.items()):
        # A test the page shows is run too, when it needs no fixture.
        if name.startswith("test_") and callable(value) and not inspect.signature(value).parameters:
            if name in stage.SKIP_TESTS:
                continue
            stage.before_test(namespace)
            error = None
            try:
                value()
            except BaseException:  # noqa: BLE001 - reported whatever it is
                error = traceback.format_exc(limit=-3)
            outcomes.append({"line": 0, "first": f"{name}()", "how": "test", "error": error})
    stage.finish(namespace)
    return outcomes


if __name__ == "__main__":
    outcomes = run(pathlib.Path(sys.argv[1]).resolve())
    pathlib.Path(sys.argv[2]).write_text("".join(json.dumps(outcome) + "\n" for outcome in outcomes))
