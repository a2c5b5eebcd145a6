"""What the contract suite needs from a driver under test.

Every driver adds ``tests/contract/harness_<driver>.py`` with a function
``harness(request)`` that yields a :class:`Harness` (it may use any pytest
fixture through ``request.getfixturevalue``). The contract tests are
parametrised over every such module, so a new driver runs the whole suite
unchanged. A driver that cannot honour one guarantee lists it in ``lacks``
with the reason, and that test is skipped saying so.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from rainier_sync.drivers.base import BaseQueue


@dataclass
class Harness:
    name: str
    #: A fresh, empty driver on its own isolated store (keys, tables, topics...).
    make: Callable[[], BaseQueue]
    #: Seconds a reservation lasts on drivers ``make`` returns.
    reservation: float
    #: Moves the driver's clock forward: a freezegun tick for drivers that read
    #: the Python clock, a real sleep for those whose server keeps time.
    advance: Callable[[float], None] = time.sleep
    #: Guarantee -> why this driver cannot give it.
    lacks: dict[str, str] = field(default_factory=dict)
    #: A short delay the driver honours, in seconds.
    delay: float = 10.0
    #: Writes one stored job nobody can read onto a queue of the driver (beside it,
    #: as another tool or an old release might); None where nothing stored can be unreadable.
    store_unreadable: Callable[[BaseQueue, str], None] | None = None


def harness_modules() -> list[str]:
    package = importlib.import_module("tests.contract")
    return sorted(
        m.name.removeprefix("harness_") for m in pkgutil.iter_modules(package.__path__) if m.name.startswith("harness_")
    )


def load(name: str) -> Callable[..., Iterator[Harness]]:
    module = importlib.import_module(f"tests.contract.harness_{name}")
    return module.harness  # type: ignore[no-any-return]
