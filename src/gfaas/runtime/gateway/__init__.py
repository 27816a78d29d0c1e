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

Layout: :mod:`.schemas` (the request/response models behind the OpenAPI schema), :mod:`.errors` (the JSON
error body, :func:`~.errors.add_error_handlers`), :mod:`.state` (the per-app :class:`~.state._Gateway` that
routes reach through the :data:`~.state.GatewayDep` dependency, metrics accounting, the body-size guard),
the routers :mod:`.workflows`, :mod:`.invocations` and :mod:`.ops`, and :mod:`.server` (:func:`serve`).
A new route goes on one of the routers; a dependency for every route (e.g. authentication) goes on the
``include_router`` calls in :func:`create_app`.
"""

from __future__ import annotations

from fastapi import FastAPI

from ...errors import ConfigError
from ...units import MiB
from ..api import RuntimeAPI
from . import invocations, ops, workflows
from .errors import add_error_handlers
from .schemas import DType
from .server import GatewayServer, serve
from .state import _Gateway, _Guard, lifespan

__all__ = ["DType", "GatewayServer", "create_app", "serve"]


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
    app = FastAPI(title="gfaas gateway", version="1", lifespan=lifespan,
                  description="Deploy and invoke gfaas workflows; see docs/gateway.md.")
    app.state.gateway = _Gateway(runtime, max_waiters=max_waiters, max_pending=max_pending,
                                 default_timeout_s=default_timeout_s, max_timeout_s=max_timeout_s,
                                 retry_after_s=retry_after_s, sweep_interval_s=sweep_interval_s)
    app.add_middleware(_Guard, max_body_bytes=max_body_bytes)
    add_error_handlers(app)
    app.include_router(ops.router)
    app.include_router(workflows.router)
    app.include_router(invocations.router(max_timeout_s))
    return app
