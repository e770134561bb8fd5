"""Serve the example app with uvicorn on 127.0.0.1:8000 (PORT overrides the port)."""

from __future__ import annotations

import logging
import os

import uvicorn


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        "example_app.main:app",
        host=os.environ.get("HOST", "127.0.0.1"),
        port=int(os.environ.get("PORT", "8000")),
        log_config=None,  # keep the root logging set up above
    )


if __name__ == "__main__":
    main()
