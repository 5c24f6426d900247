"""`python -m taskq.worker APP [--flags]`: the same as `taskq worker APP`."""

from __future__ import annotations

import sys

from taskq.worker.cli import main

if __name__ == "__main__":
    sys.exit(main())
