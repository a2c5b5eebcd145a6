"""The queue dashboard served by Django (``include("rainier_sync.django.urls")``)
on the site's real SQLite database: who may see it, Django's CSRF check on
every POST, escaping and the CSP; and in headless Chromium, a staff user
retrying a failed job."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.urls import include, path

from rainier_sync import Job, JobContext, WorkerOptions
from tests.support import IN_CI

pytestmark = [pytest.mark.postgres, pytest.mark.mysql, pytest.mark.redis]

#: This module is the site's URLconf while its tests run (see ``dashboard_site``).
urlpatterns = [path("queues/", include("rainier_sync.django.urls"))]

HOSTILE = "<script>alert(1)</script>"


@dataclass
class Explode(Job):
    NAME = "tests.django.dashboard.explode"
    message: str

    def handle(self, context: JobContext) -> None:
        raise RuntimeError(self.message)


def let_in_the_header(request: Any) -> bool:
    """A RAINIER_DASHBOARD_AUTHORIZE named by its dotted path."""
    return bool(request.headers.get("X-Let-In") == "yes")


@pytest.fixture
def dashboard_site(django_site: dict[str, Any]) -> Iterator[dict[str, Any]]:
    from django.test.utils import override_settings

    manager = django_site["manager"]
    if Explode.NAME not in manager.registry:
        manager.registry.register(Explode)
    with override_settings(
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["testserver", "127.0.0.1"],
        LOGIN_URL="/accounts/login/",
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
        ],
    ):
        yield django_site


def make_user(*, staff: bool) -> Any:
    from django.contrib.auth.models import User

    return User.objects.create_user(f"user-{uuid.uuid4().hex[:10]}", password="pw-" + uuid.uuid4().hex, is_staff=staff)


def failed_job(manager: Any, message: str) -> str:
    """A job run to failure on the site's SQLite connection; its id."""
    from rainier_sync.worker import Worker

    queue = f"dash-{uuid.uuid4().hex[:8]}"
    job_id = manager.pending(Explode(message)).on_queue(queue).send()
    Worker(manager, options=WorkerOptions(queues=[queue], once=True), connection="sqlite").run()
    assert manager.connection("sqlite").failed_job(job_id) is not None
    return str(job_id)


def staff_client(*, enforce_csrf_checks: bool = False) -> Any:
    from django.test import Client

    client = Client(enforce_csrf_checks=enforce_csrf_checks)
    client.force_login(make_user(staff=True))
    return client


def test_staff_sees_the_queues_page_with_its_csp(dashboard_site: dict[str, Any]) -> None:
    job_id = failed_job(dashboard_site["manager"], "staff can see this")
    response = staff_client().get("/queues/")
    assert response.status_code == 200
    body = response.content.decode()
    assert f'data-job-id="{job_id}"' in body
    assert response["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in response["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in response["Content-Security-Policy"]
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["Cache-Control"] == "no-store"
    css = staff_client().get("/queues/static/dashboard.css")
    assert css.status_code == 200 and css["Content-Type"].startswith("text/css")


def test_anonymous_is_sent_to_the_login_url(dashboard_site: dict[str, Any]) -> None:
    from django.test import Client

    response = Client().get("/queues/workers?page=2")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/queues/workers%3Fpage%3D2"
    assert Client().get("/queues/static/dashboard.css").status_code == 302


def test_a_user_who_is_not_staff_is_refused(dashboard_site: dict[str, Any]) -> None:
    from django.test import Client

    client = Client()
    client.force_login(make_user(staff=False))
    response = client.get("/queues/")
    assert response.status_code == 403
    assert "Content-Security-Policy" in response


def test_a_custom_authorize_decides_as_a_callable_or_a_dotted_path(dashboard_site: dict[str, Any]) -> None:
    from django.test import Client
    from django.test.utils import override_settings

    with override_settings(RAINIER_DASHBOARD_AUTHORIZE=lambda request: request.user.username.endswith("ops")):
        ops = Client()
        ops.force_login(make_staffless("ops"))
        assert ops.get("/queues/").status_code == 200
        assert staff_client().get("/queues/").status_code == 403, "staff, but the callable says no"
        assert Client().get("/queues/").status_code == 403, "anonymous: the callable says no"
    with override_settings(RAINIER_DASHBOARD_AUTHORIZE=f"{__name__}.let_in_the_header"):
        assert Client().get("/queues/", headers={"X-Let-In": "yes"}).status_code == 200
        assert Client().get("/queues/").status_code == 403


def make_staffless(suffix: str) -> Any:
    from django.contrib.auth.models import User

    return User.objects.create_user(f"user-{uuid.uuid4().hex[:10]}-{suffix}", password="pw-" + uuid.uuid4().hex)


def test_a_misnamed_authorize_is_an_error_naming_the_setting(dashboard_site: dict[str, Any]) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.test import Client
    from django.test.utils import override_settings

    with override_settings(RAINIER_DASHBOARD_AUTHORIZE=f"{__name__}.no_such_function"):
        with pytest.raises(ImproperlyConfigured, match="RAINIER_DASHBOARD_AUTHORIZE"):
            Client(raise_request_exception=True).get("/queues/")


def test_an_authorize_that_is_not_callable_is_an_error_naming_the_setting(dashboard_site: dict[str, Any]) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.test import Client
    from django.test.utils import override_settings

    with override_settings(RAINIER_DASHBOARD_AUTHORIZE=True):
        with pytest.raises(ImproperlyConfigured, match="RAINIER_DASHBOARD_AUTHORIZE must be a callable"):
            Client(raise_request_exception=True).get("/queues/")


def test_the_staff_rule_without_request_user_says_what_is_missing(dashboard_site: dict[str, Any]) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.test import Client
    from django.test.utils import override_settings

    with override_settings(MIDDLEWARE=[]):
        with pytest.raises(ImproperlyConfigured, match="AuthenticationMiddleware"):
            Client(raise_request_exception=True).get("/queues/")


def test_the_urls_are_named_in_their_namespace(dashboard_site: dict[str, Any]) -> None:
    from django.urls import reverse

    assert reverse("rainier_sync:index") == "/queues/"
    assert reverse("rainier_sync:failed_job", kwargs={"connection": "sqlite", "job_id": "a/b"}) == (
        "/queues/sqlite/failed/~YS9i"
    )


def csrf_token_of(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found is not None, "the page embeds a CSRF token"
    return found.group(1)


@pytest.mark.parametrize("action", ["retry", "forget"])
def test_a_post_needs_django_s_csrf_token(dashboard_site: dict[str, Any], action: str) -> None:
    manager = dashboard_site["manager"]
    job_id = failed_job(manager, f"{action} me")
    client = staff_client(enforce_csrf_checks=True)
    url = f"/queues/sqlite/failed/{job_id}/{action}"

    refused = client.post(url)
    assert refused.status_code == 403
    assert manager.connection("sqlite").failed_job(job_id) is not None, "nothing was done"
    wrong = client.post(url, {"csrf_token": "x" * 64})
    assert wrong.status_code == 403

    page = client.get("/queues/").content.decode()
    token = csrf_token_of(page)
    from django.conf import settings

    assert settings.CSRF_COOKIE_NAME in client.cookies, "Django's CSRF cookie carries the token's secret"
    done = client.post(url, {"csrf_token": token})
    assert done.status_code == 303
    notice = "retried" if action == "retry" else "forgotten"
    assert done["Location"] == f"/queues/?notice={notice}&job={job_id}"
    assert manager.connection("sqlite").failed_job(job_id) is None
    assert f"Job {job_id} was" in client.get(done["Location"]).content.decode()


def test_posts_are_checked_when_the_site_lists_no_csrf_middleware(dashboard_site: dict[str, Any]) -> None:
    from django.test.utils import override_settings

    manager = dashboard_site["manager"]
    job_id = failed_job(manager, "no middleware")
    with override_settings(
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
        ]
    ):
        client = staff_client(enforce_csrf_checks=True)
        url = f"/queues/sqlite/failed/{job_id}/forget"
        assert client.post(url).status_code == 403
        assert manager.connection("sqlite").failed_job(job_id) is not None
        token = csrf_token_of(client.get("/queues/").content.decode())
        assert client.post(url, {"csrf_token": token}).status_code == 303
        assert manager.connection("sqlite").failed_job(job_id) is None


def test_the_token_is_also_taken_from_django_s_header(dashboard_site: dict[str, Any]) -> None:
    manager = dashboard_site["manager"]
    job_id = failed_job(manager, "by header")
    client = staff_client(enforce_csrf_checks=True)
    token = csrf_token_of(client.get("/queues/").content.decode())
    done = client.post(f"/queues/sqlite/failed/{job_id}/forget", headers={"X-CSRFToken": token})
    assert done.status_code == 303
    assert manager.connection("sqlite").failed_job(job_id) is None


def test_a_hostile_payload_and_error_are_escaped(dashboard_site: dict[str, Any]) -> None:
    job_id = failed_job(dashboard_site["manager"], HOSTILE)
    client = staff_client()
    for url in ("/queues/", f"/queues/sqlite/failed/{job_id}"):
        body = client.get(url).content.decode()
        assert HOSTILE not in body, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body, url
    error = client.get(f"/queues/sqlite/failed/{job_id}/error")
    assert error["Content-Type"] == "text/plain; charset=utf-8"
    assert error["Content-Security-Policy"].endswith("; sandbox")


def test_a_wrong_method_and_an_unknown_page(dashboard_site: dict[str, Any]) -> None:
    client = staff_client()
    wrong = client.post("/queues/workers")
    assert wrong.status_code == 405 and wrong["Allow"] == "GET, HEAD"
    assert client.get("/queues/sqlite/failed/~a").status_code == 404, "not a ~-encoded segment"
    assert client.get("/queues/no-such-connection/queues/default").status_code == 404


@pytest.fixture
def browser() -> Iterator[Any]:
    from tests.flask.chromium import chromium, csp_violations, missing

    absent = missing()
    if absent:
        message = f"{', '.join(absent)} not installed; install with: apt-get install chromium chromium-driver"
        if IN_CI:
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message)
    with chromium() as driver:
        yield driver
        assert csp_violations(driver) == [], "a page broke its Content Security Policy"


@pytest.fixture
def served(dashboard_site: dict[str, Any]) -> Iterator[str]:
    from django.core.handlers.wsgi import WSGIHandler
    from werkzeug.serving import make_server

    from tests.support import free_port

    server = make_server("127.0.0.1", free_port(), WSGIHandler(), threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="django-dashboard", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


@pytest.mark.browser
def test_staff_retries_a_failed_job_in_a_browser(dashboard_site: dict[str, Any], served: str, browser: Any) -> None:
    from django.conf import settings
    from django.test import Client
    from selenium.webdriver.common.by import By

    from tests.flask.chromium import click_to_load, notice_reads

    manager = dashboard_site["manager"]
    job_id = failed_job(manager, HOSTILE)
    client = Client()
    client.force_login(make_user(staff=True))
    session = client.cookies[settings.SESSION_COOKIE_NAME].value

    browser.get(f"{served}/queues/static/dashboard.css")  # on the site's origin, to set its cookie
    browser.add_cookie({"name": settings.SESSION_COOKIE_NAME, "value": session, "path": "/"})
    browser.get(f"{served}/queues/")
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{job_id}"]')
    assert HOSTILE in row.find_element(By.CSS_SELECTOR, "code.payload").text, "the payload is shown as text"
    click_to_load(browser, row.find_element(By.CSS_SELECTOR, "button.retry"))
    notice_reads(browser, f"Job {job_id} was queued again.")
    assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{job_id}"]')
    assert manager.connection("sqlite").failed_job(job_id) is None
