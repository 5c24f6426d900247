"""`python -m taskq.supervisor APP --workers N`: the same as `taskq run APP --workers N`."""

from __future__ import annotations

import sys

from taskq.supervisor.main import main

if __name__ == "__main__":
    sys.exit(main())
