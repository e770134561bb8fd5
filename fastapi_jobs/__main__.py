"""``python -m fastapi_jobs``: the ``fastapi-jobs`` command."""

import sys

from ._cli import main

sys.exit(main())
