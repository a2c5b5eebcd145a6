"""tests/django/inner runs with Django configured in the test process itself, so
it runs only in a pytest process of its own (tests/django/test_site.py starts
one per module), where no other test has configured Django first."""

import os

#: Set by tests/django/test_site.py for the pytest process it starts.
INNER = "RAINIER_DJANGO_INNER"

collect_ignore = [] if os.environ.get(INNER) else ["inner"]
