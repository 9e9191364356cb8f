"""``python -m perfguard`` is the ``perfguard`` command."""

import sys

from perfguard.cli import main

sys.exit(main())
