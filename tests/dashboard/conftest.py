from tests.flask.test_browser import browser  # noqa: F401 - the headless Chromium fixture, shared
