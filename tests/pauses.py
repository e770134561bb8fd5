"""``python -m tests.pauses [--pause 0.3] [pytest arguments]``: the pauser's
command, kept at the name the team's instructions give it. The tool itself (and
the pytest plugin it loads in every pytest process) is tests/support/pauses.py."""

from __future__ import annotations

import sys

from .support.pauses import main

if __name__ == "__main__":
    sys.exit(main())
