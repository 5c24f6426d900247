"""`python -m taskq.cli` runs the `taskq` command."""

from __future__ import annotations

import sys

from taskq.cli import main

sys.exit(main())
