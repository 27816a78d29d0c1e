"""The workflow endpoints: deploy, list, describe."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from ..wire import jsonable
from .errors import error_response
from .schemas import DeployResponse, WorkflowList, _responses
from .state import GatewayDep

_SPEC_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain",
               "application/json")

router = APIRouter(tags=["workflows"])


@router.post("/v1/workflows", status_code=201, response_model=DeployResponse, responses=_responses(400, 413, 415),
             openapi_extra={"requestBody": {"required": True, "content": {
                 t: {"schema": {"type": "string"}} for t in ("application/yaml", "text/plain", "application/json")}}})
async def deploy(request: Request, gw: GatewayDep) -> JSONResponse:
    """Deploy a workflow from its spec (YAML or JSON text in the body)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype and ctype not in _SPEC_TYPES:
        return error_response(415, "unsupported_media_type",
                              f"content-type {ctype!r} is not a spec; send the YAML or JSON text with content-type "
                              f"application/yaml (one of {', '.join(_SPEC_TYPES)}), e.g. curl --data-binary "
                              "@spec.yaml -H 'content-type: application/yaml'")
    body = await request.body()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return error_response(400, "bad_request", f"the spec is not UTF-8 text ({exc})")
    if not text.strip():
        return error_response(400, "bad_request", "the request body is empty; send the workflow spec (YAML or JSON)")
    name = await run_in_threadpool(gw.runtime.deploy, text)
    return JSONResponse({"workflow": name}, status_code=201, headers={"location": f"/v1/workflows/{name}"})


@router.get("/v1/workflows", response_model=WorkflowList)
def list_workflows(gw: GatewayDep) -> dict[str, list[str]]:
    """The deployed workflows."""
    return {"workflows": list(gw.runtime.workflows())}


@router.get("/v1/workflows/{name}", response_model=dict[str, Any], responses=_responses(404))
def describe(name: str, gw: GatewayDep) -> JSONResponse:
    """The deployed workflow's spec, as the runtime describes it."""
    return JSONResponse(jsonable(gw.runtime.describe(name)))
