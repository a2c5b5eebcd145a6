"""An application module that fails to import, for the ``--app`` error tests."""

raise RuntimeError("the application's settings module is missing")
