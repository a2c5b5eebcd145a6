"""A project whose TASKS use rainier_sync's backend: its worker must know the tasks."""

import os

SECRET_KEY = "tasks-settings-of-the-tests"
USE_TZ = True
INSTALLED_APPS = ["rainier_sync.django", "tests.django.taskapp"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["TASKS_DB"]}}
RAINIER_QUEUES = {"connections": {"main": {"driver": "database", "alias": "default"}}}
TASKS = {"default": {"BACKEND": "rainier_sync.django.TasksBackend"}}
