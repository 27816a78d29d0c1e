"""``create_app``: the gateway's FastAPI application, assembled from the package's routers."""

from __future__ import annotations

from fastapi import FastAPI

from ...errors import ConfigError
from ...units import MiB
from ..api import RuntimeAPI
from . import invocations, ops, workflows
from .errors import add_error_handlers
from .state import _Gateway, _Guard, lifespan


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
