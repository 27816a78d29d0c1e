"""The workflow endpoints: deploy, list, describe, undeploy.

A deploy is screened here before the runtime sees it (:func:`~gfaas.runtime.spec.screen`): the spec's
size was bounded by the guard, its YAML may hold no anchors or aliases and nest at most 32 deep, it
may have at most ``max_functions`` functions, its handlers must come from ``handler_packages`` (checked
by name before anything is imported), and at most ``max_workflows`` may be deployed at once.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from ..spec import screen
from ..wire import jsonable
from .errors import error_response
from .schemas import DeployResponse, UndeployResponse, WorkflowList, _responses
from .state import GatewayDep, _Gateway

_SPEC_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain",
               "application/json")
# What the OpenAPI schema says a spec body is: text with something in it (an empty one is a 422).
_SPEC_BODY = {"type": "string", "minLength": 1, "pattern": r"\S",
              "description": "the workflow spec, YAML or JSON text (see docs/workflows.md)"}

router = APIRouter(tags=["workflows"])


def _deploy(gw: _Gateway, text: str) -> str | JSONResponse:
    """Screen the spec, check the workflow cap and deploy (in a worker thread: imports, worker start-up)."""
    lim = gw.limits
    screen(text, handler_packages=lim.handler_packages, max_functions=lim.max_functions, where="spec")
    with gw.deploy_lock:
        deployed = len(gw.runtime.workflows())
        if deployed + gw.deploying >= lim.max_workflows:
            return error_response(409, "too_many_workflows",
                                  f"{deployed} workflows are deployed (and {gw.deploying} being deployed), the "
                                  f"gateway's max_workflows={lim.max_workflows}; undeploy one first "
                                  "(DELETE /v1/workflows/NAME) or start the gateway with a larger max_workflows")
        gw.deploying += 1
    try:
        return gw.runtime.deploy(text)
    finally:
        with gw.deploy_lock:
            gw.deploying -= 1


@router.post("/v1/workflows", status_code=201, response_model=DeployResponse,
             responses=_responses(400, 409, 413, 415, 422),
             openapi_extra={"requestBody": {"required": True, "content": {
                 t: {"schema": _SPEC_BODY} for t in ("application/yaml", "text/plain", "application/json")}}})
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
        message = "the request body is empty; send the workflow spec (YAML or JSON)"
        return error_response(422, "invalid_request", message, errors=[{"field": "body", "message": message}])
    outcome = await run_in_threadpool(_deploy, gw, text)
    if isinstance(outcome, JSONResponse):
        return outcome
    return JSONResponse({"workflow": outcome}, status_code=201, headers={"location": f"/v1/workflows/{outcome}"})


@router.get("/v1/workflows", response_model=WorkflowList)
def list_workflows(gw: GatewayDep) -> dict[str, list[str]]:
    """The deployed workflows."""
    return {"workflows": list(gw.runtime.workflows())}


@router.get("/v1/workflows/{name}", response_model=dict[str, Any], responses=_responses(404))
def describe(name: str, gw: GatewayDep) -> JSONResponse:
    """The deployed workflow's spec, as the runtime describes it."""
    return JSONResponse(jsonable(gw.runtime.describe(name)))


@router.delete("/v1/workflows/{name}", response_model=UndeployResponse, responses=_responses(404))
def undeploy(name: str, gw: GatewayDep) -> dict[str, str]:
    """Undeploy a workflow: its workers stop, its unfinished invocations fail, and the name is free again."""
    gw.runtime.undeploy(name)
    return {"workflow": name, "status": "undeployed"}
