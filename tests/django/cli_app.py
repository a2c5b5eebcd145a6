"""The example shop's manager for ``rainier-sync --app tests.django.cli_app:manager``,
to compare ``manage.py queue`` with the command line it mirrors."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
django.setup()

from rainier_sync.django import get_manager  # noqa: E402

manager = get_manager()
