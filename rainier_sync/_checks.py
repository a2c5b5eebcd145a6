"""One validator for the numbers users give: options, settings, job class attributes."""

from __future__ import annotations

import math
from typing import Any

from .errors import ConfigurationError

__all__ = ["check_number"]


def check_number(
    name: str,
    value: Any,
    *,
    whole: bool = False,
    zero: bool = False,
    none: bool = False,
    least: float | None = None,
    most: float | None = None,
    unit: str = "",
    error: type[Exception] = ConfigurationError,
) -> Any:
    """``value`` if it is a positive number (``whole``: an int; ``zero``: 0 allowed;
    ``none``: None allowed; ``least``/``most``: bounds), else ``error`` naming
    ``name`` (and ``unit``: "must be a positive number of seconds").

    ``bool`` is never a number here, though Python counts it as an int.
    """
    if value is None and none:
        return None
    kinds = (int,) if whole else (int, float)
    ok = (
        not isinstance(value, bool)
        and isinstance(value, kinds)
        and (value >= 0 if zero else value > 0)
        and math.isfinite(value)
        and (least is None or value >= least)
        and (most is None or value <= most)
    )
    if not ok:
        what = ("whole number" if whole else "number") + (f" of {unit}" if unit else "")
        sign = "non-negative" if zero else "positive"
        if least is not None and most is not None:
            raise error(f"{name} must be a {what.removeprefix('whole ')} from {least:g} to {most:g}, got {value!r}")
        bound = (f" from {least:g}" if least is not None else "") + (f" up to {most:g}" if most is not None else "")
        raise error(f"{name} must be a {sign} {what}{bound}{' or None' if none else ''}, got {value!r}")
    return value
