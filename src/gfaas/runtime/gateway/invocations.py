"""The invocation endpoints: invoke a workflow, ask where an invocation is, fetch its result.

``timeout`` (invoke) and ``wait`` (result) are bounded by the app's ``max_timeout_s``. FastAPI takes that
bound from the endpoint's signature (it is in the OpenAPI schema, and more is answered 422), so
:func:`router` is built per app and binds the bounded ``Query`` defaults onto the module-level endpoints
with :func:`functools.partial`; everything else reaches the app through :data:`~.state.GatewayDep`.
"""

from __future__ import annotations

import functools
import inspect
import re
import time
from typing import Annotated, Any, Literal, Protocol

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from ...errors import GfaasError, NotFound, Overloaded
from ..result import InvocationResult
from ..wire import WireError, decode_array, result_document
from .admission import wait_until, watch
from .errors import encode_json, error_response
from .schemas import (
    ErrorBody,
    InvocationAccepted,
    InvocationRequest,
    InvocationStatus,
    ResultDocument,
    _responses,
)
from .state import _FINISHED, GatewayDep, _Gateway

# An invocation ID as the gateway accepts it in a URL: anything else is answered 404 without asking the runtime.
_INVOCATION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Requests and results up to this many bytes of arrays are decoded, submitted and encoded on the event
# loop itself: a hop to a worker thread and back costs more than the work (tens of microseconds each,
# and the GIL handed over twice). Larger ones go to the thread pool, so one big body never stalls the loop.
ON_LOOP_BYTES = 64 * 1024

OutputsMode = Annotated[Literal["full", "digest"], Query(
    description="full: outputs as base64 arrays; digest: dtype, shape and SHA-256 only")]


def _json_bytes(res: InvocationResult, outputs: str = "full") -> bytes:
    # msgspec, not json.dumps: the same compact UTF-8 JSON (result_document leaves no NaN or infinity
    # for either to refuse) in 2 us rather than 19 for a tiny result, on every answered request.
    return encode_json(result_document(res, outputs))


def _urls(request: Request, inv: str) -> dict[str, str]:
    base = request.scope.get("root_path", "").rstrip("/")
    return {"status_url": f"{base}/v1/invocations/{inv}", "result_url": f"{base}/v1/invocations/{inv}/result"}


def _check_id(invocation_id: str) -> None:
    if not _INVOCATION_ID.match(invocation_id):
        raise NotFound(f"no invocation {invocation_id[:140]!r} is known here")


async def _status_or(gw: _Gateway, inv: str, default: str) -> str:
    try:
        return str(await run_in_threadpool(gw.runtime.status, inv))
    except Exception:  # the status is a courtesy in an answer that is already an error
        return default


async def _result_response(gw: _Gateway, res: InvocationResult, outputs: str = "full") -> Response:
    gw.tracker.finished(res)
    # base64 and JSON of big outputs: off the event loop; small ones cost less than the hop
    if sum(a.nbytes for a in res.outputs.values()) <= ON_LOOP_BYTES:
        return Response(_json_bytes(res, outputs), media_type="application/json")
    body = await run_in_threadpool(_json_bytes, res, outputs)
    return Response(body, media_type="application/json")


async def invoke(request: Request, name: str, body: InvocationRequest, gw: GatewayDep,
                 mode: Literal["sync", "async"] = "sync",
                 timeout: float | None = Query(None, ge=0),  # bounded per app: see router()
                 outputs: OutputsMode = "full") -> Response:
    """Invoke a workflow. ``sync`` (default) answers with the result document (200, also when the
    invocation failed: see ``status``/``error``) or 504 after ``timeout`` seconds; ``async`` answers
    202 at once with the URLs to poll. 429 with ``Retry-After`` when the workflow is at its admission
    limit or the invocation could not finish within its ``timeout`` (decided before the runtime is
    asked)."""
    wait_s = gw.default_timeout_s if timeout is None else timeout
    # admitted by the guard (gateway.guard): the place it holds is freed by the done-callback below,
    # or by the guard if the invocation never reaches the runtime
    limit = getattr(request.state, "admission", None)
    return await run_invocation(request, name, body, gw, mode, wait_s, outputs, limit, time.monotonic())


class InvocationBody(Protocol):
    """What :func:`run_invocation` reads of a request body: :class:`~.schemas.InvocationRequest` (the
    route's) or :class:`~.fastpath.FastBody` (the guard's fast path); each array has ``as_doc()``."""

    @property
    def inputs(self) -> Any: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def transport(self) -> str | None: ...


async def run_invocation(request: Request, name: str, body: InvocationBody, gw: _Gateway, mode: str,
                         wait_s: float, outputs: str, limit: Any, t0: float) -> Response:
    """An invocation request, validated (by the route, or by the guard's fast path, :mod:`.fastpath`):
    decode its arrays, submit it, wait for its result (sync) and answer."""
    runtime = gw.runtime
    inputs: dict[str, np.ndarray] | None = None

    def decode() -> dict[str, np.ndarray]:
        assert body.inputs is not None
        return {k: decode_array(a.as_doc(), f"inputs.{k}") for k, a in body.inputs.items()}

    small = body.inputs is None or sum(len(a.data_b64) for a in body.inputs.values()) <= ON_LOOP_BYTES
    if body.inputs is not None:
        try:
            inputs = decode() if small else await run_in_threadpool(decode)
        except WireError as exc:  # the request's arrays; a WireError elsewhere is the server's problem
            return error_response(400, "bad_request", str(exc))

    # A synchronous request's functions must start before its client gives up: work done after that
    # is wasted, which is how goodput collapses under overload.
    deadline_s = wait_s if mode == "sync" and wait_s > 0 else None

    def submit() -> str:
        return runtime.submit(name, inputs, body.seed, transport=body.transport, deadline_s=deadline_s)

    try:
        # Small inputs of a runtime that can call back: submitting sends the first tasks (or queues
        # them) and returns, storing nothing on a node, so it runs here rather than on a thread.
        quick = small and body.transport in (None, "gfaas") and bool(getattr(runtime, "quick_submits", False))
        inv = submit() if quick else await run_in_threadpool(submit)
    except Overloaded:
        gw.tracker.rejected.inc(workflow=name, reason="overloaded")
        raise

    def ended(res: InvocationResult) -> None:  # on the loop, once, when the invocation finishes
        ok = res.status == "done"
        b = res.breakdown  # the runtime's time outside its queues: the latency without queueing
        gw.admissions.finished(limit, time.monotonic() - t0 if ok else None,
                               max(0.0, b.total_s - b.queue_s) if ok and b.total_s > 0 else None)
        gw.tracker.finished(res)

    fut = watch(runtime, inv, ended)
    request.state.watched = True  # from here the callback frees the admission place
    if fut is None:
        gw.admissions.finished(limit, None)  # no callbacks: the place is held only while submitting
    gw.tracker.submitted(inv, name, watched=fut is not None)
    urls = _urls(request, inv)
    if mode == "async":
        status = await _status_or(gw, inv, "queued")
        return JSONResponse({"invocation_id": inv, "status": status, **urls}, status_code=202,
                            headers={"location": urls["status_url"]})
    try:
        if fut is not None:
            if not await wait_until(fut, wait_s):
                raise TimeoutError
            res = fut.result()
        else:
            res = await gw.wait(functools.partial(runtime.result, inv, timeout=wait_s))
    except TimeoutError:
        status = await _status_or(gw, inv, "running")
        return error_response(504, "timeout", f"invocation {inv} of {name!r} did not finish within {wait_s:g} s; "
                              f"what had started goes on, what had not fails as expired: poll GET {urls['result_url']}?wait=SECONDS", invocation_id=inv,
                              status=status, status_url=urls["status_url"], result_url=urls["result_url"])
    return await _result_response(gw, res, outputs)


def invocation_status(invocation_id: str, gw: GatewayDep) -> dict[str, str]:
    """Where an invocation is: queued, running, done or failed."""
    _check_id(invocation_id)
    return {"invocation_id": invocation_id, "status": str(gw.runtime.status(invocation_id))}


async def invocation_result(request: Request, invocation_id: str, gw: GatewayDep,
                            wait: float = Query(0.0, ge=0),  # bounded per app: see router()
                            outputs: OutputsMode = "full") -> Response:
    """The result document once the invocation finished (waiting up to ``wait`` seconds for it);
    202 with its status while it has not."""
    _check_id(invocation_id)
    if wait > 0 and getattr(gw.runtime, "add_done_callback", None) is not None:
        try:
            fut = watch(gw.runtime, invocation_id, lambda res: None)
            assert fut is not None
            if not await wait_until(fut, wait):
                raise TimeoutError
            return await _result_response(gw, fut.result(), outputs)
        except TimeoutError:
            wait = 0.0  # not finished within the wait: answered below without waiting again
    for _ in range(2):
        try:
            res = await gw.wait(functools.partial(gw.runtime.result, invocation_id, timeout=wait))
        except TimeoutError:
            status = str(await run_in_threadpool(gw.runtime.status, invocation_id))
            if status in _FINISHED:
                wait = 0.0  # finished between the two calls: fetch it
                continue
            return JSONResponse({"invocation_id": invocation_id, "status": status,
                                 **_urls(request, invocation_id)}, status_code=202)
        return await _result_response(gw, res, outputs)
    raise GfaasError(f"runtime says invocation {invocation_id} is finished but has no result for it")


def _bounded(endpoint: Any, **defaults: Any) -> dict[str, Any]:
    """``endpoint`` with per-app ``Query`` defaults bound, plus the name and description FastAPI would
    have taken from it (a partial has neither), for :meth:`APIRouter.add_api_route`."""
    return {"endpoint": functools.partial(endpoint, **defaults), "name": endpoint.__name__,
            "description": inspect.cleandoc(endpoint.__doc__ or "")}


def router(max_timeout_s: float) -> APIRouter:
    """The invocation routes of an app whose waits are bounded by ``max_timeout_s``."""
    r = APIRouter(tags=["invocations"])
    r.add_api_route("/v1/workflows/{name}/invocations", methods=["POST"], response_model=ResultDocument,
                    responses={202: {"model": InvocationAccepted, "description": "mode=async: accepted"},
                               **_responses(400, 404, 413, 422, 429),
                               504: {"model": ErrorBody, "description": "sync: not finished within timeout; poll "
                                                                        "the result_url it gives"}},
                    **_bounded(invoke, timeout=Query(None, ge=0, le=max_timeout_s)))
    r.add_api_route("/v1/invocations/{invocation_id}", invocation_status, methods=["GET"],
                    response_model=InvocationStatus, responses=_responses(404))
    r.add_api_route("/v1/invocations/{invocation_id}/result", methods=["GET"], response_model=ResultDocument,
                    responses={202: {"model": InvocationAccepted, "description": "not finished yet (after waiting)"},
                               **_responses(404, 422)},
                    **_bounded(invocation_result, wait=Query(0.0, ge=0, le=max_timeout_s)))
    return r
