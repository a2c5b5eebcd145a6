"""Backoff strategies: how long a failed job waits before its next attempt.

A strategy is any callable ``(attempt) -> seconds`` where ``attempt`` is the
1-based number of the attempt that just failed. A ``tenacity`` wait strategy
(``tenacity.wait_exponential(...)`` and friends) is accepted wherever a
strategy goes.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

__all__ = [
    "BackoffStrategy",
    "exponential",
    "linear",
    "fixed",
    "none",
    "resolve",
]


class BackoffStrategy(Protocol):
    def __call__(self, attempt: int) -> float: ...


class _Strategy:
    __slots__ = ("_fn", "_label")

    def __init__(self, fn: Callable[[int], float], label: str) -> None:
        self._fn = fn
        self._label = label

    def __call__(self, attempt: int) -> float:
        return float(self._fn(max(1, int(attempt))))

    def __repr__(self) -> str:
        return self._label


def _non_negative(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"backoff {name} must be a non-negative number of seconds, got {value!r}")
    return float(value)


def exponential(base: float = 1, cap: float = 64) -> BackoffStrategy:
    """``base``, ``2*base``, ``4*base``, ... seconds, never more than ``cap``."""
    b, c = _non_negative("base", base), _non_negative("cap", cap)
    return _Strategy(lambda a: min(b * 2 ** min(a - 1, 62), c), f"exponential(base={base}, cap={cap})")


def linear(step: float = 5, cap: float = 60) -> BackoffStrategy:
    """``step``, ``2*step``, ``3*step``, ... seconds, never more than ``cap``."""
    s, c = _non_negative("step", step), _non_negative("cap", cap)
    return _Strategy(lambda a: min(s * a, c), f"linear(step={step}, cap={cap})")


def fixed(delay: float) -> BackoffStrategy:
    """The same ``delay`` before every retry."""
    d = _non_negative("delay", delay)
    return _Strategy(lambda a: d, f"fixed({delay})")


#: Retry at once.
none: BackoffStrategy = _Strategy(lambda a: 0.0, "none")


def _from_tenacity(wait: Any) -> BackoffStrategy:
    import tenacity

    def compute(attempt: int) -> float:
        state = tenacity.RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = attempt
        return float(wait(state))

    return _Strategy(compute, f"tenacity({wait!r})")


def resolve(strategy: Any) -> BackoffStrategy:
    """Turn anything accepted as a backoff into a ``(attempt) -> seconds`` callable.

    Accepts a strategy from this module, a ``tenacity`` wait strategy, a plain
    number of seconds, or a callable taking the attempt number.
    """
    if isinstance(strategy, _Strategy):
        return strategy
    if isinstance(strategy, bool):
        raise TypeError(f"not a backoff strategy: {strategy!r}")
    if isinstance(strategy, (int, float)):
        return fixed(strategy)
    try:
        import tenacity.wait as tenacity_wait
    except ImportError:  # pragma: no cover - tenacity is a core dependency
        tenacity_wait = None  # type: ignore[assignment]
    if tenacity_wait is not None and isinstance(strategy, tenacity_wait.wait_base):
        return _from_tenacity(strategy)
    if callable(strategy):
        fn = strategy
        return _Strategy(lambda a: _non_negative("result", fn(a)), f"callable({fn!r})")
    raise TypeError(
        f"not a backoff strategy: {strategy!r}; use rainier_sync.backoff.exponential(), "
        "linear(), fixed(), none, a tenacity wait strategy, or a number of seconds"
    )
