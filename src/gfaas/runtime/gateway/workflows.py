"""The workflow endpoints: deploy (a spec, or a code package with its spec inside), list, describe,
versions, rollback, undeploy.

A deploy is screened here before the runtime sees it (:func:`~gfaas.runtime.spec.screen`): the spec's
size was bounded by the guard, its YAML may hold no anchors or aliases and nest at most 32 deep, it
may have at most ``max_functions`` functions, its handlers must come from ``handler_packages`` (checked
by name before anything is imported), and at most ``max_workflows`` may be deployed at once. A code
package (an archive, content type ``application/gzip``, ``application/x-tar`` or ``application/zip``)
holds ``workflow.yaml`` at its root beside the code; its handlers must be modules of the package, which
only the workflow's sandboxed workers ever import (docs/deploying-code.md).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from ...errors import CodePackageError
from ..codepkg import read_archive
from ..spec import screen
from ..wire import jsonable
from .errors import error_response
from .limits import CODE_TYPES
from .schemas import (
    DeployResponse,
    RollbackRequest,
    RollbackResponse,
    UndeployResponse,
    WorkflowList,
    _responses,
)
from .state import GatewayDep, _Gateway

_SPEC_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain",
               "application/json")
# What the OpenAPI schema says a spec body is: text with something in it (an empty one is a 422).
_SPEC_BODY = {"type": "string", "minLength": 1, "pattern": r"\S",
              "description": "the workflow spec, YAML or JSON text (see docs/workflows.md)"}

router = APIRouter(tags=["workflows"])


SPEC_NAMES = ("workflow.yaml", "workflow.yml", "workflow.json")


def _spec_in(code: bytes, max_bytes: int) -> str:
    """The spec text inside a code package (checked as any package is)."""
    pkg = read_archive(code, max_bytes=max_bytes)
    found = [n for n in SPEC_NAMES if n in pkg.files]
    if len(found) != 1:
        raise CodePackageError(f"a code package holds its spec at its root as one of {', '.join(SPEC_NAMES)}; "
                               f"this one has {found or 'none'} (gfaas deploy SPEC --code DIR packs it so)")
    try:
        return pkg.files[found[0]][0].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CodePackageError(f"{found[0]} in the code package is not UTF-8 text ({exc})") from None


def _deploy(gw: _Gateway, text: str, code: bytes | None = None) -> str | JSONResponse:
    """Screen the spec, check the workflow cap and deploy (in a worker thread: imports, worker start-up)."""
    lim = gw.limits
    if code is not None:
        text = _spec_in(code, lim.max_code_bytes)
    # A package's handlers are its own modules: checked against the package by the runtime, imported
    # by its sandboxed workers only. Other handlers must come from the allowed packages.
    screen(text, handler_packages=lim.handler_packages, max_functions=lim.max_functions, where="spec",
           import_handlers=code is None)
    with gw.deploy_lock:
        deployed = len(gw.runtime.workflows())
        if deployed + gw.deploying >= lim.max_workflows:
            return error_response(409, "too_many_workflows",
                                  f"{deployed} workflows are deployed (and {gw.deploying} being deployed), the "
                                  f"gateway's max_workflows={lim.max_workflows}; undeploy one first "
                                  "(DELETE /v1/workflows/NAME) or start the gateway with a larger max_workflows")
        gw.deploying += 1
    try:
        return gw.runtime.deploy(text) if code is None else gw.runtime.deploy(text, code=code)
    finally:
        with gw.deploy_lock:
            gw.deploying -= 1


@router.post("/v1/workflows", status_code=201, response_model=DeployResponse,
             responses=_responses(400, 409, 413, 415, 422),
             openapi_extra={"requestBody": {"required": True, "content": {
                 **{t: {"schema": _SPEC_BODY} for t in ("application/yaml", "text/plain", "application/json")},
                 **{t: {"schema": {"type": "string", "format": "binary",
                                   "description": "a code package: an archive with workflow.yaml at its root"}}
                    for t in CODE_TYPES}}}})
async def deploy(request: Request, gw: GatewayDep) -> JSONResponse:
    """Deploy a workflow from its spec (YAML or JSON text in the body), or from a code package (an
    archive with ``workflow.yaml`` beside the handlers' modules). A deployed name gets a new version."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in CODE_TYPES:
        archive = await request.body()
        if not archive:
            return error_response(422, "invalid_request", "the request body is empty; send the code package")
        done = await run_in_threadpool(_deploy, gw, "", archive)
        if isinstance(done, JSONResponse):
            return done
        return JSONResponse({"workflow": done}, status_code=201, headers={"location": f"/v1/workflows/{done}"})
    if ctype and ctype not in _SPEC_TYPES:
        return error_response(415, "unsupported_media_type",
                              f"content-type {ctype!r} is not a spec; send the YAML or JSON text with content-type "
                              f"application/yaml (one of {', '.join(_SPEC_TYPES)}), e.g. curl --data-binary "
                              "@spec.yaml -H 'content-type: application/yaml'; or a code package as "
                              f"{' or '.join(CODE_TYPES[::2])}")
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


@router.get("/v1/workflows/{name}/versions", response_model=dict[str, Any], responses=_responses(404))
def versions(name: str, gw: GatewayDep) -> JSONResponse:
    """Every version of the workflow, oldest first (number, current, created, note, code digest)."""
    return JSONResponse({"workflow": name, "versions": jsonable(gw.runtime.versions(name))})


@router.get("/v1/workflows/{name}/status", response_model=dict[str, Any], responses=_responses(404))
def status(name: str, gw: GatewayDep) -> JSONResponse:
    """The workflow's workers per function (warm, idle, busy, starting), queues, scaling targets and
    bounds, cold starts and worker-seconds, and the nodes' reservations (docs/autoscaling.md)."""
    return JSONResponse(jsonable(gw.runtime.scaling_status(name)))


@router.post("/v1/workflows/{name}/rollback", response_model=RollbackResponse, responses=_responses(400, 404, 422))
async def rollback(name: str, req: RollbackRequest, gw: GatewayDep) -> dict[str, Any]:
    """Make an old version current again (as a new version): body ``{"version": N}``."""
    number = await run_in_threadpool(gw.runtime.rollback, name, req.version)
    return {"workflow": name, "version": number}


@router.delete("/v1/workflows/{name}", response_model=UndeployResponse, responses=_responses(404))
def undeploy(name: str, gw: GatewayDep) -> dict[str, str]:
    """Undeploy a workflow: its workers stop, its unfinished invocations fail, and the name is free again."""
    gw.runtime.undeploy(name)
    return {"workflow": name, "status": "undeployed"}
