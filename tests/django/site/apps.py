from django.apps import AppConfig


class SiteConfig(AppConfig):
    name = "tests.django.site"
    label = "site"
