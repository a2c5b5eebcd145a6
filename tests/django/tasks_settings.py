
"""A project whose TASKS use rainier_sync's backend: its worker must know the tasks."""

import os
import secrets

SECRET_KEY = secrets.token_hex(32)
USE_TZ = True
INSTALLED_APPS = ["rainier_sync.django", "tests.django.taskapp"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["TASKS_DB"]}}
RAINIER_QUEUES = {"connections": {"main": {"driver": "database", "alias": "default"}}}
TASKS = {"default": {"BACKEND": "rainier_sync.django.TasksBackend"}}
