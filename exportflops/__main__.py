"""``python -m exportflops``: the same as the ``exportflops`` command."""

import sys

from .cli import main

sys.exit(main())
