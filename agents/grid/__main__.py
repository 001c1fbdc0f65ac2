"""``python -m agents.grid``: see :mod:`agents.grid`."""

import sys

from agents.grid import main

sys.exit(main())
