"""``python -m reports.classinc``: see :mod:`reports.classinc`."""

import sys

from .page import main

sys.exit(main())
