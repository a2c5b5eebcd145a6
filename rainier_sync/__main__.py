"""``python -m rainier_sync``: the command line (see :mod:`rainier_sync.cli`)."""

import sys

from .cli import main

sys.exit(main())
