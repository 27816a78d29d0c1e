"""What is deployed: :class:`Deployments` (specs, versions, code packages, each function's pool of
workers and the resources they reserve on their node, and where GPU functions are placed).

A deploy starts the new version's workers (side by side: as long as the slowest), then makes it
current; the old version drains on a thread of its own and its pools close. The runtime's invoker
reads the current version with :meth:`Deployments.current` (one dict look-up per invocation) and
finds a function's pool with :meth:`Deployments.pool`. Workers are started here for the pools
(:meth:`Deployments.start_worker`: a process, a Ray actor or an in-process host), with an attached
connection to their node's daemon where there is one.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import msgspec

from ..errors import CodePackageError, ConfigError, FunctionFailed, MachineRefused, NotFound, SpecError
from ..policy.autoscale import ScalingSpec
from ..policy.fusion import Stage, chains
from ..policy.locality import choose_node
from ..policy.resources import DEFAULT_RESOURCES, Ledger, Resources, choose_evictions
from ..topology import Topology
from .cluster import RAY_SLIVER, ray_resource
from .codepkg import (
    CodeStore,
    Package,
    StoredPackage,
    check_handlers_in,
    check_model_file,
    pack_dir,
    read_archive,
)
from .config import RuntimeConfig
from .dedup import RuntimeDedup
from .forkserver import PRELOAD, ForkServer, template_env
from .gpus import ordinal, ray_num_gpus, spread
from .logs import LogStore
from .nodes import Nodes
from .pool import Autoscaler, FunctionPool, PoolHost
from .sandbox import Identity, TenantIds
from .spec import WorkflowSpec, loads
from .versions import VersionTable, WorkflowVersion
from .worker import Init, InProcessWorker, ProcessWorker

log = logging.getLogger("gfaas.runtime")
ARCHIVES_KEPT = 8  # code packages kept packed for Ray actors' starts (each up to max_code_bytes)

EdgeSizes = Callable[[str], Any]  # workflow name -> its measured edge sizes (None: declared shapes)


class DeploymentsHost(PoolHost, Protocol):
    """What deployments need of the runtime beyond what its pools do."""

    def unfinished(self, workflow: str, version: int) -> bool:
        """Whether an invocation of that version has not finished."""

    def stopped(self, workflow: str, version: int | None, reason: str, dropped: list[tuple[Any, str]]) -> None:
        """Pools of ``workflow`` closed: ``dropped`` (invocation, function) were queued and will not run;
        the unfinished invocations of ``version`` (None: any) fail with ``reason``."""


def pool_key(workflow: str, version: int, function: str) -> str:
    """``workflow/function`` for a first version, ``workflow@N/function`` for later ones (names
    never hold '@' or '/', so keys cannot collide)."""
    return f"{workflow}/{function}" if version == 1 else f"{workflow}@{version}/{function}"


class Deployments:
    """See the module docstring. ``host``: the runtime (its pools' callbacks and the invoker's)."""

    def __init__(self, config: RuntimeConfig, nodes: Nodes, host: DeploymentsHost, dedup: RuntimeDedup,
                 logstore: LogStore, tenants: TenantIds | None, closers: list[Callable[[], None]],
                 edge_sizes: EdgeSizes | None = None) -> None:
        self.config = config
        self.nodes = nodes
        self.host = host
        self.dedup = dedup
        self.logstore = logstore
        self._tenants = tenants
        self._closers = closers
        self._edge_sizes = edge_sizes
        self._lock = threading.Lock()
        self.specs: dict[str, WorkflowSpec] = {}  # each workflow's current version's spec
        self._versions = VersionTable()
        self._current: dict[str, WorkflowVersion] = {}  # what submits read, replaced whole on a change
        self._deploying: set[str] = set()
        self._code: CodeStore | None = None  # code packages (runtime.codepkg), created on first use
        self.pools: dict[str, FunctionPool] = {}
        self._gpus: dict[str, dict[str, str]] = {}  # workflow -> GPU function -> GPU (see _place)
        self._ray_gpus: dict[str, float] = {}  # pool key -> num_gpus its Ray actors ask for (gpus.ray_num_gpus)
        self._topo: Topology | None = None
        self._res_lock = threading.Lock()  # the ledgers; taken before any pool's lock, never under one
        self._ledgers: dict[str, Ledger] = {}
        self._chains: dict[int, tuple[WorkflowSpec, dict[str, tuple[str, ...]]]] = {}  # id(spec) -> fusion's chains
        self.closed = False
        self._autoscaler = Autoscaler(lambda: list(self.pools.values()), config.scale_tick_s)
        self._forks: dict[tuple[int, bool], ForkServer] = {}  # (threads, torch) -> its template
        self._forks_lock = threading.Lock()
        self._archives: dict[str, bytes] = {}  # a stored code package's directory -> its archive (Ray workers)
        nodes.on_change = self.nodes_changed

    def nodes_changed(self, added: list[str], removed: list[str]) -> None:
        """Membership (``Nodes.refresh``): a node that left has its idle workers retired; one that joined
        is a candidate for every new worker from now on (``function_nodes``), nothing to do here."""
        for node in removed:
            stopped = sum(p.retire_node(node) for p in list(self.pools.values()))
            log.info("node %s left: %d idle workers retired there", node, stopped)

    @property
    def code(self) -> CodeStore | None:
        """The code packages' store (made on the first deploy of a package)."""
        return self._code

    def pool(self, workflow: str, version: int, function: str) -> FunctionPool | None:
        return self.pools.get(pool_key(workflow, version, function))

    def deadline_added(self, at: float) -> None:
        """A call with a deadline (monotonic ``at``) was queued: the scaler expires it then if still queued."""
        self._autoscaler.wake_by(at)

    def close(self) -> None:
        self.closed = True
        self._autoscaler.close()
        for p in list(self.pools.values()):
            p.close()
        self.pools.clear()
        with self._forks_lock:
            for f in self._forks.values():
                f.close()
            self._forks.clear()

    def templates_ready(self, timeout: float) -> None:
        """Wait until every worker template started so far is up (benchmarks: a start without it)."""
        with self._forks_lock:
            forks = list(self._forks.values())
        for f in forks:
            f.ready(timeout)

    def fork_server(self, init: Init) -> ForkServer | None:
        """The template to fork ``init``'s worker from (one per thread count, and with torch preloaded
        for GPU functions), started on first use; None when workers start afresh."""
        if not self.config.fork_server:
            return None
        key = (init.threads, init.device.startswith("cuda"))
        with self._forks_lock:
            f = self._forks.get(key)
            if f is None:
                env = template_env(os.environ, init.threads)
                f = self._forks[key] = ForkServer(env, PRELOAD + (("torch",) if key[1] else ()))
                f.warm()  # in the background: the first worker waits less, later bursts not at all
            return f

    def tenant_identity(self, workflow: str) -> Identity | None:
        """The uid and gid the workers of ``workflow`` run under; ``None`` without a sandbox."""
        return self._tenants(workflow) if self._tenants is not None else None

    def _sizes(self, spec: WorkflowSpec) -> Any:
        """The measured edge sizes of ``spec`` (what the simulator places a reference workflow by), or
        ``None``: declared shapes stand in (:func:`~gfaas.runtime.placement.function_edges`)."""
        return self._edge_sizes(spec.name) if self._edge_sizes is not None else None

    def node_of(self, workflow: str, function: str) -> str:
        """The node a function runs on (``placement``, else the first node)."""
        p = self.config.placement
        return p.get(f"{workflow}/{function}") or p.get(function) or self.nodes.first()

    def follow(self, spec: WorkflowSpec, function: str) -> tuple[str, ...]:
        """The functions a worker of ``function`` runs after it in one task (:mod:`gfaas.policy.fusion`),
        with ``fuse_chains`` on, process workers and one node (where tasks can be lazy, so that a
        follower needs no credentials sent ahead); worked out once per spec."""
        if not self.config.fuse_chains or self.config.executor != "process" or not self.nodes.lazy:
            return ()
        got = self._chains.get(id(spec))
        if got is None or got[0] is not spec:  # (an id reused by a later spec)
            stages = [Stage(f.name, plan[1], plan[2],
                            f.kind == "cpu" and not (f.model or f.model_file or f.accelerator or f.scaling),
                            (self.node_of(spec.name, f.name), self.device_of(spec.name, f.name),
                             f.resources or DEFAULT_RESOURCES))
                      for f, plan in zip(spec.functions, spec.dag_plan, strict=True)]
            got = self._chains[id(spec)] = (spec, chains(stages))
        return got[1].get(function, ())

    def start_worker(self, init: Init, node: str = "") -> Any:
        if node and node in self.nodes.nodes and init.transport.get("socket_path") != self.nodes.nodes[node].socket_path:
            init = msgspec.structs.replace(init, transport=self.nodes.transport_settings(node))
        try:
            worker = self._new_worker(init, node)
        except FunctionFailed:
            if self.nodes.locality and node:
                self.nodes.cluster.mark_down(node, f"a worker of {init.workflow}/{init.function} did not start there")
            raise
        worker.gfaas_node = node
        if self.nodes.locality and node:
            worker.name = f"{worker.name}@{node}"  # where each call ran shows in its record
        self.logstore.add(init.workflow, init.function, "", getattr(worker, "start_logs", ()), str(init.version))
        if init.dedup != "off":
            with self.nodes.lock:
                self.dedup.started(worker, init.workflow, init.function, self.nodes.admins.get(node) or self.nodes.admin,
                                   self.nodes.lock)
        return worker

    def _new_worker(self, init: Init, node: str) -> Any:
        if self.config.executor == "inproc":
            return InProcessWorker(init)
        if self.config.executor == "ray":
            from .ray_executor import RayWorker

            pin = {ray_resource(node): RAY_SLIVER} if self.nodes.locality and node else {}
            return RayWorker(init, num_cpus=self.config.ray_cpus_per_worker, num_gpus=self._ray_num_gpus(init),
                             resources=pin,
                             start_timeout=60.0 if pin else 300.0,
                             package=self._archive(init.code_dir) if init.code_dir else None)
        netns = self.nodes.nodes[node].netns if node in self.nodes.nodes else ""
        return ProcessWorker(init, prefix=["ip", "netns", "exec", netns] if netns else None,
                             binder=self.nodes.binder(node), forks=None if netns else self.fork_server(init))

    def _ray_num_gpus(self, init: Init) -> float:
        """The GPUs ``init``'s Ray actor asks for (worked out at deploy, :func:`~.gpus.ray_num_gpus`); none
        where the Ray cluster has no GPU at all: there a GPU function computes on the CPU, as on a node
        without GPUs, instead of waiting for a GPU that never comes."""
        want = self._ray_gpus.get(pool_key(init.workflow, init.version, init.function), 0.0)
        if want > 0:
            from .ray_executor import _ray

            if not _ray().cluster_resources().get("GPU"):
                log.warning("%s/%s: the Ray cluster has no GPUs, so this GPU function runs on the CPU (start Ray "
                            "nodes with GPUs, or `ray start --num-gpus N` to model them)", init.workflow, init.function)
                return 0.0
        return want

    def _archive(self, code_dir: str) -> bytes:
        """The archive of a stored code package, for a Ray actor on another machine (packed again from
        the store: the same files give the same digest, which the actor checks)."""
        from .codepkg import pack_dir

        with self._forks_lock:
            got = self._archives.get(code_dir)
        if got is None:  # packed outside the lock: two starts racing both pack it, to the same bytes
            got = pack_dir(code_dir)
            with self._forks_lock:
                while len(self._archives) >= ARCHIVES_KEPT:  # the oldest first: redeploys add versions
                    self._archives.pop(next(iter(self._archives)), None)
                self._archives[code_dir] = got
        return got

    # -- scaling and resources (runtime.pool, policy.workerpool, policy.resources)
    def default_scaling(self) -> ScalingSpec:
        """The scaling of a function whose spec has no ``scaling:``: 0 to ``workers_per_function``
        workers under the runtime's keep-alive policy."""
        c = self.config
        if c.keep_alive_s is not None:
            return ScalingSpec(max=c.workers_per_function, keep_alive=f"fixed:{c.keep_alive_s / 60.0!r}",
                               scale_to_zero_grace_s=min(30.0, c.keep_alive_s))
        return ScalingSpec(max=c.workers_per_function, keep_alive=c.keep_alive)

    def _ledger(self, node: str) -> Ledger:
        """The node's capacity ledger (under ``_res_lock``)."""
        led = self._ledgers.get(node)
        if led is None:
            c = self.config
            cpus = c.node_cpus or float(len(os.sched_getaffinity(0)))
            mem = c.node_memory_bytes or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            admin = self.nodes.admins.get(node)
            gpus = [f"gpu{k}" for k in admin.devices] if admin is not None and admin.devices else []
            led = self._ledgers[node] = Ledger(cpus, mem, gpus)
        return led

    def _new_pool(self, spec: WorkflowSpec, function: str, version: int, code_dir: str) -> FunctionPool:
        f = spec.function(function)
        node = self.node_of(spec.name, function)
        res = f.resources or DEFAULT_RESOURCES
        if res.gpus > 0 and f.kind != "gpu":
            raise SpecError(f"function {function!r}: resources.gpus = {res.gpus} but its kind is cpu; a cpu "
                            "function reserves no GPU (remove gpus, or make it kind: gpu)")
        with self._res_lock:
            try:
                self._ledger(node).check_ever_fits(res, f"function {function!r}")
            except ConfigError as exc:
                raise SpecError(str(exc)) from None
        # Under Ray only a code package's functions are sandboxed (on their machine, SandboxedActor).
        ident = self.tenant_identity(spec.name) if self.config.executor != "ray" or code_dir else None
        init = Init(spec.name, function, spec.text, self.config.scale, self.nodes.transport_settings(node),
                    self.config.threads_per_worker, self.device_of(spec.name, function),
                    self.gpu_of(spec.name, function), ident.uid if ident else -1, ident.gid if ident else -1,
                    **self.dedup.init_fields(spec.name), gpu_passing=self.config.gpu_passing, code_dir=code_dir,
                    version=version, follow=list(self.follow(spec, function)), poll_s=self.config.poll_us * 1e-6,
                    heap=self.config.worker_heap)
        if self.config.executor == "process":
            self.fork_server(init)  # its template starts now, not at the first request
        if self.config.executor == "ray":
            self._ray_gpus[pool_key(spec.name, version, function)] = ray_num_gpus(f)
        pool = FunctionPool(self.host, pool_key(spec.name, version, function), node, init,
                            f.scaling or self.default_scaling(), res, self.gpu_of(spec.name, function),
                            self.config.max_queue, self.config.scale_tick_s)
        p = self.config.placement
        pool.locality = self.nodes.locality
        pool.pinned = f"{spec.name}/{function}" in p or function in p
        return pool

    def reserve(self, pool: FunctionPool, evict: bool = False, node: str = "") -> bool:
        """Reserve a worker's resources for ``pool`` on ``node`` (default: its node); with ``evict``, stop
        idle workers of other functions (above their min, the longest idle first) when that makes room.
        False: no room."""
        node = node or pool.node
        with self._res_lock:
            led = self._ledger(node)
            if not led.fits(pool.res, pool.gpu):
                if not evict:
                    return False
                others = [p for p in self.pools.values() if p is not pool and p.node == node]
                cands = [c for p in others for c in p.candidates()]
                victims = choose_evictions(led, pool.res, pool.gpu, cands)
                if victims is None:
                    return False
                by_key = {p.key: p for p in others}
                for v in victims:
                    if by_key[v.key].evict(v.id):
                        led.release(v.res, v.gpu)
                        log.info("stopped an idle worker of %s to make room for %s", v.key, pool.key)
                if not led.fits(pool.res, pool.gpu):
                    return False
            led.reserve(pool.res, pool.gpu)
            return True

    def release(self, pool: FunctionPool, res: Resources, node: str = "") -> None:
        with self._res_lock:
            self._ledger(node or pool.node).release(res, pool.gpu)
        if getattr(self, "_autoscaler", None) is not None:
            self._autoscaler.wake()  # a start that waited for room may fit now

    def scaling_status(self, workflow: str) -> dict[str, Any]:
        """Per function of the current version: workers by state (warm, idle, busy, starting), queue,
        target, bounds, keep-alive policy, cold starts, worker-seconds, resources and the warm
        workers' memory (RSS and PSS: after page merging); and each node's capacity and reservations. ``NotFound`` for a workflow that is not deployed."""
        with self._lock:
            cur = self._versions.current(workflow)
            if cur is None:
                raise NotFound(f"no workflow {workflow!r} is deployed; deployed: {sorted(self.specs)}")
            pools = {f.name: self.pools.get(pool_key(workflow, cur.number, f.name)) for f in cur.spec.functions}
        fns = {name: p.counts() | {"memory": p.memory()} for name, p in pools.items() if p is not None}
        with self._res_lock:
            nodes = {n: led.describe() for n, led in self._ledgers.items()}
        return {"workflow": workflow, "version": cur.number, "functions": fns, "nodes": nodes}

    # -- RuntimeAPI
    def deploy(self, spec_text: str, code: bytes | str | os.PathLike[str] | None = None) -> str:
        """Deploy a workflow, or a new version of a deployed one (docs/deploying-code.md).

        ``code``: a code package, the bytes of a tar, tar.gz or zip archive of the modules (and files)
        the handlers use, or a directory of them (packed here with the spec, as ``gfaas deploy --code
        DIR`` does); it is checked (:mod:`gfaas.runtime.codepkg`) and stored by content, and the
        workers import from it alone. Deploying a name that is deployed starts the new version's
        workers, then makes it current: invocations submitted before finish on the old version,
        whose workers stop once they have. The same spec and code as the current version: nothing
        changes. A failure leaves the current version as it was."""
        if code is not None and self.config.executor == "ray" and self._tenants is None:
            # Under Ray a package's functions run sandboxed on their machines (ray_executor.SandboxedActor),
            # under a uid per workflow: with the sandbox off, code from a client would run as Ray's user.
            raise SpecError("code packages need the sandbox (a uid per workflow) and it is off (sandbox='none'): "
                            "turn it on, or install the handlers on every machine and name them in the spec "
                            "(docs/deploy.md)")
        # A package's handlers are imported by its workers only, inside the sandbox: never here.
        spec = loads(spec_text, check_handlers=code is None)
        package = None
        if code is not None and not isinstance(code, bytes):
            code = pack_dir(code, extra={"workflow.yaml": spec_text.encode("utf-8")})
        if code is not None:
            package = read_archive(code)
            check_handlers_in(spec, package)
        self._check_models(spec, package)
        return self._deploy(spec, package, None, "")

    def versions(self, workflow: str) -> list[dict[str, Any]]:
        """Every version of ``workflow``, oldest first: number, whether current, creation time, note
        (a rollback's origin) and its code package (digest, files, bytes) if it has one."""
        with self._lock:
            return self._versions.describe(workflow)

    def rollback(self, workflow: str, version: int) -> int:
        """Make version ``version``'s spec and code current again, as a new version (returned); the
        current version drains as on any update."""
        with self._lock:
            old = self._versions.get(workflow, version)
            cur = self._versions.current(workflow)
        if cur is not None and cur.number == version:
            return version
        self._deploy(old.spec, None, old.code, f"rollback to {version}")
        with self._lock:
            new = self._versions.current(workflow)
        assert new is not None
        return new.number

    def _check_models(self, spec: WorkflowSpec, package: Package | None) -> None:
        for f in spec.functions:
            if f.model_file is not None:
                check_model_file(f, package)
            if f.model:
                from .. import models

                if f.model not in models.names():
                    raise SpecError(f"function {f.name!r} uses model {f.model!r}, which the zoo does not have; "
                                    f"known: {models.names()}")

    def _code_store(self) -> CodeStore:
        with self._lock:
            if self._code is None:
                root = tempfile.mkdtemp(prefix="gfaas-code-", dir="/tmp")
                os.chmod(root, 0o711)  # tenants pass through to their own workflow's packages, list nothing
                self._closers.append(lambda: _rmtree_code(root))
                self._code = CodeStore(os.path.join(root, "packages"))
            return self._code

    def _deploy(self, spec: WorkflowSpec, package: Package | None, stored: StoredPackage | None, note: str) -> str:
        digest = package.digest if package is not None else stored.digest if stored is not None else None
        with self._lock:
            cur = self._versions.current(spec.name)
            if cur is not None and not note and cur.same_content(spec, digest):
                return spec.name  # deployed twice: nothing to do
            if spec.name in self._deploying:
                raise SpecError(f"workflow {spec.name!r} is being deployed by another call; retry once it ends")
            self._deploying.add(spec.name)
            number = self._versions.next_number(spec.name)
        try:
            if package is not None:
                ident = self.tenant_identity(spec.name)
                stored = self._code_store().put(spec.name, package, ident.gid if ident else None)
            with self._lock:
                prior = self._gpus.pop(spec.name, None)
                try:
                    self._place(spec)
                except BaseException:
                    self._restore_gpus(spec.name, prior)
                    raise
            code_dir = str(stored.path) if stored is not None else ""
            pools = [self._new_pool(spec, f.name, number, code_dir) for f in spec.functions]
            try:
                # Workers start (and load their models) side by side: a deploy takes about as long as
                # its slowest function rather than the sum of them.
                with ThreadPoolExecutor(max_workers=len(pools), thread_name_prefix=f"deploy-{spec.name}") as ex:
                    for fut in [ex.submit(p.start, self.config.prewarm) for p in pools]:
                        fut.result()
            except BaseException as exc:
                for p in pools:
                    p.close()
                    self._ray_gpus.pop(p.key, None)
                with self._lock:
                    self._restore_gpus(spec.name, prior)
                if stored is not None and isinstance(exc, FunctionFailed):
                    # (the hint only where a handler could be to blame, not where its machine refused it)
                    hint = "" if isinstance(exc, MachineRefused) else \
                        "; a handler names module:function of a module inside the package"
                    raise CodePackageError(f"workflow {spec.name!r} (code {stored.digest[:12]}): {exc}{hint}") from None
                raise
            with self._lock:
                old = self._versions.add(WorkflowVersion(number, spec, stored, note=note))
                self.specs[spec.name] = spec
                cur_v = self._versions.current(spec.name)
                if cur_v is not None:
                    self._current[spec.name] = cur_v
                for p in pools:
                    self.pools[p.key] = p
            self._autoscaler.wake()  # the new pools' first tick
        finally:
            with self._lock:
                self._deploying.discard(spec.name)
        if old is not None:
            self._retire_version(spec.name, old)
        log.info("deployed %s version %d (%d functions%s)", spec.name, number, len(spec.functions),
                 f", code {stored.digest[:12]}" if stored is not None else "")
        return spec.name

    def _restore_gpus(self, workflow: str, prior: dict[str, str] | None) -> None:
        if prior is None:
            self._gpus.pop(workflow, None)
        else:
            self._gpus[workflow] = prior

    def _retire_version(self, workflow: str, version: int) -> None:
        """Stop an old version's workers once its invocations have finished (on a thread of its own,
        so the deploy returns at once); after ``drain_timeout_s`` the stragglers fail as on undeploy."""
        prefix = pool_key(workflow, version, "")

        def drain() -> None:
            deadline = time.monotonic() + self.config.drain_timeout_s
            while self.host.unfinished(workflow, version) and time.monotonic() < deadline and not self.closed:
                time.sleep(0.02)
            with self._lock:
                pools = [p for key, p in self.pools.items() if key.startswith(prefix)]
            self._stop_pools(workflow, pools, version,
                             f"workflow {workflow!r} version {version} was replaced and did not finish this "
                             f"invocation within drain_timeout_s={self.config.drain_timeout_s}")
            log.info("retired %s version %d", workflow, version)

        threading.Thread(target=drain, name=f"gfaas-drain-{workflow}@{version}", daemon=True).start()

    def undeploy(self, workflow: str) -> None:
        """Remove a deployed workflow and stop its workers (``NotFound`` if it is not deployed).

        New submits are refused at once; a task already running finishes (its worker is stopped right
        after); the workflow's unfinished invocations fail with "undeployed" and their data is freed.
        """
        with self._lock:
            if self.specs.pop(workflow, None) is None:
                raise NotFound(f"no workflow {workflow!r} is deployed; deployed: {sorted(self.specs)}")
            self._gpus.pop(workflow, None)
            self._versions.drop(workflow)
            self._current.pop(workflow, None)
            pools = [p for key, p in self.pools.items() if key.startswith((f"{workflow}/", f"{workflow}@"))]
            code = self._code
        self._stop_pools(workflow, pools, None,
                         f"workflow {workflow!r} was undeployed before this invocation finished")
        if code is not None:
            code.remove(workflow)
        log.info("undeployed %s (%d functions)", workflow, len(pools))

    def _stop_pools(self, workflow: str, pools: list[FunctionPool], version: int | None, reason: str) -> None:
        """Close ``pools`` (a running task ends first) and fail the invocations of ``workflow`` (of
        ``version``; None: of any) that had not finished."""
        for p in pools:
            p.close()  # a running task ends first (its reply still reaches its caller); workers stop
            self._ray_gpus.pop(p.key, None)
        dropped = []
        with self._lock:
            for p in pools:
                if self.pools.get(p.key) is p:
                    del self.pools[p.key]
                with p.cv:
                    while p.queue:  # queued tasks never run: they no longer count against their invocation
                        inv, fn, _ = p.queue.popleft()
                        p.left += 1
                        inv.queued.pop(fn, None)
                        dropped.append((inv, fn))
        self.host.stopped(workflow, version, reason, dropped)

    def _place(self, spec: WorkflowSpec) -> None:
        """GPUs for the spec's GPU functions (call under the lock): on a ``topology``, by the policy
        on the first node's GPUs, the free ones first (all of them once every GPU holds some
        function: functions then share GPUs); else on the GPUs their node reports."""
        if not self.config.topology:
            self._place_on_nodes(spec)
            return
        topo = self._topology()
        gpus = [g for g in topo.gpus if topo.device(g).node == topo.device(topo.gpus[0]).node] if topo else []
        if len(gpus) < 2 or not any(f.kind == "gpu" for f in spec.functions):
            return
        from .placement import place_gpu_functions

        used = {g for m in self._gpus.values() for g in m.values()}
        free = [g for g in gpus if g not in used] or gpus
        self._gpus[spec.name] = place_gpu_functions(spec, topo, free, self._sizes(spec))  # type: ignore[arg-type]
        log.info("placed %s on %s", spec.name, self._gpus[spec.name])

    def _place_on_nodes(self, spec: WorkflowSpec) -> None:
        """GPU functions on the GPUs of the node each runs on: one GPU takes them all; several are
        shared out by the policy on the machine's detected topology (CUDA), or in turn (modelled)."""
        placed: dict[str, str] = {}
        by_node: dict[str, list[str]] = {}
        for f in spec.functions:
            if f.kind == "gpu":
                by_node.setdefault(self.node_of(spec.name, f.name), []).append(f.name)
        for node, fns in by_node.items():
            admin = self.nodes.admins.get(node)
            if admin is None or not admin.devices:
                continue
            gpus = list(admin.devices)
            if len(gpus) == 1:
                placed.update({f: f"gpu{gpus[0]}" for f in fns})
                continue
            topo = self._detected_topology() if admin.device_kind == "cuda" else None
            names = [f"gpu{k}" for k in gpus]
            every = [f.name for f in spec.functions if f.kind == "gpu"]
            if topo is not None and fns == every and all(n in topo.gpus for n in names):
                from .placement import place_gpu_functions

                placed.update(place_gpu_functions(spec, topo, names, self._sizes(spec)))
            else:
                placed.update({f: f"gpu{k}" for f, k in spread(fns, gpus).items()})
        if placed:
            self._gpus[spec.name] = placed
            log.info("placed %s on %s", spec.name, placed)

    def _detected_topology(self) -> Topology | None:
        if self._topo is None:
            from ..topology import detect

            self._topo = detect()
        return self._topo

    def device_of(self, workflow: str, function: str) -> str:
        """Where ``function`` computes: ``cuda:K`` when it is placed on a CUDA GPU of its node, else ``cpu``."""
        k = ordinal(self.gpu_of(workflow, function))
        admin = self.nodes.admins.get(self.node_of(workflow, function))
        if k is None or admin is None or admin.device_kind != "cuda" or k not in admin.devices:
            return "cpu"
        # Under Ray this says only that the function computes on CUDA: its actor asks Ray for a GPU and
        # runs on the one it is assigned (ray_executor.on_assigned_gpu).
        return f"cuda:{k}"

    def _topology(self) -> Topology | None:
        if not self.config.topology:
            return None
        if self._topo is None:
            from ..topology.io import resolve

            self._topo = resolve(self.config.topology)  # a preset name (dgx-v100, NAME*N) or a file
        return self._topo

    def gpu_of(self, workflow: str, function: str) -> str:
        """The GPU ``function`` of ``workflow`` is placed on (``""``: none, a CPU-only node)."""
        return self._gpus.get(workflow, {}).get(function, "")

    def placement(self, workflow: str) -> dict[str, str]:
        """GPU function -> GPU of a deployed workflow (empty without a multi-GPU topology)."""
        self.spec(workflow)  # NotFound for an unknown workflow
        with self._lock:
            return dict(self._gpus.get(workflow, {}))

    def spec(self, workflow: str) -> WorkflowSpec:
        """The current version's spec; ``NotFound`` for a workflow that is not deployed."""
        spec = self.specs.get(workflow)
        if spec is None:
            raise NotFound(f"no workflow {workflow!r} is deployed; deployed: {self.workflows()}")
        return spec

    def current(self, workflow: str) -> WorkflowVersion | None:
        """The current version (its spec and number), or None (read without a lock: one dict look-up)."""
        return self._current.get(workflow)

    def workflows(self) -> list[str]:
        with self._lock:
            return sorted(self.specs)

    def describe(self, workflow: str) -> dict[str, Any]:
        return self.spec(workflow).describe()

    # -- locality across nodes (runtime.cluster, policy.locality)
    def function_nodes(self, pool: FunctionPool) -> list[str]:
        """The nodes a new worker of ``pool`` may start on now: its placed node, or with ``locality``
        every node that is up (and, under Ray, has a Ray node beside it)."""
        if not self.nodes.locality or pool.pinned:
            return [pool.node]
        nodes = [n for n in self.nodes.nodes if self.nodes.cluster.up(n)]
        if self.config.executor == "ray":
            from .ray_executor import _ray

            ray_nodes = self.nodes.cluster.ray_nodes(_ray(), nodes)
            nodes = [n for n in nodes if n in ray_nodes]
        return nodes

    def slot_node(self, pool: FunctionPool, waiting: list[str | None], workers: dict[str, int]) -> str:
        """Where ``pool``'s next worker starts: among :meth:`function_nodes`, the one the waiting calls
        prefer most (``waiting``: each queued call's preferred node), then the one with fewest workers."""
        cands = self.function_nodes(pool)
        if not cands:
            raise FunctionFailed(f"no node can run {pool.key} now: every node is down or has no Ray node "
                                 f"(nodes: {sorted(self.nodes.nodes)}); start `gfaas node start --join ... --ray-address ...`")
        weights: dict[str, int] = {}
        for n in waiting:
            if n is not None:
                weights[n] = weights.get(n, 0) + 1
        return choose_node(cands, weights, workers)


def _rmtree_code(root: str) -> None:
    """Remove the runtime's code packages (their directories are read-only)."""
    from pathlib import Path

    from .codepkg import remove_tree

    remove_tree(Path(root))
