"""``manage.py check``: the findings of ``rainier-sync check`` as system checks.

The configuration, the registry and the schedule are checked always; the
backends (lock store, connections, outbox) only when a database is asked
for (``manage.py check --database default``, and ``migrate``), as Django's
own checks that need a connection are. A table not created yet is a warning
(``manage.py migrate`` creates it); any other problem is an error.
"""

from __future__ import annotations

import io
from typing import Any, Sequence

from django.core import checks

__all__ = ["rainier_sync_check"]


class _Findings:
    def __init__(self) -> None:
        self.out = io.StringIO()
        self.problems: list[str] = []

    def ok(self, text: str) -> None:
        pass

    def problem(self, text: str) -> None:
        self.problems.append(text)


@checks.register("rainier_sync")  # type: ignore[untyped-decorator]
def rainier_sync_check(app_configs: Sequence[Any] | None = None, databases: Sequence[str] | None = None,
                       **kwargs: Any) -> list[checks.CheckMessage]:  # fmt: skip
    """Report what ``rainier-sync check`` would find."""
    from ..cli import check as cli_check
    from .commands import DjangoFrontend
    from .state import booted_manager

    manager = booted_manager()
    if manager is None:
        return []
    frontend = DjangoFrontend()
    findings = _Findings()
    cli_check._registry(frontend, manager, findings)  # type: ignore[arg-type]
    cli_check._schedule(manager, findings)  # type: ignore[arg-type]
    messages: list[checks.CheckMessage] = [
        checks.Error(text, id="rainier_sync.E001") for text in findings.problems
    ]
    if databases:
        probed = _Findings()
        cli_check._lock_store(manager, probed)  # type: ignore[arg-type]
        cli_check._connections(frontend, manager, probed)  # type: ignore[arg-type]
        cli_check._outbox(frontend, manager, probed)  # type: ignore[arg-type]
        for text in probed.problems:
            if "migrate" in text:
                messages.append(checks.Warning(text, hint="run manage.py migrate", id="rainier_sync.W001"))
            else:
                messages.append(checks.Error(text, id="rainier_sync.E002"))
    return messages
