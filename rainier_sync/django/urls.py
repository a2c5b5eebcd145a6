"""The queue dashboard's URLs: ``path("queues/", include("rainier_sync.django.urls"))``.

The same pages, at the same paths, as the Flask extension's and the
standalone server's (:data:`rainier_sync.dashboard.routes.ROUTES`), named in
the ``rainier_sync`` namespace (``reverse("rainier_sync:index")``). A job id
or connection name that is not plain is written in its segment as ``~`` and
its URL-safe base64 (:func:`~rainier_sync.dashboard.routes.encode_segment`).
"""

from __future__ import annotations

from django.urls import URLPattern, path, register_converter

from ..dashboard.routes import ROUTES, decode_segment, encode_segment
from .views import page_view, static_view

__all__ = ["app_name", "urlpatterns", "SegmentConverter"]

app_name = "rainier_sync"


class SegmentConverter:
    """A job id or connection name as one path segment that round-trips."""

    regex = "[^/]+"

    def to_python(self, value: str) -> str:
        return decode_segment(value)  # a ValueError: this pattern does not match

    def to_url(self, value: str) -> str:
        return encode_segment(value)


register_converter(SegmentConverter, "rainier_sync_segment")


def _pattern(route_path: str) -> str:
    return route_path.lstrip("/").replace("<", "<rainier_sync_segment:")


urlpatterns: list[URLPattern] = [
    path("static/<path:filename>", static_view, name="static"),
    *(
        path(_pattern(route.path), page_view, {"endpoint": route.endpoint, "method": route.method}, name=route.endpoint)
        for route in ROUTES
    ),
]
