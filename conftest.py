"""Test-suite wiring: every module in tests/services/ is a fixture plugin
(one per real server: PostgreSQL, MariaDB, Redis, moto's SQS, tansu)."""

from __future__ import annotations

import pathlib

pytest_plugins = sorted(
    f"tests.services.{path.stem}"
    for path in (pathlib.Path(__file__).parent / "tests" / "services").glob("*.py")
    if path.stem != "__init__"
)
