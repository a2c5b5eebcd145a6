"""Sphinx configuration for the rainier_sync documentation."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

project = "rainier_sync"
author = "The rainier_sync developers"
copyright = "2026, the rainier_sync developers"
release = "0.1.0"

extensions = ["sphinx.ext.autodoc"]
exclude_patterns = ["_build", "_perf"]
html_theme = "alabaster"
html_static_path = ["_static"]
autodoc_member_order = "bysource"
nitpicky = False
