"""What a ``push_many`` that raised had done: the jobs it stored before the
error, and those its backend refused for good. A driver whose batch can go
through in part says so on the exception it raises (:func:`tell_pushed`); the
outbox's relay reads it (:func:`pushed_before`), so it neither sends again what
went through nor holds up the rest behind a job that can never be taken."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

__all__ = ["Pushed", "tell_pushed", "pushed_before"]

_ATTRIBUTE = "rainier_pushed"


@dataclass(frozen=True)
class Pushed:
    """Of the jobs a failed ``push_many`` was given: the ids ``stored`` (the
    backend has them), and the ids ``refused`` for good with the backend's reason
    (sending them again would fail the same way). Any other job was not stored,
    or its outcome is unknown."""

    stored: frozenset[str] = frozenset()
    refused: Mapping[str, str] = field(default_factory=dict)


def tell_pushed(exc: BaseException, stored: Iterable[str], refused: Mapping[str, str] | None = None) -> BaseException:
    """Record on ``exc`` what the push that raised it had done (added to what is
    already recorded); returns ``exc``, for ``raise tell_pushed(exc, ...)``."""
    before = pushed_before(exc)
    setattr(
        exc,
        _ATTRIBUTE,
        Pushed(before.stored | frozenset(stored), {**before.refused, **dict(refused or {})}),
    )
    return exc


def pushed_before(exc: BaseException) -> Pushed:
    """What the failed push that raised ``exc`` had done (nothing, when its driver did not say)."""
    found = getattr(exc, _ATTRIBUTE, None)
    return found if isinstance(found, Pushed) else Pushed()
