"""The HTTP gateway: deploy workflows, invoke them, fetch results and metrics over HTTP/JSON.

:func:`create_app` builds a FastAPI application in front of any :class:`~gfaas.runtime.api.RuntimeAPI`;
:func:`serve` runs it with uvicorn in a background thread on loopback. ``docs/gateway.md`` documents
the endpoints, encodings and status codes; in short:

=======  ====================================  =====================================================
GET      ``/healthz``                          ``{"status": "ok"}``
POST     ``/v1/workflows``                     spec text (YAML/JSON) -> 201 ``{"workflow": name}``
GET      ``/v1/workflows``                     ``{"workflows": [...]}``
GET      ``/v1/workflows/{name}``              the deployed spec's description
POST     ``/v1/workflows/{name}/invocations``  ``?mode=sync|async&timeout=S``; body ``{"inputs": ...}``
                                               or ``{"seed": N}`` -> 200 result / 202 accepted
GET      ``/v1/invocations/{id}``              ``{"invocation_id", "status"}``
GET      ``/v1/invocations/{id}/result``       ``?wait=S`` -> 200 result document, 202 while running
GET      ``/metrics``                          Prometheus text format
=======  ====================================  =====================================================

Design decisions:

* The HTTP status reports on the *request*; the invocation's own outcome is in the body. A sync
  invocation whose function failed is ``200`` with ``"status": "failed"`` and ``"error"`` set.
* Errors are JSON ``{"error": CODE, "message": TEXT, ...}``: 400 ``bad_request`` (bad spec, inputs that
  do not fit the workflow, undecodable arrays), 404 ``not_found``, 413 ``payload_too_large``, 415
  ``unsupported_media_type``, 422 ``invalid_request`` (the body or query does not match the schema;
  ``errors`` lists each field), 429 ``overloaded`` (with ``Retry-After``), 504 ``timeout`` (with the
  invocation's URLs to poll), 500 ``internal`` (logged to ``gfaas.gateway`` with a reference).
* Waiting (sync invocations, ``?wait=``) happens in a separate, bounded pool of threads so that long
  waits cannot starve quick requests; every wait is bounded by ``max_timeout_s``.
* Metrics count every invocation submitted through this gateway exactly once when it finishes: when a
  client first receives its result, or, for invocations nobody fetches, when the background sweep
  (every ``sweep_interval_s`` while the app runs) sees it finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import math
import re
import secrets
import socket
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

import anyio
import numpy as np
from fastapi import FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ConfigError, GfaasError, NotFound, Overloaded
from ..units import MiB
from .api import RuntimeAPI
from .metrics import CONTENT_TYPE, LATENCY_BUCKETS, Registry
from .result import InvocationResult
from .wire import WireError, decode_array, jsonable, result_document

__all__ = ["GatewayServer", "create_app", "serve"]

log = logging.getLogger("gfaas.gateway")
T = TypeVar("T")

# anyio >= 4.1 calls it abandon_on_cancel, earlier versions cancellable
_ABANDON = "abandon_on_cancel" if "abandon_on_cancel" in inspect.signature(anyio.to_thread.run_sync).parameters \
    else "cancellable"
# An invocation ID as the gateway accepts it in a URL: anything else is answered 404 without asking the runtime.
_INVOCATION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_SPEC_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain",
               "application/json")
_FINISHED = ("done", "failed")
_BODY_HINT = ('expected a JSON body {"inputs": {NAME: {"dtype": ..., "shape": [...], "data_b64": ...}}} '
              'or {"seed": INT}')

# -- request and response models (they make the OpenAPI schema; responses are written directly)

DType = Literal["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "complex64", "complex128"]


class ArrayDoc(BaseModel):
    """An n-d array: raw C-order little-endian bytes, base64 (standard alphabet, padded)."""

    model_config = ConfigDict(extra="forbid")
    dtype: DType
    shape: list[Annotated[StrictInt, Field(ge=0)]] = Field(max_length=32, description="[] for a 0-d array")
    data_b64: StrictStr


class ArrayDigest(BaseModel):
    """An output summarised (``?outputs=digest``): SHA-256 of the bytes ``data_b64`` would carry."""

    dtype: DType
    shape: list[int]
    sha256: str


class InvocationRequest(BaseModel):
    """Exactly one of ``inputs`` (an array per declared input) or ``seed`` (the workflow's own generator)."""

    model_config = ConfigDict(extra="forbid")
    inputs: dict[str, ArrayDoc] | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)] | None = None
    transport: Annotated[StrictStr, Field(max_length=32)] | None = Field(
        None, description="how data passes between functions (runtime-specific, e.g. gfaas or redis)")

    @model_validator(mode="after")
    def _one_source(self) -> InvocationRequest:
        if (self.inputs is None) == (self.seed is None):
            raise ValueError("give exactly one of `inputs` ({NAME: {dtype, shape, data_b64}}) or `seed` (an "
                             "integer for the workflow's input generator)"
                             + (", not both" if self.inputs is not None else ""))
        return self


class DeployResponse(BaseModel):
    workflow: str


class WorkflowList(BaseModel):
    workflows: list[str]


class Health(BaseModel):
    status: Literal["ok"]


class InvocationStatus(BaseModel):
    invocation_id: str
    status: str


class InvocationAccepted(BaseModel):
    """An invocation that has not finished: where to ask about it."""

    invocation_id: str
    status: str
    status_url: str
    result_url: str


class BreakdownDoc(BaseModel):
    queue_s: float
    host_pass_s: float
    fn_pass_s: float
    compute_s: float
    total_s: float


class FunctionDoc(BaseModel):
    function: str
    worker: str
    queued_s: float
    get_s: float
    compute_s: float
    put_s: float
    skipped: bool


class ResultDocument(BaseModel):
    """A finished invocation. ``status`` is ``done`` or ``failed`` (then ``error`` says why)."""

    invocation_id: str
    workflow: str
    status: Literal["done", "failed"]
    error: str | None
    outputs: dict[str, ArrayDoc | ArrayDigest]
    scalars: dict[str, Any]
    breakdown: BreakdownDoc
    functions: list[FunctionDoc]


class FieldError(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    """Every error response. Some carry more: ``errors`` (422), ``retry_after_s`` (429), the invocation's
    ``invocation_id``/``status``/``status_url``/``result_url`` (504)."""

    model_config = ConfigDict(extra="allow")
    error: str
    message: str
    errors: list[FieldError] | None = None


def _error(http_status: int, code: str, message: str, headers: Mapping[str, str] | None = None,
           **extra: Any) -> JSONResponse:
    return JSONResponse({"error": code, "message": message, **extra}, status_code=http_status,
                        headers=dict(headers or {}))


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody} for code in codes}


# -- invocation accounting


class _Tracker:
    """Counts each invocation submitted through the gateway once, when it finishes."""

    def __init__(self, runtime: RuntimeAPI, registry: Registry, max_pending: int) -> None:
        self._runtime = runtime
        self._lock = threading.Lock()
        self._pending: dict[str, str] = {}  # invocation ID -> workflow, oldest first
        self._max_pending = max_pending
        self._sweep_failing = False
        self.invocations = registry.counter(
            "gfaas_invocations_total", "Invocations submitted through the gateway that finished, by outcome.",
            ["workflow", "status"])
        self.rejected = registry.counter(
            "gfaas_invocations_rejected_total", "Invocations refused at submit (reason: overloaded).",
            ["workflow", "reason"])
        self.latency = registry.histogram(
            "gfaas_invocation_latency_seconds",
            "End-to-end latency (submit to result, the runtime's total_s) of successful invocations.",
            ["workflow"], LATENCY_BUCKETS)
        self.queue = registry.counter(
            "gfaas_queue_seconds_total", "Time invocations waited for workers, summed over functions.",
            ["workflow"])
        self.data_pass = registry.counter(
            "gfaas_data_pass_seconds_total",
            "Time spent passing data: host (request inputs in, results out) or function (between functions).",
            ["workflow", "kind"])
        self.compute = registry.counter(
            "gfaas_compute_seconds_total", "Time spent in function handlers.", ["workflow"])

    def submitted(self, invocation_id: str, workflow: str) -> None:
        with self._lock:
            self._pending[invocation_id] = workflow
            if len(self._pending) > self._max_pending:
                dropped = next(iter(self._pending))
                del self._pending[dropped]
                log.warning("more than %d unfinished invocations tracked; %s will not be counted in metrics",
                            self._max_pending, dropped)

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def finished(self, res: InvocationResult) -> bool:
        """Count ``res`` if it is the first time it is seen; True if it was counted now."""
        with self._lock:
            workflow = self._pending.pop(res.invocation_id, None)
        if workflow is None:
            return False
        workflow = res.workflow or workflow
        self.invocations.inc(workflow=workflow, status=str(res.status))
        b = res.breakdown
        if res.status == "done":
            self.latency.observe(b.total_s, workflow=workflow)
        self.queue.inc(max(b.queue_s, 0.0), workflow=workflow)
        self.data_pass.inc(max(b.host_pass_s, 0.0), workflow=workflow, kind="host")
        self.data_pass.inc(max(b.fn_pass_s, 0.0), workflow=workflow, kind="function")
        self.compute.inc(max(b.compute_s, 0.0), workflow=workflow)
        return True

    def forget(self, invocation_id: str) -> None:
        with self._lock:
            self._pending.pop(invocation_id, None)

    def sweep(self) -> int:
        """Count pending invocations that finished without anyone fetching them; returns how many."""
        with self._lock:
            ids = list(self._pending)
        counted = 0
        failing = False
        for inv in ids:
            try:
                if self._runtime.status(inv) not in _FINISHED:
                    continue
                counted += self.finished(self._runtime.result(inv, timeout=0))
            except NotFound:
                self.forget(inv)  # the runtime forgot it: nothing left to count
            except TimeoutError:
                continue
            except Exception:
                failing = True
                if not self._sweep_failing:  # once per stretch of failures, not every interval
                    log.exception("metrics sweep: asking the runtime about invocation %s failed", inv)
                break
        self._sweep_failing = failing
        return counted


class _Gateway:
    """What the endpoints share: the runtime, the metrics, the waiting pool."""

    def __init__(self, runtime: RuntimeAPI, *, max_waiters: int, max_pending: int) -> None:
        self.runtime = runtime
        self.registry = Registry()
        self.tracker = _Tracker(runtime, self.registry, max_pending)
        self.registry.gauge_callback("gfaas_queue_depth", "Requests waiting per function.",
                                     ["workflow", "function"], self._queue_depths)
        self._max_waiters = max_waiters
        self._limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _queue_depths(self) -> dict[tuple[str, ...], float]:
        try:
            depths = self.runtime.queue_depths()
        except Exception:
            log.exception("runtime.queue_depths() failed; /metrics omits gfaas_queue_depth")
            return {}
        out: dict[tuple[str, ...], float] = {}
        for key, n in depths.items():
            workflow, _, function = str(key).partition("/")
            out[(workflow, function)] = float(n)
        return out

    async def wait(self, fn: Callable[[], T]) -> T:
        """Run a blocking wait in the waiting pool (not the pool quick requests use)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            limiter = self._limiters.get(loop)
            if limiter is None:
                limiter = self._limiters[loop] = anyio.CapacityLimiter(self._max_waiters)
        # abandoned on cancel (server shutdown): the thread finishes its bounded wait on its own
        return await anyio.to_thread.run_sync(fn, limiter=limiter, **{_ABANDON: True})


# -- the ASGI guard: body size limit and the last line of defence against unexpected exceptions


class _TooLarge(Exception):
    pass


class _Guard:
    """Answers 413 for bodies over the limit and 500 (logged) for anything the app let escape."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _too_large(self) -> JSONResponse:
        return _error(413, "payload_too_large",
                      f"the request body is over the gateway's limit of {self.max_body_bytes} bytes; send smaller "
                      "inputs or start the gateway with a larger max_body_bytes", {"connection": "close"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await _error(400, "bad_request", "the Content-Length header is not an integer")(
                        scope, receive, send)
                    return
                if length > self.max_body_bytes:
                    await self._too_large()(scope, receive, send)
                    return
        received = 0
        too_large = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    too_large = True
                    raise _TooLarge()
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if too_large:
                return  # whatever the app answers to the cut-off body, the answer is 413
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception as exc:
            if not too_large:
                ref = secrets.token_hex(4)
                log.error("unexpected error (reference %s) answering %s %s", ref, scope.get("method"),
                          scope.get("path"), exc_info=exc)
                if started:
                    return  # too late for a 500; the server closes the connection
                await _error(500, "internal", f"internal error (reference {ref}); see the gateway log")(
                    scope, receive, send)
                return
        if too_large and not started:
            await self._too_large()(scope, receive, send)


# -- the application


def _json_bytes(res: InvocationResult, outputs: str = "full") -> bytes:
    return json.dumps(result_document(res, outputs), ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode()


OutputsMode = Annotated[Literal["full", "digest"], Query(
    description="full: outputs as base64 arrays; digest: dtype, shape and SHA-256 only")]


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


def create_app(runtime: RuntimeAPI, *, max_body_bytes: int = 256 * MiB, default_timeout_s: float = 60.0,
               max_timeout_s: float = 600.0, retry_after_s: int = 1, max_waiters: int = 256,
               sweep_interval_s: float = 1.0, max_pending: int = 1_000_000) -> FastAPI:
    """The gateway's FastAPI application in front of ``runtime``.

    Args:
        runtime: what deploys and runs workflows (see :class:`~gfaas.runtime.api.RuntimeAPI`).
        max_body_bytes: larger request bodies are refused with 413 before they are read in full.
        default_timeout_s: how long a sync invocation waits when the request gives no ``timeout``.
        max_timeout_s: the most a request may ask to wait (``timeout``, ``wait``); more is a 422.
        retry_after_s: the ``Retry-After`` of 429 answers.
        max_waiters: requests that may wait for results at the same time (threads); more queue up.
        sweep_interval_s: how often finished-but-unfetched invocations are counted in the metrics.
        max_pending: unfinished invocations tracked for the metrics (the oldest beyond it go uncounted).

    ``app.state.gateway`` holds the shared state (``.tracker.sweep()`` counts finished invocations now).
    """
    if max_body_bytes < 0 or default_timeout_s < 0 or max_timeout_s < default_timeout_s or retry_after_s < 0 \
            or max_waiters < 1 or sweep_interval_s <= 0:
        raise ConfigError("create_app: sizes and timeouts must be non-negative, max_timeout_s >= default_timeout_s, "
                          "max_waiters >= 1 and sweep_interval_s > 0")
    gw = _Gateway(runtime, max_waiters=max_waiters, max_pending=max_pending)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()

        def sweeper() -> None:
            while not stop.wait(sweep_interval_s):
                gw.tracker.sweep()

        t = threading.Thread(target=sweeper, name="gfaas-gateway-sweep", daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join(timeout=5)

    app = FastAPI(title="gfaas gateway", version="1", lifespan=lifespan,
                  description="Deploy and invoke gfaas workflows; see docs/gateway.md.")
    app.state.gateway = gw
    app.add_middleware(_Guard, max_body_bytes=max_body_bytes)

    def _urls(request: Request, inv: str) -> dict[str, str]:
        base = request.scope.get("root_path", "").rstrip("/")
        return {"status_url": f"{base}/v1/invocations/{inv}", "result_url": f"{base}/v1/invocations/{inv}/result"}

    def _check_id(invocation_id: str) -> None:
        if not _INVOCATION_ID.match(invocation_id):
            raise NotFound(f"no invocation {invocation_id[:140]!r} is known here")

    # ---- errors

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"field": _field_name(e.get("loc", ())), "message": str(e.get("msg", "")).removeprefix("Value error, ")}
                  for e in exc.errors()]
        for e, raw in zip(errors, exc.errors(), strict=True):
            if raw.get("type") == "json_invalid":
                e["field"] = "body"
                e["message"] = f"not valid JSON ({raw.get('ctx', {}).get('error', 'decode error')})"
        text = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        if any(tuple(raw.get("loc", ()))[:1] == ("body",) for raw in exc.errors()):
            text += f" ({_BODY_HINT})"
        return _error(422, "invalid_request", text, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
                415: "unsupported_media_type"}.get(exc.status_code, "http_error")
        message = str(exc.detail) if exc.status_code != 404 else \
            f"no such endpoint: {request.method} {request.url.path} (see /docs or docs/gateway.md)"
        return _error(exc.status_code, code, message, exc.headers)

    @app.exception_handler(NotFound)
    async def _not_found(request: Request, exc: Exception) -> JSONResponse:
        return _error(404, "not_found", str(exc))

    @app.exception_handler(ConfigError)  # SpecError is one
    async def _bad(request: Request, exc: Exception) -> JSONResponse:
        return _error(400, "bad_request", str(exc))

    @app.exception_handler(Overloaded)
    async def _overloaded(request: Request, exc: Exception) -> JSONResponse:
        return _error(429, "overloaded", str(exc), {"retry-after": str(retry_after_s)}, retry_after_s=retry_after_s)

    @app.exception_handler(GfaasError)
    async def _gfaas(request: Request, exc: Exception) -> JSONResponse:
        ref = secrets.token_hex(4)
        log.error("error (reference %s) answering %s %s: %s", ref, request.method, request.url.path, exc, exc_info=exc)
        return _error(500, "internal", f"{type(exc).__name__}: {exc} (reference {ref})")

    # ---- endpoints

    @app.get("/healthz", response_model=Health, tags=["gateway"])
    async def healthz() -> dict[str, str]:
        """Liveness: the gateway answers."""
        return {"status": "ok"}

    @app.post("/v1/workflows", status_code=201, response_model=DeployResponse, tags=["workflows"],
              responses=_responses(400, 413, 415),
              openapi_extra={"requestBody": {"required": True, "content": {
                  t: {"schema": {"type": "string"}} for t in ("application/yaml", "text/plain", "application/json")}}})
    async def deploy(request: Request) -> JSONResponse:
        """Deploy a workflow from its spec (YAML or JSON text in the body)."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype and ctype not in _SPEC_TYPES:
            return _error(415, "unsupported_media_type",
                          f"content-type {ctype!r} is not a spec; send the YAML or JSON text with content-type "
                          f"application/yaml (one of {', '.join(_SPEC_TYPES)}), e.g. curl --data-binary @spec.yaml "
                          "-H 'content-type: application/yaml'")
        body = await request.body()
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _error(400, "bad_request", f"the spec is not UTF-8 text ({exc})")
        if not text.strip():
            return _error(400, "bad_request", "the request body is empty; send the workflow spec (YAML or JSON)")
        name = await run_in_threadpool(runtime.deploy, text)
        return JSONResponse({"workflow": name}, status_code=201, headers={"location": f"/v1/workflows/{name}"})

    @app.get("/v1/workflows", response_model=WorkflowList, tags=["workflows"])
    def list_workflows() -> dict[str, list[str]]:
        """The deployed workflows."""
        return {"workflows": list(runtime.workflows())}

    @app.get("/v1/workflows/{name}", response_model=dict[str, Any], tags=["workflows"], responses=_responses(404))
    def describe(name: str) -> JSONResponse:
        """The deployed workflow's spec, as the runtime describes it."""
        return JSONResponse(jsonable(runtime.describe(name)))

    @app.post("/v1/workflows/{name}/invocations", response_model=ResultDocument, tags=["invocations"],
              responses={202: {"model": InvocationAccepted, "description": "mode=async: accepted"},
                         **_responses(400, 404, 413, 422, 429),
                         504: {"model": ErrorBody, "description": "sync: not finished within timeout; poll "
                                                                  "the result_url it gives"}})
    async def invoke(request: Request, name: str, body: InvocationRequest,
                     mode: Literal["sync", "async"] = "sync",
                     timeout: float | None = Query(None, ge=0, le=max_timeout_s),
                     outputs: OutputsMode = "full") -> Response:
        """Invoke a workflow. ``sync`` (default) answers with the result document (200, also when the
        invocation failed: see ``status``/``error``) or 504 after ``timeout`` seconds; ``async`` answers
        202 at once with the URLs to poll."""
        inputs: dict[str, np.ndarray] | None = None

        def decode() -> dict[str, np.ndarray]:
            assert body.inputs is not None
            return {k: decode_array(a.model_dump(), f"inputs.{k}") for k, a in body.inputs.items()}

        if body.inputs is not None:
            try:
                inputs = await run_in_threadpool(decode)
            except WireError as exc:  # the request's arrays; a WireError elsewhere is the server's problem
                return _error(400, "bad_request", str(exc))

        def submit() -> str:
            if body.transport is not None:
                return runtime.submit(name, inputs, body.seed, transport=body.transport)
            return runtime.submit(name, inputs, body.seed)

        try:
            inv = await run_in_threadpool(submit)
        except Overloaded:
            gw.tracker.rejected.inc(workflow=name, reason="overloaded")
            raise
        gw.tracker.submitted(inv, name)
        urls = _urls(request, inv)
        if mode == "async":
            status = await _status_or(inv, "queued")
            return JSONResponse({"invocation_id": inv, "status": status, **urls}, status_code=202,
                                headers={"location": urls["status_url"]})
        wait_s = default_timeout_s if timeout is None else timeout
        try:
            res = await gw.wait(functools.partial(runtime.result, inv, timeout=wait_s))
        except TimeoutError:
            status = await _status_or(inv, "running")
            return _error(504, "timeout", f"invocation {inv} of {name!r} did not finish within {wait_s:g} s; it "
                          f"goes on: poll GET {urls['result_url']}?wait=SECONDS", invocation_id=inv, status=status,
                          status_url=urls["status_url"], result_url=urls["result_url"])
        return await _result_response(res, outputs)

    async def _status_or(inv: str, default: str) -> str:
        try:
            return str(await run_in_threadpool(runtime.status, inv))
        except Exception:  # the status is a courtesy in an answer that is already an error
            return default

    async def _result_response(res: InvocationResult, outputs: str = "full") -> Response:
        gw.tracker.finished(res)
        # base64 and JSON of big outputs: off the event loop
        body = await run_in_threadpool(_json_bytes, res, outputs)
        return Response(body, media_type="application/json")

    @app.get("/v1/invocations/{invocation_id}", response_model=InvocationStatus, tags=["invocations"],
             responses=_responses(404))
    def invocation_status(invocation_id: str) -> dict[str, str]:
        """Where an invocation is: queued, running, done or failed."""
        _check_id(invocation_id)
        return {"invocation_id": invocation_id, "status": str(runtime.status(invocation_id))}

    @app.get("/v1/invocations/{invocation_id}/result", response_model=ResultDocument, tags=["invocations"],
             responses={202: {"model": InvocationAccepted, "description": "not finished yet (after waiting)"},
                        **_responses(404, 422)})
    async def invocation_result(request: Request, invocation_id: str,
                                wait: float = Query(0.0, ge=0, le=max_timeout_s),
                                outputs: OutputsMode = "full") -> Response:
        """The result document once the invocation finished (waiting up to ``wait`` seconds for it);
        202 with its status while it has not."""
        _check_id(invocation_id)
        for _ in range(2):
            try:
                res = await gw.wait(functools.partial(runtime.result, invocation_id, timeout=wait))
            except TimeoutError:
                status = str(await run_in_threadpool(runtime.status, invocation_id))
                if status in _FINISHED:
                    wait = 0.0  # finished between the two calls: fetch it
                    continue
                return JSONResponse({"invocation_id": invocation_id, "status": status,
                                     **_urls(request, invocation_id)}, status_code=202)
            return await _result_response(res, outputs)
        raise GfaasError(f"runtime says invocation {invocation_id} is finished but has no result for it")

    @app.get("/metrics", tags=["gateway"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format 0.0.4"}})
    def metrics() -> Response:
        """Prometheus metrics (text exposition format)."""
        return Response(gw.registry.render(), media_type=CONTENT_TYPE)

    return app


# -- running it


class GatewayServer:
    """The gateway served by uvicorn in a background thread; use :func:`serve` to make one.

    ``url`` is ``http://HOST:PORT``; :meth:`stop` (or leaving the ``with`` block) shuts it down.
    """

    def __init__(self, app: FastAPI, sock: socket.socket, host: str, *, access_log: bool = True,
                 graceful_s: float = 5.0) -> None:
        import uvicorn

        self.app = app
        self.host = host
        self.port: int = sock.getsockname()[1]
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else "[::1]" if host == "::" else \
            f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}"
        self._sock = sock
        self._ready = threading.Event()
        self._error: BaseException | None = None

        ready = self._ready

        class _Server(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets=sockets)
                ready.set()

        # log_config/log_level None: the library leaves logging configuration to the application
        config = uvicorn.Config(app, log_config=None, log_level=None, access_log=access_log, lifespan="on",
                                timeout_graceful_shutdown=math.ceil(graceful_s))
        self._server = _Server(config)
        self._thread = threading.Thread(target=self._run, name=f"gfaas-gateway-{self.port}", daemon=True)

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the thread that called start()
            self._error = exc
            log.error("the gateway server stopped with an error", exc_info=exc)
        finally:
            self._ready.set()

    def start(self, timeout: float = 30.0) -> GatewayServer:
        """Start serving; returns once the server accepts connections."""
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None or not self._server.started:
            self.stop()
            raise ConfigError(f"the gateway did not start on {self.url}: {self._error!r}; see the gfaas.gateway "
                              "and uvicorn.error logs")
        log.info("gateway listening on %s", self.url)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, let running requests finish (up to the graceful timeout), and join the thread."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self._sock.close()

    @property
    def running(self) -> bool:
        """Whether the server thread is still alive (after :meth:`stop` returns it should not be)."""
        return self._thread.is_alive()

    def __enter__(self) -> GatewayServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    # proto IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on TCP-proto sockets, and without it
    # Nagle's algorithm and delayed ACKs add 40 ms to every response
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def serve(runtime: RuntimeAPI, host: str = "127.0.0.1", port: int = 0, *, access_log: bool = True,
          graceful_s: float = 5.0, **app_options: Any) -> GatewayServer:
    """Serve the gateway for ``runtime`` on ``host:port`` in a background thread and return it, started.

    Binds loopback unless told otherwise; ``port=0`` picks a free port (see ``.port``/``.url``).
    ``app_options`` go to :func:`create_app` (``max_body_bytes``, ``default_timeout_s``, ...).
    ``access_log=False`` makes uvicorn detach its ``uvicorn.access`` logger's handlers (its own behaviour).
    """
    app = create_app(runtime, **app_options)
    try:
        sock = _bind(host, port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({exc}); pick another port, or 0 for a free one") from exc
    return GatewayServer(app, sock, host, access_log=access_log, graceful_s=graceful_s).start()

