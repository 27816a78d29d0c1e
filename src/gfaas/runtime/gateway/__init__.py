"""The HTTP gateway: deploy workflows, invoke them, fetch results and metrics over HTTP/JSON.

:func:`create_app` builds a FastAPI application in front of any :class:`~gfaas.runtime.api.RuntimeAPI`;
:func:`serve` runs it with uvicorn in a background thread on loopback. ``docs/gateway.md`` documents
the endpoints, encodings and status codes; in short:

=======  ====================================  =====================================================
GET      ``/healthz``                          ``{"status": "ok"}``
POST     ``/v1/workflows``                     spec text (YAML/JSON) -> 201 ``{"workflow": name}``
GET      ``/v1/workflows``                     ``{"workflows": [...]}``
GET      ``/v1/workflows/{name}``              the deployed spec's description
DELETE   ``/v1/workflows/{name}``              undeploy: its workers stop -> 200 ``{"workflow", "status"}``
POST     ``/v1/workflows/{name}/invocations``  ``?mode=sync|async&timeout=S``; body ``{"inputs": ...}``
                                               or ``{"seed": N}`` -> 200 result / 202 accepted
GET      ``/v1/invocations/{id}``              ``{"invocation_id", "status"}``
GET      ``/v1/invocations/{id}/result``       ``?wait=S`` -> 200 result document, 202 while running
GET      ``/v1/nodes``                         each node daemon's live figures (:mod:`.nodes`)
GET      ``/v1/nodes/{node}/objects/{ref}``    one object on one node
GET      ``/metrics``                          Prometheus text format
=======  ====================================  =====================================================

Design decisions:

* Every endpoint but ``/healthz`` and the API's description (``/openapi.json``, ``/docs``) needs
  ``Authorization: Bearer TOKEN`` (401 otherwise); ``serve`` refuses a non-loopback address without a
  token. Deployed handlers come only from allowed packages, and specs, bodies, functions, workflows,
  requests in progress, header and body times are bounded (:class:`~.limits.GatewayLimits`; the
  guard is :mod:`.guard`, the header deadline and connection cap :mod:`.protocol`).

* The HTTP status reports on the *request*; the invocation's own outcome is in the body. A sync
  invocation whose function failed is ``200`` with ``"status": "failed"`` and ``"error"`` set.
* Errors are JSON ``{"error": CODE, "message": TEXT, ...}``: 400 ``bad_request`` (bad spec, inputs that
  do not fit the workflow, undecodable arrays, handlers outside the allowed packages), 401 ``unauthorized``,
  404 ``not_found``, 408 ``request_timeout``, 409 ``too_many_workflows``, 413 ``payload_too_large``, 415
  ``unsupported_media_type``, 422 ``invalid_request`` (the body or query does not match the schema;
  ``errors`` lists each field), 429 ``overloaded`` (with ``Retry-After``), 503 ``busy`` (too many requests
  in progress), 504 ``timeout`` (with the invocation's URLs to poll), 500 ``internal`` (logged to
  ``gfaas.gateway`` with a reference, at a bounded rate).
* Waiting (sync invocations, ``?wait=``) happens in a separate, bounded pool of threads so that long
  waits cannot starve quick requests; every wait is bounded by ``max_timeout_s``.
* Metrics count every invocation submitted through this gateway exactly once when it finishes: when a
  client first receives its result, or, for invocations nobody fetches, when the background sweep
  (every ``sweep_interval_s`` while the app runs) sees it finished.

Layout: :mod:`.schemas` (the request/response models behind the OpenAPI schema), :mod:`.errors` (the JSON
error body, :func:`~.errors.add_error_handlers`), :mod:`.state` (the per-app :class:`~.state._Gateway` that
routes reach through the :data:`~.state.GatewayDep` dependency, metrics accounting, the body-size guard),
the routers :mod:`.workflows`, :mod:`.invocations`, :mod:`.nodes` and :mod:`.ops`, and :mod:`.server` (:func:`serve`).
A new route goes on one of the routers; it needs the token without doing anything (the guard's rule).
"""

from __future__ import annotations

from .app import create_app
from .auth import load_or_create_token, read_token_file
from .limits import DEFAULT_HANDLER_PACKAGES, GatewayLimits
from .schemas import DType
from .server import GatewayServer, serve

__all__ = ["DEFAULT_HANDLER_PACKAGES", "DType", "GatewayLimits", "GatewayServer", "create_app",
           "load_or_create_token", "read_token_file", "serve"]
