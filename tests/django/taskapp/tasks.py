"""A Django task of the tasks test project, found by autodiscovery."""

from rainier_sync.django.tasks import FRAMEWORK

if FRAMEWORK == "django.tasks":
    from django.tasks import task
else:
    from django_tasks import task


@task()
def ping(text: str) -> str:
    return text
