"""The gateway's per-app state (:class:`_Gateway`, ``app.state.gateway``), the metrics accounting and
the sweep that runs while the app does. The ASGI guard in front of it all is :mod:`.guard`."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, FastAPI, Request

from ...errors import NotFound
from ..api import RuntimeAPI
from ..metrics import LATENCY_BUCKETS, Registry
from ..result import InvocationResult
from .admission import Admissions
from .limits import GatewayLimits
from .live import LiveStats
from .node_metrics import register_node_metrics

log = logging.getLogger("gfaas.gateway")
T = TypeVar("T")

# anyio >= 4.1 calls it abandon_on_cancel, earlier versions cancellable
_ABANDON = "abandon_on_cancel" if "abandon_on_cancel" in inspect.signature(anyio.to_thread.run_sync).parameters \
    else "cancellable"
_FINISHED = ("done", "failed")

# -- invocation accounting


class _Tracker:
    """Counts each invocation submitted through the gateway once, when it finishes."""

    def __init__(self, runtime: RuntimeAPI, registry: Registry, max_pending: int) -> None:
        self._runtime = runtime
        self._lock = threading.Lock()
        self._pending: dict[str, str] = {}  # invocation ID -> workflow, oldest first
        self._watched: dict[str, str] = {}  # the same for invocations the runtime calls back about
        self._max_pending = max_pending
        self._sweep_failing = False
        self.live = LiveStats(time.monotonic)  # the dashboard's recent window (gateway.dashboard)
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

    def submitted(self, invocation_id: str, workflow: str, watched: bool = False) -> None:
        """Track an invocation until it is counted; ``watched``: the runtime calls back when it
        finishes (:func:`.admission.watch`), so the sweep need not ask about it."""
        with self._lock:
            target = self._watched if watched else self._pending
            target[invocation_id] = workflow
            if len(target) > self._max_pending:
                dropped = next(iter(target))
                del target[dropped]
                log.warning("more than %d unfinished invocations tracked; %s will not be counted in metrics",
                            self._max_pending, dropped)

    def pending(self) -> int:
        with self._lock:
            return len(self._pending) + len(self._watched)

    def finished(self, res: InvocationResult) -> bool:
        """Count ``res`` if it is the first time it is seen; True if it was counted now."""
        with self._lock:
            workflow = self._pending.pop(res.invocation_id, None) or self._watched.pop(res.invocation_id, None)
        if workflow is None:
            return False
        workflow = res.workflow or workflow
        self.live.record(workflow, res)
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
            self._watched.pop(invocation_id, None)

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
    """What the endpoints share: the runtime, the metrics, the waiting pool, the app's settings
    (see :func:`~gfaas.runtime.gateway.create_app` for what they mean)."""

    def __init__(self, runtime: RuntimeAPI, *, max_waiters: int, max_pending: int, default_timeout_s: float,
                 max_timeout_s: float, retry_after_s: int, sweep_interval_s: float,
                 limits: GatewayLimits | None = None) -> None:
        self.runtime = runtime
        self.limits = limits or GatewayLimits()
        self.token: str | None = None  # the bearer token (None: no authentication)
        self.results_dirs: list[tuple[str, str]] = []  # (label, directory) the results browser lists
        # Client addresses (host, port) of the connections that sent an authenticated request: at the
        # connection cap, the server closes an idle connection not among them to take a new one
        # (protocol.py), so connections that never authenticate cannot lock clients out.
        self.proven_clients: set[tuple[Any, ...]] = set()
        # Refused clients (address, port) -> when their next request may be read: the guard fills it, the
        # server's protocol holds an early request below the framework (protocol.py), the guard otherwise.
        self.held_clients: dict[Any, float] = {}
        self.deploying = 0  # deploys in progress (they count against max_workflows); under deploy_lock
        self.deploy_lock = threading.Lock()
        self.default_timeout_s = default_timeout_s
        self.max_timeout_s = max_timeout_s
        self.retry_after_s = retry_after_s
        self.sweep_interval_s = sweep_interval_s
        self.registry = Registry()
        self.tracker = _Tracker(runtime, self.registry, max_pending)
        self.admissions = Admissions(runtime.workflows)
        self.registry.gauge_callback("gfaas_admission_limit", "Invocations a workflow may have in flight now (the "
                                     "adaptive limit; more are refused with 429).", ["workflow"],
                                     lambda: {(w, ): d["limit"] for w, d in self.admissions.describe().items()})
        self.registry.gauge_callback("gfaas_admission_in_flight", "Invocations admitted through the gateway and not "
                                     "finished.", ["workflow"],
                                     lambda: {(w, ): d["in_flight"] for w, d in self.admissions.describe().items()})
        self.registry.gauge_callback("gfaas_queue_depth", "Requests waiting per function.",
                                     ["workflow", "function"], self._queue_depths)
        self.registry.gauge_callback("gfaas_function_workers", "Workers per function by state (warm = idle + busy; "
                                     "starting = cold or pre-warm starts under way).",
                                     ["workflow", "function", "state"], self._workers)
        self.registry.gauge_callback("gfaas_function_cold_starts", "Worker starts made for waiting requests "
                                     "(cold starts) per function since deploy.",
                                     ["workflow", "function"], lambda: self._scaling("cold_starts"))
        self.registry.gauge_callback("gfaas_function_worker_seconds", "Seconds of worker lifetime per function "
                                     "since deploy (what the scaling costs).",
                                     ["workflow", "function"], lambda: self._scaling("worker_seconds"))
        self.registry.gauge_callback("gfaas_function_start_seconds", "Median seconds of each phase of a "
                                     "function's recent worker starts (template: the fork server's own start, "
                                     "once; fork or spawn; model; drop: the uid drop; import: the function's "
                                     "code; ready: request to ready).",
                                     ["workflow", "function", "phase"], self._start_phases)
        self.nodes = register_node_metrics(self.registry, runtime)  # the node daemons' figures (node_metrics.py)
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

    def _statuses(self) -> list[dict[str, Any]]:
        out = []
        try:
            for w in self.runtime.workflows():
                try:
                    out.append(self.runtime.scaling_status(w))
                except NotFound:  # undeployed meanwhile
                    continue
        except Exception:
            log.exception("runtime.scaling_status() failed; /metrics omits the worker gauges")
        return out

    def _workers(self) -> dict[tuple[str, ...], float]:
        return {(st["workflow"], fn, state): float(c.get(state, 0)) for st in self._statuses()
                for fn, c in st["functions"].items() for state in ("warm", "idle", "busy", "starting")}

    def _start_phases(self) -> dict[tuple[str, ...], float]:
        return {(st["workflow"], fn, phase): ms / 1e3 for st in self._statuses()
                for fn, c in st["functions"].items() for phase, ms in (c.get("start_ms_p50") or {}).items()}

    def _scaling(self, field: str) -> dict[tuple[str, ...], float]:
        return {(st["workflow"], fn): float(c.get(field, 0)) for st in self._statuses()
                for fn, c in st["functions"].items()}

    async def wait(self, fn: Callable[[], T]) -> T:
        """Run a blocking wait in the waiting pool (not the pool quick requests use)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            limiter = self._limiters.get(loop)
            if limiter is None:
                limiter = self._limiters[loop] = anyio.CapacityLimiter(self._max_waiters)
        # abandoned on cancel (server shutdown): the thread finishes its bounded wait on its own
        return await anyio.to_thread.run_sync(fn, limiter=limiter, **{_ABANDON: True})


async def get_gateway(request: Request) -> _Gateway:
    """The dependency through which endpoints reach the app's :class:`_Gateway` (async: no thread hop)."""
    gw: _Gateway = request.app.state.gateway
    return gw


GatewayDep = Annotated[_Gateway, Depends(get_gateway)]


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """While the app runs, count finished-but-unfetched invocations every ``sweep_interval_s``."""
    gw: _Gateway = app.state.gateway
    stop = threading.Event()

    def sweeper() -> None:
        while not stop.wait(gw.sweep_interval_s):
            gw.tracker.sweep()

    t = threading.Thread(target=sweeper, name="gfaas-gateway-sweep", daemon=True)
    t.start()
    # The runtime's replies handled on this loop's thread, where its invocations are submitted and
    # answered (LocalRuntime.drive_replies): no second thread contends for the GIL on each step.
    drive = getattr(gw.runtime, "drive_replies", None) if gw.limits.replies_on_loop else None
    release = getattr(gw.runtime, "release_replies", None)
    if drive is not None:
        drive(asyncio.get_running_loop())
    try:
        yield
    finally:
        if drive is not None and release is not None:
            release()
        stop.set()
        t.join(timeout=5)
