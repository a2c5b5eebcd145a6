"""Settings of the example shop: SQLite by default; ``SHOP_DATABASE=postgresql``
or ``SHOP_DATABASE=mysql`` (with ``SHOP_DB_NAME``, ``SHOP_DB_HOST``,
``SHOP_DB_PORT``, ``SHOP_DB_USER``, ``SHOP_DB_PASSWORD``) for a server."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY") or os.urandom(32).hex()
DEBUG = os.environ.get("SHOP_DEBUG", "") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rainier_sync.django",
    "orders",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
]
ROOT_URLCONF = "shop.urls"
WSGI_APPLICATION = "shop.wsgi.application"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_engine = os.environ.get("SHOP_DATABASE", "sqlite")
if _engine == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SHOP_DB_NAME") or str(BASE_DIR / "shop.sqlite3"),
        }
    }
elif _engine in ("postgresql", "mysql"):
    if _engine == "mysql":
        # Django's MySQL backend speaks through MySQLdb; PyMySQL stands in for it.
        import pymysql

        pymysql.version_info = (2, 2, 1, "final", 0)
        pymysql.install_as_MySQLdb()
    DATABASES = {
        "default": {
            "ENGINE": f"django.db.backends.{_engine}",
            "NAME": os.environ.get("SHOP_DB_NAME", "shop"),
            "HOST": os.environ.get("SHOP_DB_HOST", "127.0.0.1"),
            "PORT": os.environ.get("SHOP_DB_PORT", ""),
            "USER": os.environ.get("SHOP_DB_USER", "postgres" if _engine == "postgresql" else "root"),
            "PASSWORD": os.environ.get("SHOP_DB_PASSWORD", ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    }
else:
    raise RuntimeError(f"SHOP_DATABASE must be sqlite, postgresql or mysql, got {_engine!r}")

# The jobs live in the application's own database: a dispatch inside
# transaction.atomic() commits, or rolls back, with the order.
RAINIER_QUEUES = {"connections": {"main": {"driver": "database", "alias": "default"}}}
