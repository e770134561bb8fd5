"""``python -m fastapi_jobs``: the ``fastapi-jobs`` command."""

import sys

from ._cli.main import main

sys.exit(main())
