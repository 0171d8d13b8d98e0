"""``python -m slotless``: the same as the ``slotless`` command."""

import sys

from .cli import main

sys.exit(main())
