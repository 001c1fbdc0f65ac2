"""``python -m reports.stream``: see :mod:`reports.stream`."""

import sys

from .page import main

sys.exit(main())
