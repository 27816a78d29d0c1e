"""The gateway's own endpoints: liveness, metrics, and ``/`` (a redirect to the dashboard)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from ..metrics import CONTENT_TYPE
from .schemas import Health
from .state import GatewayDep

router = APIRouter(tags=["gateway"])


@router.get("/", include_in_schema=False)
def root() -> RedirectResponse:
    """The gateway's address opened in a browser: the dashboard (the redirect itself needs no token)."""
    return RedirectResponse("/dashboard", status_code=307)


@router.get("/healthz", response_model=Health)
async def healthz() -> dict[str, str]:
    """Liveness: the gateway answers."""
    return {"status": "ok"}


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format 0.0.4"}})
def metrics(gw: GatewayDep) -> Response:
    """Prometheus metrics (text exposition format)."""
    return Response(gw.registry.render(), media_type=CONTENT_TYPE)
