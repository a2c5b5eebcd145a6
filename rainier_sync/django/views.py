"""The queue dashboard's views under Django (mounted by :mod:`rainier_sync.django.urls`).

The pages are built by :mod:`rainier_sync.dashboard`, as every host of the
dashboard builds them, from the manager Django booted. Every request, the
stylesheet's included, must pass ``settings.RAINIER_DASHBOARD_AUTHORIZE`` (a
callable taking the request, or the dotted path of one); without that
setting an active ``is_staff`` user passes, an anonymous visitor is sent to
``settings.LOGIN_URL`` and any other user is refused with 403. Every POST is
checked by Django's own :class:`~django.middleware.csrf.CsrfViewMiddleware`
against the token the pages embed (:func:`django.middleware.csrf.get_token`),
whether or not ``MIDDLEWARE`` lists it.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.middleware.csrf import get_token
from django.urls import reverse
from django.utils.module_loading import import_string
from django.views.decorators.csrf import csrf_exempt, csrf_protect

from ..dashboard.pages import PageError, PageRequest, build_page, security_headers, static_file
from ..dashboard.routes import build_url
from .state import get_manager

__all__ = ["authorizer", "is_staff", "page_view", "static_view", "FORM_TOKEN"]

#: The form field the pages carry their CSRF token in.
FORM_TOKEN = "csrf_token"

_SETTING = "RAINIER_DASHBOARD_AUTHORIZE"


def is_staff(request: HttpRequest) -> bool:
    """The default rule: an active, logged-in ``is_staff`` user."""
    user = getattr(request, "user", None)
    if user is None:
        raise ImproperlyConfigured(
            "the queue dashboard lets in is_staff users, which needs request.user: add "
            "'django.contrib.auth.middleware.AuthenticationMiddleware' to MIDDLEWARE, or set "
            f"settings.{_SETTING} to a callable taking the request"
        )
    return bool(user.is_authenticated and user.is_active and user.is_staff)


def authorizer() -> Callable[[HttpRequest], Any] | None:
    """``settings.RAINIER_DASHBOARD_AUTHORIZE`` as a callable (imported when it is
    a dotted path), or None when it is not set."""
    value = getattr(settings, _SETTING, None)
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise ImproperlyConfigured(f"settings.{_SETTING} = {value!r} does not import: {exc}") from exc
    if not callable(value):
        raise ImproperlyConfigured(
            f"settings.{_SETTING} must be a callable taking the request (or the dotted path of one), got {value!r}"
        )
    return value  # type: ignore[no-any-return]


def _refusal(request: HttpRequest) -> HttpResponseBase | None:
    """The response that turns ``request`` away, or None when it may see the dashboard."""
    authorize = authorizer()
    if authorize is not None:
        return None if authorize(request) else _error(403, "You may not see the queue dashboard.")
    if is_staff(request):
        return None
    if not request.user.is_authenticated:
        from django.contrib.auth.views import redirect_to_login

        return redirect_to_login(request.get_full_path())
    return _error(403, "The queue dashboard is for staff users.")


def _error(status: int, description: str) -> HttpResponse:
    phrase = HTTPStatus(status).phrase
    body = (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{status} {phrase}</title></head>'
        f"<body><h1>{status} {phrase}</h1><p>{html.escape(description)}</p></body></html>\n"
    )
    return _respond(HttpResponse(body, status=status), security_headers("text/html"))


def _respond(response: HttpResponseBase, headers: dict[str, str]) -> HttpResponseBase:
    for name, value in headers.items():
        response[name] = value
    return response


def _prefix(request: HttpRequest) -> str:
    """Where this mount of the dashboard lives (``/queues``)."""
    match = request.resolver_match
    namespace = match.namespace if match is not None and match.namespace else "rainier_sync"
    return str(reverse(f"{namespace}:index", current_app=namespace)).rstrip("/")


def _allowed(request: HttpRequest, method: str) -> HttpResponseBase | None:
    allowed = ("GET", "HEAD") if method == "GET" else (method,)
    if request.method in allowed:
        return None
    response = _error(405, f"{request.method} is not allowed here.")
    response["Allow"] = ", ".join(allowed)
    return response


def _checked(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """``view`` behind the dashboard's rule and, for a POST, Django's CSRF check.

    The pages' forms send their token as ``csrf_token``; it is handed to
    CsrfViewMiddleware as the header it reads (``settings.CSRF_HEADER_NAME``)
    when the request brings none, so the middleware checks it against this
    session's token as it checks any form's."""
    protected = csrf_protect(view)

    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        refused = _refusal(request)
        if refused is not None:
            return _respond(refused, security_headers("text/html"))
        if request.method == "POST" and not request.META.get(settings.CSRF_HEADER_NAME):
            sent = request.POST.get(FORM_TOKEN)
            if sent:
                request.META[settings.CSRF_HEADER_NAME] = sent
        return protected(request, *args, **kwargs)

    # A site's own CsrfViewMiddleware skips it: the check runs above, once the
    # form's field is where the middleware looks.
    exempt: Callable[..., HttpResponseBase] = csrf_exempt(guarded)
    return exempt


def _page(request: HttpRequest, endpoint: str, method: str, **values: str) -> HttpResponseBase:
    wrong = _allowed(request, method)
    if wrong is not None:
        return wrong
    prefix = _prefix(request)
    page_request = PageRequest(
        endpoint=endpoint,
        values=values,
        args={key: request.GET[key] for key in request.GET},
        form={key: request.POST[key] for key in request.POST} if request.method == "POST" else {},
        url_for=lambda name, **given: build_url(prefix, name, given),
        csrf_token=lambda: get_token(request),
    )
    try:
        page = build_page(get_manager(), page_request)
    except PageError as exc:
        return _error(exc.status, exc.description)
    response = HttpResponse(b"" if request.method == "HEAD" else page.body.encode("utf-8"), status=page.status)
    return _respond(response, page.headers)


def _static(request: HttpRequest, filename: str) -> HttpResponseBase:
    wrong = _allowed(request, "GET")
    if wrong is not None:
        return wrong
    data = static_file(filename)
    if data is None:
        return _error(404, "No such file.")
    mimetype = "text/css" if filename.endswith(".css") else "application/octet-stream"
    response = HttpResponse(b"" if request.method == "HEAD" else data, content_type=f"{mimetype}; charset=utf-8")
    return _respond(response, security_headers(mimetype))


#: Every page: ``endpoint`` and ``method`` come from the URL pattern, the path's segments decoded.
page_view = _checked(_page)
#: The dashboard's stylesheet.
static_view = _checked(_static)
