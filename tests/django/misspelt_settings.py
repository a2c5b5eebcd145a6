"""Settings with a misspelt rainier_sync setting: Django must refuse to start."""

import secrets

SECRET_KEY = secrets.token_hex(32)
INSTALLED_APPS = ["rainier_sync.django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "unused.sqlite3"}}
RAINIER_QUEUS = {"connections": {"main": {"driver": "database", "alias": "default"}}}
