"""``python -m reports.classic``: see :mod:`reports.classic`."""

import sys

from .page import main

sys.exit(main())
