"""The tools the tests and the bench share, apart from the tests themselves.

- ``postgres``: a throwaway PostgreSQL server (``PostgresServer``).
- ``cluster``: real uvicorn processes of tests/apps/ sharing one database.
- ``instances``: schedulers on a real store standing for instances in one process.
- ``waiting``: ``poll`` (in an event loop) and ``wait_until`` (outside one).
- ``ports``: ``free_port``.
- ``pauses``: the pauser (``python -m tests.pauses``) and its pytest plugin.
- ``screenshot``: retakes the status page's screenshot, docs/guides/status-page.png
  (``python -m tests.support.screenshot``).

A package inside tests/ rather than a top-level one: the repository's top level
stays the product, its tests, its example, its docs, its bench and its CI, and
pytest collects nothing here (no ``test_*`` files), while ``tests.support`` is
importable from the bench run from the repository's root. Fixtures stay in
tests/conftest.py, which pytest needs beside the tests.
"""
