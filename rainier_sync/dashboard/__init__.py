"""The queue dashboard, whatever serves it.

:mod:`~rainier_sync.dashboard.pages` builds each page from the manager
(rendered with Jinja2: ``pip install 'rainier_sync[dashboard]'``);
:mod:`~rainier_sync.dashboard.routes` names its URLs. The Flask extension
mounts them as a blueprint (:mod:`rainier_sync.flask.dashboard`) and
``rainier-sync dashboard`` serves them on their own
(:mod:`rainier_sync.dashboard.server`).
"""

from __future__ import annotations

from .pages import Page, PageError, PageRequest, build_page, csrf_matches, security_headers, static_file
from .routes import ROUTES, Route, decode_segment, encode_segment

__all__ = [
    "Page",
    "PageError",
    "PageRequest",
    "build_page",
    "csrf_matches",
    "security_headers",
    "static_file",
    "ROUTES",
    "Route",
    "encode_segment",
    "decode_segment",
]
