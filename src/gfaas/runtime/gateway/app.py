"""``create_app``: the gateway's FastAPI application, assembled from the package's routers."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from ...errors import ConfigError
from ...units import MiB
from ..api import RuntimeAPI
from . import dashboard, invocations, logs, nodes, ops, result_files, workflows
from .auth import new_token
from .errors import add_error_handlers
from .guard import OPEN_PATHS, Guard
from .limits import GatewayLimits
from .schemas import document_security
from .state import _Gateway, lifespan


class GatewayApp(FastAPI):
    """The FastAPI application with the guard (:mod:`.guard`) in front of FastAPI's own middleware
    stack rather than inside it: a refusal (401, 413, 429) and the invoke fast path then cost the
    event loop the guard alone, not five layers of wrappers first (their error handling is for
    the routes behind the guard, which still have it)."""

    guard: Guard | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.guard is None or scope["type"] == "lifespan":
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self  # what Starlette sets, and the guard reads (the gateway's state)
        await self.guard(scope, receive, send)

    async def behind_guard(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        # Without Starlette's outermost error middleware: an exception a route lets out reaches the
        # guard, whose 500 is JSON and names the log's reference (that middleware answered plain text
        # first, and the guard could only log).
        stack = super().build_middleware_stack()
        return stack.app if self.guard is not None and isinstance(stack, ServerErrorMiddleware) else stack


def create_app(runtime: RuntimeAPI, *, token: str | None = None, authenticate: bool = True,
               limits: GatewayLimits | None = None, max_body_bytes: int = 256 * MiB, default_timeout_s: float = 60.0,
               max_timeout_s: float = 600.0, retry_after_s: int = 1, max_waiters: int = 256,
               sweep_interval_s: float = 1.0, max_pending: int = 1_000_000,
               results_dirs: list[tuple[str, str]] | None = None) -> FastAPI:
    """The gateway's FastAPI application in front of ``runtime``.

    Args:
        runtime: what deploys and runs workflows (see :class:`~gfaas.runtime.api.RuntimeAPI`).
        token: the bearer token every request but ``/healthz`` and the API description must carry;
            ``None`` makes a random one (``app.state.gateway.token``).
        authenticate: ``False`` serves without a token (``serve`` allows that on loopback only).
        limits: caps and timeouts (:class:`~.limits.GatewayLimits`: allowed handler packages, spec size,
            functions, workflows, requests in progress, body time).
        max_body_bytes: larger request bodies are refused with 413 before they are read in full.
        default_timeout_s: how long a sync invocation waits when the request gives no ``timeout``.
        max_timeout_s: the most a request may ask to wait (``timeout``, ``wait``); more is a 422.
        retry_after_s: the ``Retry-After`` of 429 and 503 answers.
        max_waiters: requests that may wait for results at the same time (threads); more queue up.
        sweep_interval_s: how often finished-but-unfetched invocations are counted in the metrics.
        max_pending: unfinished invocations tracked for the metrics (the oldest beyond it go uncounted).
        results_dirs: ``(label, directory)`` pairs the dashboard's results browser lists (default: the
            checkout's ``benchmarks/results`` and ``./out``, or ``$GFAAS_RESULTS_DIRS``).
    """
    limits = limits or GatewayLimits()
    if max_body_bytes < 0 or default_timeout_s < 0 or max_timeout_s < default_timeout_s or retry_after_s < 0 \
            or max_waiters < 1 or sweep_interval_s <= 0:
        raise ConfigError("create_app: sizes and timeouts must be non-negative, max_timeout_s >= default_timeout_s, "
                          "max_waiters >= 1 and sweep_interval_s > 0")
    token = (token or new_token()) if authenticate else None
    app = GatewayApp(title="gfaas gateway", version="1", lifespan=lifespan,
                  description="Deploy and invoke gfaas workflows; see docs/gateway.md.")
    app.state.gateway = gw = _Gateway(runtime, max_waiters=max_waiters, max_pending=max_pending, limits=limits,
                                      default_timeout_s=default_timeout_s, max_timeout_s=max_timeout_s,
                                      retry_after_s=retry_after_s, sweep_interval_s=sweep_interval_s)
    gw.token = token
    gw.results_dirs = results_dirs if results_dirs is not None else \
        (result_files.results_dirs_from_env() or result_files.default_results_dirs())
    app.guard = Guard(app.behind_guard, max_body_bytes=max_body_bytes, limits=limits, token=token,
                      retry_after_s=retry_after_s, held=gw.held_clients, gateway=gw)
    add_error_handlers(app)
    app.include_router(ops.router)
    app.include_router(workflows.router)
    app.include_router(invocations.router(max_timeout_s))
    app.include_router(logs.router)
    app.include_router(dashboard.router)
    app.include_router(nodes.router)
    document_security(app, OPEN_PATHS if authenticate else frozenset(OPEN_PATHS | {getattr(r, "path", "") for r in app.routes}))
    return app
