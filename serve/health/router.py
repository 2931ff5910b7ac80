"""`/healthz` and `/readyz` (no key: probes) and `/metrics` (audit role, Prometheus text)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response

from ..api_keys import KeyEntry
from ..dependencies import Metrics, Probes
from ..error_mapping import documented_errors
from ..roles import require
from .protocol import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up (no key needed)."""
    return Health()


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(health: Probes):
    """The formalizer server answers and serves both adapters (no key needed)."""
    r = await health.readiness()
    return JSONResponse(r.model_dump(), status_code=200 if r.ready else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        **documented_errors(),
        200: {"description": "Prometheus text format", "content": {"text/plain": {}}},
    },
)
async def metrics_endpoint(metrics: Metrics, _key: KeyEntry = Depends(require("audit"))):
    """Prometheus metrics (audit role)."""
    return Response(metrics.exposition(), media_type=metrics.content_type)
