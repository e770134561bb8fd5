"""The health route: whether the scheduler does its work, for a platform's
probe (HTTP 200 or 503). Apart from the status router, which names jobs,
hosts and errors and sits behind the app's auth: a probe carries none."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from .._errors import ConfigurationError, short
from .._status import Health
from .http import checked_query

if TYPE_CHECKING:
    from .._core.seam import Seam

__all__ = ["build_health_router"]

# What a probe can ask for as written: no query, fragment, space or parameter.
_PATH = re.compile(r"[A-Za-z0-9\-_.~/]+")


def build_health_router(seam: Seam, path: str) -> APIRouter:
    if (
        not isinstance(path, str)
        or not path.startswith("/")
        or path.endswith("/")
        or not _PATH.fullmatch(path)
    ):
        raise ConfigurationError(
            f"health_router(path={short(path)}): give a path that starts with '/' and "
            "does not end with one, of letters, digits and - _ . ~ / only, e.g. '/healthz/jobs'"
        )
    router = APIRouter(tags=["jobs"], dependencies=[Depends(checked_query)])

    @router.api_route(
        path,
        methods=["GET", "HEAD"],  # a load balancer's check may be a HEAD
        response_model=Health,
        summary="Whether the scheduler does its work",
        description="200 while the scheduler runs and its store answers; 503 when it is "
        "not running, or when every claim or every heartbeat has failed for longer than "
        "the store's lease. No job, host or error message is shown.",
        responses={503: {"model": Health, "description": "Not ok: `status` says why."}},
    )
    async def health() -> JSONResponse:
        now = seam.health()
        return JSONResponse(
            now.model_dump(mode="json"),
            status_code=200 if now.ok else 503,
            headers={"Cache-Control": "no-store"},
        )

    return router
