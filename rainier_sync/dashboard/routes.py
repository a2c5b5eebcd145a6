"""The dashboard's URLs, the same on every host: each page's endpoint, method
and path, and how a job id or connection name is written in a path segment."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

__all__ = ["Route", "ROUTES", "encode_segment", "decode_segment", "match", "build_url"]

_PLAIN = re.compile(r"[A-Za-z0-9_.:@-]+")


def encode_segment(value: str) -> str:
    """``value`` as one path segment that round-trips: a plain one (letters,
    digits, ``_.:@-``, not ``.`` or ``..``, not starting with ``~``) as it is,
    any other as ``~`` and its URL-safe base64 without padding."""
    if _PLAIN.fullmatch(value) and value not in (".", ".."):
        return value
    return "~" + base64.urlsafe_b64encode(value.encode("utf-8")).decode("ascii").rstrip("=")


def decode_segment(segment: str) -> str:
    """The value :func:`encode_segment` wrote; :class:`ValueError` when ``segment`` is no such value."""
    if not segment.startswith("~"):
        return segment
    encoded = segment[1:]
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
    except (binascii.Error, ValueError):
        raise ValueError(f"{segment!r} is not a ~-encoded path segment") from None


@dataclass(frozen=True)
class Route:
    """One page: its endpoint name, HTTP method and path (``<name>`` marks a segment)."""

    endpoint: str
    method: str
    path: str

    @property
    def parts(self) -> list[str]:
        return self.path.strip("/").split("/") if self.path != "/" else []


#: Every page, static paths before the ones a segment could also match.
ROUTES: tuple[Route, ...] = (
    Route("index", "GET", "/"),
    Route("workers", "GET", "/workers"),
    Route("batches", "GET", "/batches"),
    Route("batch", "GET", "/batches/<batch_id>"),
    Route("cancel_batch", "POST", "/batches/<batch_id>/cancel"),
    Route("browse", "GET", "/<connection>/queues/<queue>"),
    Route("pause", "POST", "/<connection>/queues/<queue>/pause"),
    Route("resume", "POST", "/<connection>/queues/<queue>/continue"),
    Route("job", "GET", "/<connection>/jobs/<job_id>"),
    Route("failed_job", "GET", "/<connection>/failed/<job_id>"),
    Route("failed_error", "GET", "/<connection>/failed/<job_id>/error"),
    Route("failed_traceback", "GET", "/<connection>/failed/<job_id>/traceback"),
    Route("retry", "POST", "/<connection>/failed/<job_id>/retry"),
    Route("forget", "POST", "/<connection>/failed/<job_id>/forget"),
    Route("retry_all", "POST", "/<connection>/retry-failed"),
)

_BY_ENDPOINT = {route.endpoint: route for route in ROUTES}


def match(path: str) -> list[tuple[Route, dict[str, str]]]:
    """The routes ``path`` (below the mount point, already percent-decoded) fits,
    each with its decoded segments; empty when none does."""
    parts = path.strip("/").split("/") if path.strip("/") else []
    found = []
    for route in ROUTES:
        pattern = route.parts
        if len(pattern) != len(parts):
            continue
        values: dict[str, str] = {}
        for want, got in zip(pattern, parts, strict=True):
            if want.startswith("<"):
                if not got:
                    break
                try:
                    values[want[1:-1]] = decode_segment(got)
                except ValueError:
                    break
            elif want != got:
                break
        else:
            found.append((route, values))
    return found


def build_url(prefix: str, endpoint: str, values: Mapping[str, Any]) -> str:
    """The URL of ``endpoint`` under ``prefix``: its segments from ``values``, the
    rest of them (None left out) as the query string."""
    endpoint = endpoint.removeprefix("rainier_sync.").removeprefix(".")
    query = {key: value for key, value in values.items() if value is not None}
    if endpoint == "static":
        path = "/static/" + quote(str(query.pop("filename")))
    else:
        route = _BY_ENDPOINT[endpoint]
        segments = []
        for part in route.parts:
            if part.startswith("<"):
                segments.append(quote(encode_segment(str(query.pop(part[1:-1]))), safe="~:@"))
            else:
                segments.append(part)
        path = "/" + "/".join(segments)
    url = prefix.rstrip("/") + path
    if query:
        url += "?" + urlencode({key: str(value) for key, value in query.items()})
    return url
