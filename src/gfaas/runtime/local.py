"""The local runtime: workflows on this machine (and, with Ray, on a cluster's machines).

:class:`LocalRuntime` implements :class:`~gfaas.runtime.api.RuntimeAPI`. It is three parts with
typed seams between them, in the order a request meets them:

* :class:`~gfaas.runtime.invoker.Invoker` (``invoker.py``): invocations from submit to result, one
  message per step to warm workers, their replies read on one loop thread (``loop.py``);
* :class:`~gfaas.runtime.deployments.Deployments` (``deployments.py``): specs, versions, code
  packages, each function's pool of workers (``pool.py``) and what they reserve on their node;
* :class:`~gfaas.runtime.nodes.Nodes` (``nodes.py``): the node daemons, their control connections,
  invocations opened there and freed in batches, the Redis server of the baseline.

This class builds them, starts Ray when asked, and answers what the gateway and the CLI ask. The
request path, hop by hop, is in ``docs/design/request-path.md``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from ..errors import GfaasError
from ..policy.autoscale import ScalingSpec
from ..policy.resources import Resources
from .accel import DscsDrive, DscsDrives
from .config import MAX_INLINE, NodeEndpoint, RuntimeConfig
from .dedup import RuntimeDedup
from .deployments import Deployments, EdgeSizes, pool_key
from .invoker import InputGenerator, Invoker
from .logs import LogStore
from .nodes import Nodes
from .pool import FunctionPool
from .result import InvocationResult
from .sandbox import Identity, TenantIds, sandbox_enabled
from .spec import WorkflowSpec
from .worker import Init

log = logging.getLogger("gfaas.runtime")

__all__ = ["MAX_INLINE", "LocalRuntime", "NodeEndpoint", "RuntimeConfig", "pool_key", "runtime_config"]


class LocalRuntime:
    """Workflows on this machine. Use as a context manager, or call :meth:`close`.

    ``input_generator(workflow, seed, scale)``: the inputs of a ``submit(..., seed=N)`` (the reference
    workflows' generator, ``gfaas.workflows.make_inputs``); ``edge_sizes(workflow)``: a workflow's
    measured edge sizes, which GPU placement uses when given (``gfaas.workflows.measured.edge_sizes``)."""

    def __init__(self, config: RuntimeConfig | None = None, *, input_generator: InputGenerator | None = None,
                 edge_sizes: EdgeSizes | None = None) -> None:
        self.config = config or RuntimeConfig()
        self._closers: list[Callable[[], None]] = []
        self._closed = False
        # The simulated storage nodes of `accelerator: dscs` functions (runtime.accel).
        self.drives = DscsDrives([DscsDrive(f"drive{k}", self.config.dscs_preset)
                                  for k in range(self.config.dscs_drives)])
        self.dedup = RuntimeDedup(self.config.dedup, self.config.dedup_domain)
        self._closers.append(self.dedup.close)
        self.logstore = self._logstore()
        tenants = None
        if sandbox_enabled(self.config.sandbox, self.config.executor):
            tenants = TenantIds(self.config.sandbox_uid_base)
        elif self.config.executor == "ray" and self.config.sandbox != "none":
            # uids for code packages only, whose functions run sandboxed on their machines (SandboxedActor)
            tenants = TenantIds(self.config.sandbox_uid_base)
        elif self.config.sandbox == "auto" and self.config.executor == "process":
            log.warning("functions run as uid %d, the runtime's own: they can read what it can (the node's "
                        "state and tokens). Run as root for a uid per tenant (docs/security.md).", os.getuid())
        self.nodes = Nodes(self.config, self._closers)
        self.cluster = self.nodes.cluster
        self.deployments = Deployments(self.config, self.nodes, self, self.dedup, self.logstore, tenants,
                                       self._closers, edge_sizes)
        self.invoker = Invoker(self.config, self.nodes, self.deployments, self.drives, self.logstore, self.dedup,
                               input_generator)
        try:
            self._start_ray()
            self.nodes.start()
        except BaseException:
            self.close()
            raise

    def _logstore(self) -> LogStore:
        """The functions' logs (runtime.logs): in ``log_dir``, or a private directory removed at close."""
        d = self.config.log_dir
        if not d:
            d = tempfile.mkdtemp(prefix="gfaas-logs-", dir="/tmp")
            self._closers.append(lambda: shutil.rmtree(d, ignore_errors=True))
        store = LogStore(d)
        self._closers.append(store.close)
        return store

    def _start_ray(self) -> None:
        cfg = self.config
        if cfg.executor != "ray":
            return
        from .ray_executor import ensure_ray, shutdown_ray

        if self.cluster.key is not None and cfg.ray_address:  # the cluster's Ray token (deploy.ray_node)
            os.environ.setdefault("RAY_AUTH_MODE", "token")
            os.environ.setdefault("RAY_AUTH_TOKEN", self.cluster.key.ray_token())
        if ensure_ray(cfg.ray_address):
            self._closers.append(shutdown_ray)

    # -- RuntimeAPI: workflows
    def deploy(self, spec_text: str, code: bytes | str | os.PathLike[str] | None = None) -> str:
        """Deploy a workflow, or a new version of a deployed one (:meth:`Deployments.deploy`)."""
        return self.deployments.deploy(spec_text, code)

    def versions(self, workflow: str) -> list[dict[str, Any]]:
        return self.deployments.versions(workflow)

    def rollback(self, workflow: str, version: int) -> int:
        return self.deployments.rollback(workflow, version)

    def undeploy(self, workflow: str) -> None:
        self.deployments.undeploy(workflow)

    def workflows(self) -> list[str]:
        return self.deployments.workflows()

    def describe(self, workflow: str) -> dict[str, Any]:
        return self.deployments.describe(workflow)

    def placement(self, workflow: str) -> dict[str, str]:
        return self.deployments.placement(workflow)

    def scaling_status(self, workflow: str) -> dict[str, Any]:
        return self.deployments.scaling_status(workflow)

    # -- RuntimeAPI: invocations
    def submit(self, workflow: str, inputs: Mapping[str, np.ndarray] | None = None, seed: int | None = None,
               transport: str | None = None, deadline_s: float | None = None) -> str:
        """Start an invocation (:meth:`Invoker.submit`); returns its ID."""
        return self.invoker.submit(workflow, inputs, seed, transport, deadline_s)

    def invoke(self, workflow: str, inputs: Mapping[str, np.ndarray] | None = None, seed: int | None = None,
               timeout: float | None = None, transport: str | None = None) -> InvocationResult:
        """Submit and wait: the synchronous call."""
        return self.invoker.invoke(workflow, inputs, seed, timeout, transport)

    @property
    def quick_submits(self) -> bool:
        """Whether a submit of small inputs returns at once (no round trip to a node, no server to start):
        true on one node with worker processes and the gfaas transport (the gateway then submits on its
        event loop instead of a thread)."""
        return self.nodes.lazy and self.config.transport == "gfaas"

    def status(self, invocation_id: str) -> str:
        return self.invoker.status(invocation_id)

    def result(self, invocation_id: str, timeout: float | None = None) -> InvocationResult:
        return self.invoker.result(invocation_id, timeout)

    def add_done_callback(self, invocation_id: str, callback: Callable[[InvocationResult], None]) -> None:
        self.invoker.add_done_callback(invocation_id, callback)

    def drive_replies(self, aloop: Any) -> None:
        """Handle the workers' replies on ``aloop``'s thread from now on (call it there), not on the
        invoker's own thread: a server whose event loop submits the invocations (``gfaas serve``) then
        steps them on the same thread, with no second thread contending for the GIL and no wake-up
        per result. :meth:`release_replies` (on that thread, before the loop stops) gives them back."""
        self.invoker.reply_loop.adopt(aloop)

    def release_replies(self) -> None:
        self.invoker.reply_loop.release()

    def poll_replies(self) -> None:
        """Handle the workers' replies already in, on the thread that drives them (see
        :meth:`drive_replies`; elsewhere a no-op)."""
        self.invoker.reply_loop.poll()

    def queue_depths(self) -> dict[str, int]:
        return self.invoker.queue_depths()

    def queue_positions(self, invocation_id: str) -> dict[str, int]:
        return self.invoker.queue_positions(invocation_id)

    def send_queue_hints(self, invocation_id: str | None = None) -> int:
        return self.invoker.send_queue_hints(invocation_id)

    # -- logs and the nodes' figures
    def logs(self, workflow: str, function: str | None = None, invocation: str | None = None,
             since: float | None = None, limit: int = 1000, after: int | None = None) -> list[dict[str, Any]]:
        """The last ``limit`` kept log lines of ``workflow``'s functions, oldest first, each a dict of
        ``seq, time, workflow, version, function, invocation, stream, level, text`` (runtime.logs).

        Filters: one ``function``; one ``invocation`` (``""``: lines printed outside any task, such as
        a model load); ``since`` (a ``time.time()``); ``after`` (a ``seq`` already seen: what
        follow-mode readers poll with). ``NotFound`` for a workflow neither deployed nor logged."""
        from ..errors import NotFound, SpecError

        if limit < 0:
            raise SpecError(f"limit={limit} must be >= 0")
        if workflow not in self.deployments.specs and not self.logstore.known(workflow):
            raise NotFound(f"no workflow {workflow!r} is deployed or has logs here; deployed: {self.workflows()}")
        return self.logstore.read(workflow, function, invocation, since, after, limit)

    def node_stats(self) -> dict[str, dict[str, Any]]:
        """Each node daemon's ``Admin.stats()``, by node name."""
        return self.nodes.stats()

    def node_snapshots(self) -> list[dict[str, Any]]:
        """Each node daemon's live figures (``Admin.snapshot()``), in the order of the runtime's nodes."""
        return self.nodes.snapshots()

    def node_object(self, node: str, ref: Any) -> dict[str, Any]:
        """``Admin.object_info(ref)`` on ``node``: size, tier, producer, consumers and age of one object.
        ``NotFound`` for a node the runtime does not use or an object the node does not hold."""
        return self.nodes.object_info(node, ref)

    def memory_report(self) -> dict[str, Any]:
        """What page merging saves now (``RuntimeConfig.dedup``): each live worker's RSS, PSS and
        KSM-merged bytes, the shared store's files and the copies they save, and each node's merge
        controller report (``gfaas dedup status``)."""
        workers = [asdict(w) for w in self.dedup.memory()]
        nodes: dict[str, Any] = {}
        if self.dedup.mode in ("merge", "on"):
            with self.nodes.lock:
                for name, admin in self.nodes.admins.items():
                    try:
                        nodes[name] = admin.dedup_status()
                    except GfaasError as exc:
                        nodes[name] = {"error": str(exc)}
        shared = self.dedup.shared_report()
        # KSM's saving is the node's (pages_sharing: the copies merged away), not a sum over workers,
        # whose merged counts include the one copy each merged page keeps.
        merged = sum(int(r.get("saved_bytes", 0)) for r in nodes.values())
        return {"mode": self.dedup.mode, "workers": workers, "shared": shared, "nodes": nodes,
                "rss_bytes": sum(w["rss_bytes"] for w in workers), "pss_bytes": sum(w["pss_bytes"] for w in workers),
                "merged_saved_bytes": merged, "saved_bytes": shared["saved_bytes"] + merged,
                "refused": list(self.dedup.refused)}

    # -- what its pools ask (runtime.pool.PoolHost) and the deployments (DeploymentsHost)
    def start_worker(self, init: Init, node: str = "") -> Any:
        return self.deployments.start_worker(init, node)

    def reserve(self, pool: FunctionPool, evict: bool = False, node: str = "") -> bool:
        return self.deployments.reserve(pool, evict, node)

    def release(self, pool: FunctionPool, res: Resources, node: str = "") -> None:
        self.deployments.release(pool, res, node)

    def slot_node(self, pool: FunctionPool, waiting: list[str | None], workers: dict[str, int]) -> str:
        return self.deployments.slot_node(pool, waiting, workers)

    def default_scaling(self) -> ScalingSpec:
        return self.deployments.default_scaling()

    def failed(self, inv: Any, fn: str, message: str) -> None:
        self.invoker.failed(inv, fn, message)

    def dropped(self, inv: Any, fn: str) -> None:
        self.invoker.dropped(inv, fn)

    def queues_changed(self, inv: Any = None, queue: str | None = None) -> None:
        self.invoker.queues_changed(inv, queue)

    def deadline_added(self, at: float) -> None:
        self.deployments.deadline_added(at)

    def dispatch(self, inv: Any, fn: str, pool: FunctionPool, worker: Any, cold_start_s: float) -> None:
        self.invoker.dispatch(inv, fn, pool, worker, cold_start_s)

    def attach(self, worker: Any) -> None:
        self.invoker.attach(worker)

    def detach(self, worker: Any) -> None:
        self.invoker.detach(worker)

    def unfinished(self, workflow: str, version: int) -> bool:
        return self.invoker.unfinished(workflow, version)

    def stopped(self, workflow: str, version: int | None, reason: str, dropped: list[tuple[Any, str]]) -> None:
        self.invoker.stopped(workflow, version, reason, dropped)

    # -- close
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if getattr(self, "deployments", None) is not None:
            self.deployments.close()  # a busy worker's reply still comes (the loop is up)
        if getattr(self, "invoker", None) is not None:
            self.invoker.close()
        if getattr(self, "nodes", None) is not None:
            self.nodes.close()
        for c in reversed(self._closers):
            try:
                c()
            except Exception:  # noqa: BLE001 - closing the rest matters more
                log.exception("error while closing the runtime")
        self._closers.clear()

    def __enter__(self) -> LocalRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tenant_identity(self, workflow: str) -> Identity | None:
        """The uid and gid the workers of ``workflow`` run under; ``None`` without a sandbox."""
        return self.deployments.tenant_identity(workflow)

    def transport_settings(self, node: str = "", kind: str = "") -> dict[str, str]:
        """Where a function on ``node`` stores and reads (``kind``: gfaas or redis)."""
        return self.nodes.transport_settings(node, kind)

    def spec(self, workflow: str) -> WorkflowSpec:
        """The current version's spec of a deployed workflow (``NotFound`` otherwise)."""
        return self.deployments.spec(workflow)


def runtime_config(**overrides: Any) -> RuntimeConfig:
    """``RuntimeConfig`` with overrides (a convenience for the CLI)."""
    return replace(RuntimeConfig(), **overrides)
