"""The local runtime: a node daemon, warm workers per function, per-function queues and the invoker.

:class:`LocalRuntime` implements :class:`~gfaas.runtime.api.RuntimeAPI` for one machine. Per function
it keeps a FIFO queue and a scaled set of warm workers (:mod:`gfaas.runtime.pool`: started and stopped
by the shared autoscaling policy within the function's ``scaling:`` bounds, each reserving its
``resources:`` on the node, replaced when it dies). An invocation opens a data-plane invocation with a token per function, stores the request's
inputs as the ``gateway`` function, hands ready functions to their queues as :class:`DagState` decides,
and collects the declared outputs when every function has run or been skipped.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import numpy as np

from ..dataplane.peer_auth import PeerKey
from ..dataplane.protocol import QueueEntry
from ..errors import (
    CodePackageError,
    ConfigError,
    DaemonUnavailable,
    FunctionFailed,
    GfaasError,
    NotFound,
    Overloaded,
    RemoteError,
    SpecError,
)
from ..policy.autoscale import ScalingSpec, keep_alive_policy
from ..policy.bandwidth import input_deadline, slo_for
from ..policy.locality import choose_node
from ..policy.resources import DEFAULT_RESOURCES, Ledger, Resources, choose_evictions
from ..topology import Topology
from ..units import GiB
from .accel import DSCS, Decision, DscsDrive, DscsDrives
from .cluster import RAY_SLIVER, Cluster, check_join, discover, ray_resource
from .codepkg import (
    CodeStore,
    Package,
    StoredPackage,
    check_handlers_in,
    check_model_file,
    pack_dir,
    read_archive,
)
from .dag import DagState
from .dedup import RuntimeDedup
from .dedup import check_mode as check_dedup_mode
from .gpus import check_gpus, node_devices, ordinal, spread
from .hints import Batch as HintBatch
from .hints import QueueHinter
from .logs import LogStore, failure_lines
from .pool import Autoscaler, FunctionPool
from .result import Breakdown, Failure, FunctionRecord, InvocationResult, Status
from .sandbox import Identity, TenantIds, sandbox_enabled
from .spec import INPUT, MAX_TIMEOUT_S, WorkflowSpec, loads, name_diff
from .transport import AttachedPool, RedisTransport, Transport, TransportConfig, open_transport
from .versions import VersionTable, WorkflowVersion
from .worker import (
    GATEWAY,
    Done,
    Failed,
    Init,
    InProcessWorker,
    ProcessWorker,
    Task,
    TaskTimedOut,
    WorkerDied,
)

if TYPE_CHECKING:
    from ..dataplane.client import Binder

log = logging.getLogger("gfaas.runtime")


@dataclass(frozen=True)
class RuntimeConfig:
    """How the local runtime runs functions.

    Attributes:
        transport: ``gfaas`` (the data plane) or ``redis`` (the host-centric baseline): the default for
            invocations that name none (``submit(..., transport=...)`` picks per invocation, so one set of
            warm workers can serve both).
        executor: ``process`` (a warm worker process per function slot), ``ray`` (a Ray actor per slot,
            see :mod:`gfaas.runtime.ray_executor`) or ``inproc`` (handlers run in this process: for tests
            and debugging, no crash isolation).
        scale: model zoo scale for every function's model, ``small`` or ``full``.
        workers_per_function: the most workers of a function whose spec has no ``scaling:`` (its
            ``scaling.max``; such a function scales between 0 and this, docs/autoscaling.md).
        max_queue: requests waiting per function before submits are refused with ``Overloaded``.
        keep_alive: the keep-alive policy of functions whose spec names none (``gfaas``, ``hybrid``,
            ``fixed:<minutes>``; :func:`gfaas.policy.keep_alive_policy`).
        keep_alive_s: if set, a fixed keep-alive in seconds for those functions instead (an idle last
            worker is stopped after this long; the next request starts one again).
        prewarm: start each function's first worker (and its ``scaling.min``) at deploy rather than on
            the first request.
        scale_tick_s: how often the autoscaler samples each function's concurrency and decides.
        node_cpus, node_memory_bytes: what the workers of the node this runtime starts may reserve in
            all (``resources:``; 0: the machine's cores and physical memory).
        threads_per_worker: intra-op threads of each worker's model.
        node_capacity_bytes: shared-memory pool of the node daemon this runtime starts.
        nodes: running node daemons to use instead of starting one; the first is where the gateway
            stores requests and reads results. Several nodes make a multi-node runtime (their daemons
            share a global directory, so gets pull across nodes).
        placement: ``"workflow/function"`` (or ``"function"``) -> node name; unplaced functions go to the
            first node.
        redis_url: the baseline's Redis; a throwaway server is started when empty.
        ray_address: the Ray cluster to join (``executor="ray"``); a local one is started when empty.
        ray_cpus_per_worker: the CPU request of each function actor (fractions let many share a core).
        queue_hints: tell the node daemons where each invocation's functions wait whenever queues
            change (coalesced, see :mod:`gfaas.runtime.hints`), so their eviction is queue-aware.
        queue_hint_interval_s: the least time between two rounds of queue hints.
        topology: the node's GPUs and links (a preset name such as ``dgx-v100``, or a topology YAML
            file; ``""``: none). With two or more GPUs on the first node, each workflow's GPU
            functions are placed on them by :func:`gfaas.policy.place_workflow`, the decision the
            simulator makes (:mod:`gfaas.runtime.placement`); a worker sees its GPU as ``ctx.gpu``.
        sandbox: ``auto`` (default): when the runtime runs as root, each workflow's worker processes run
            under a uid of their own, so function code cannot read the node's tokens and state or
            other tenants' memory (:mod:`gfaas.runtime.sandbox`); without root, functions run as the
            caller (a warning says so). ``uid``: the same, but refuse to start without root. ``none``:
            functions run as the caller (trusted code only).
        sandbox_uid_base: the first tenant uid (uids of existing accounts are skipped).
        dscs_drives: simulated storage nodes, each a drive with an in-storage accelerator, for
            functions marked ``accelerator: dscs`` (:mod:`gfaas.runtime.accel`; 0: none, so marked
            functions always run on a CPU worker). ``LocalRuntime.drives`` holds them.
        dscs_preset: the accelerator preset of those drives (:func:`gfaas.accel.preset`).
        dedup: page merging of warm workers' memory (:mod:`gfaas.runtime.dedup`, docs/dedup.md):
            ``off`` (default); ``shared``: workers map their model's weights from one copy per sharing
            domain (content-addressed, in RAM, removed with the runtime); ``merge``: the memory a
            model load added is marked mergeable and the node merges identical pages by a KSM burst
            (root); ``on``: both. ``ctx.merge(obj)`` hints more unless ``off``.
        dedup_domain: the sharing domain of every workflow of this runtime (one owner's workflows);
            ``""`` (default): each workflow is a domain of its own, so no two share a page.
        gpus: the GPUs of the node this runtime starts (:mod:`gfaas.runtime.gpus`): ``auto``
            (default: every CUDA GPU CuPy sees, none on a CPU-only machine), ``none``, ``cuda``,
            ``cuda:0,1``, or ``null:0,1`` (modelled GPUs: placement only, compute stays on the CPU).
            ``kind: gpu`` functions run on the node's CUDA GPUs (models by the torch engine); with
            no GPU they run on the CPU as before. Nodes given in ``nodes`` report their own GPUs.
        gpu_passing: how GPU functions exchange data with the gfaas transport: ``device`` (default:
            inputs arrive as device views, staged onto the GPU by the node; device outputs go into the
            node's GPU pool with one device-to-device copy and pass on by CUDA IPC) or ``host``
            (every object through host memory, the function copying to and from its GPU: the
            comparison point of ``gfaas demo --gpu``).
        drain_timeout_s: how long an old version's invocations may run on after an update made
            another version current, before they fail as on undeploy.
        function_timeout_s: the longest one call of a function may run once a worker took it, for
            functions whose spec sets no ``timeout_s:`` (default 300 s). Past it the worker is killed
            and replaced and the invocation fails naming the function and the timeout (the ``inproc``
            executor cannot kill a thread and does not enforce it).
        cluster_key_file: the key every node of a multi-machine cluster holds (``gfaas cluster keygen``):
            with it the runtime reaches nodes on other machines through their transfer port and gives
            each invocation tokens that every node derives from the key, so none crosses the network
            (:mod:`gfaas.dataplane.peer_control`, docs/deploy.md).
        join: the global directory's Redis URL: the runtime's own node joins it (reachable by peers at
            ``transfer_host``), and every node registered there (``gfaas node start --join``) is used too.
        redis_password_file: the password file of ``join``'s directory.
        transfer_host: the address on which the runtime's own node serves pulls to other machines.
        locality: run each call of a function on any node, the one holding most of its inputs (the
            global directory says which) preferred (:mod:`gfaas.policy.locality`); ``None`` (default):
            on with the Ray executor and several nodes. Functions named in ``placement`` stay put.
        log_dir: where the functions' logs are kept as rotated JSON lines files, one per function
            (:mod:`gfaas.runtime.logs`; made 0700, files 0600); ``""`` (default): a private temporary
            directory removed with the runtime. The last lines of each function are also kept in memory
            (:meth:`LocalRuntime.logs`).
    """

    transport: Literal["gfaas", "redis"] = "gfaas"
    executor: Literal["process", "ray", "inproc"] = "process"
    scale: Literal["small", "full"] = "small"
    workers_per_function: int = 1
    max_queue: int = 1024
    keep_alive: str = "gfaas"
    keep_alive_s: float | None = None
    prewarm: bool = True
    scale_tick_s: float = 0.5
    node_cpus: float = 0.0
    node_memory_bytes: int = 0
    threads_per_worker: int = 1
    node_capacity_bytes: int = 2 * GiB
    nodes: tuple[NodeEndpoint, ...] = ()
    placement: Mapping[str, str] = field(default_factory=dict)
    redis_url: str = ""
    ray_address: str = ""
    ray_cpus_per_worker: float = 0.25
    queue_hints: bool = True
    queue_hint_interval_s: float = 0.05
    topology: str = ""
    sandbox: Literal["auto", "uid", "none"] = "auto"
    sandbox_uid_base: int = 200000
    dscs_drives: int = 1
    dscs_preset: str = "dscs"
    dedup: Literal["off", "shared", "merge", "on"] = "off"
    dedup_domain: str = ""
    gpus: str = "auto"
    gpu_passing: Literal["device", "host"] = "device"
    drain_timeout_s: float = 600.0
    function_timeout_s: float = 300.0
    log_dir: str = ""
    cluster_key_file: str = ""
    join: str = ""
    redis_password_file: str = ""
    transfer_host: str = ""
    locality: bool | None = None

    def __post_init__(self) -> None:
        if self.transport not in ("gfaas", "redis"):
            raise ConfigError(f"transport {self.transport!r} is not 'gfaas' or 'redis'")
        if self.executor not in ("process", "ray", "inproc"):
            raise ConfigError(f"executor {self.executor!r} is not 'process', 'ray' or 'inproc'")
        if self.ray_cpus_per_worker <= 0:
            raise ConfigError(f"ray_cpus_per_worker must be > 0, got {self.ray_cpus_per_worker}")
        if self.scale not in ("small", "full"):
            raise ConfigError(f"scale {self.scale!r} is not 'small' or 'full'")
        for name in ("workers_per_function", "max_queue", "threads_per_worker"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.keep_alive_s is not None and not self.keep_alive_s > 0:
            raise ConfigError(f"keep_alive_s must be > 0 seconds (or None for the keep_alive policy), got "
                              f"{self.keep_alive_s}")
        keep_alive_policy(self.keep_alive)  # validates the name
        if not self.scale_tick_s > 0:
            raise ConfigError(f"scale_tick_s must be > 0 seconds, got {self.scale_tick_s}")
        if not self.node_cpus >= 0 or not (isinstance(self.node_memory_bytes, int) and self.node_memory_bytes >= 0):
            raise ConfigError(f"node_cpus={self.node_cpus!r} and node_memory_bytes={self.node_memory_bytes!r} "
                              "must be >= 0 (0: the machine's)")
        if not self.queue_hint_interval_s >= 0:
            raise ConfigError(f"queue_hint_interval_s must be >= 0 seconds, got {self.queue_hint_interval_s}")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ConfigError(f"node names must be unique, got {names}")
        for fn, node in self.placement.items():
            if node not in names:
                raise ConfigError(f"placement of {fn!r} names node {node!r}, which is not among nodes {names}")
        sandbox_enabled(self.sandbox, self.executor)  # validates
        if not isinstance(self.sandbox_uid_base, int) or self.sandbox_uid_base < 1000:
            raise ConfigError(f"sandbox_uid_base={self.sandbox_uid_base!r} must be an integer >= 1000")
        if isinstance(self.dscs_drives, bool) or not isinstance(self.dscs_drives, int) or self.dscs_drives < 0:
            raise ConfigError(f"dscs_drives={self.dscs_drives!r} must be a whole number >= 0 (0: no drives)")
        check_dedup_mode(self.dedup)
        check_gpus(self.gpus)
        if self.gpu_passing not in ("device", "host"):
            raise ConfigError(f"gpu_passing={self.gpu_passing!r} is not 'device' or 'host'")
        if not self.drain_timeout_s > 0:
            raise ConfigError(f"drain_timeout_s must be > 0 seconds, got {self.drain_timeout_s}")
        if not 0 < self.function_timeout_s <= MAX_TIMEOUT_S:
            raise ConfigError(f"function_timeout_s must be in (0, {MAX_TIMEOUT_S:g}] seconds, got "
                              f"{self.function_timeout_s}")
        check_join(self.join, self.cluster_key_file)
        if self.join and self.nodes:
            raise ConfigError("give join (the runtime starts its node and finds the others in the directory) or "
                              "nodes (running daemons), not both")


@dataclass(frozen=True)
class NodeEndpoint:
    """A running node daemon the runtime uses (``gfaas node start`` or a cluster node).

    ``netns``: the network namespace of that host; its function workers are started inside it.
    ``address``: the node's transfer address (``host:port``) for a node on another machine, reached
    with the cluster key (``RuntimeConfig.cluster_key_file``) when ``state_dir`` is empty;
    ``socket_path`` is then the socket's path *on that machine*, which its workers use.
    """

    name: str
    socket_path: str
    state_dir: str = ""
    netns: str = ""
    address: str = ""


# ---- one invocation ---------------------------------------------------------------------------------
@dataclass
class _Invocation:
    id: str
    spec: WorkflowSpec
    dag: DagState
    submitted: float
    tokens: dict[str, str]
    kind: str = "gfaas"  # its transport
    refs: dict[tuple[str, str], str] = field(default_factory=dict)  # (source, output) -> reference
    records: dict[str, FunctionRecord] = field(default_factory=dict)
    enqueued: dict[str, float] = field(default_factory=dict)
    host_s: float = 0.0
    running: int = 0  # tasks queued or running
    completing: bool = False
    ended: bool = False
    status: Status = "queued"
    error: str | None = None
    result: InvocationResult | None = None
    done: threading.Event = field(default_factory=threading.Event)
    callbacks: list[Callable[[InvocationResult], None]] = field(default_factory=list)  # add_done_callback
    # (source, output) -> the simulated drive that holds it (runtime.accel's rule); -1: none
    homes: dict[tuple[str, str], int] = field(default_factory=dict)
    version: int = 1  # the workflow version it runs on (the current one when it was submitted)
    deadline: float | None = None  # monotonic time by which its functions must start (submit's deadline_s)
    failure: Failure | None = None  # the failing function's traceback and last lines
    queued: dict[str, tuple[str, int]] = field(default_factory=dict)  # function -> (queue, ticket) while queued
    prefer: dict[str, str] = field(default_factory=dict)  # function -> the node holding most of its inputs


def pool_key(workflow: str, version: int, function: str) -> str:
    """``workflow/function`` for a first version, ``workflow@N/function`` for later ones (names
    never hold '@' or '/', so keys cannot collide)."""
    return f"{workflow}/{function}" if version == 1 else f"{workflow}@{version}/{function}"


# ---- the runtime ----------------------------------------------------------------------------------
class LocalRuntime:
    """Workflows on this machine. Use as a context manager, or call :meth:`close`."""

    def __init__(self, config: RuntimeConfig | None = None, *,
                 input_generator: Callable[[str, int, str], dict[str, np.ndarray]] | None = None) -> None:
        self.config = config or RuntimeConfig()
        self._input_generator = input_generator
        self._lock = threading.Lock()
        # The simulated storage nodes of `accelerator: dscs` functions (runtime.accel).
        self.drives = DscsDrives([DscsDrive(f"drive{k}", self.config.dscs_preset)
                                  for k in range(self.config.dscs_drives)])
        self._seq = 0  # invocations submitted: which drive stores an invocation's inputs
        self._specs: dict[str, WorkflowSpec] = {}  # each workflow's current version's spec
        self._versions = VersionTable()
        self._deploying: set[str] = set()
        self._code: CodeStore | None = None  # code packages (runtime.codepkg), created on first use
        self._closed = False
        self._pools: dict[str, FunctionPool] = {}
        self._invs: dict[str, _Invocation] = {}
        self._finished: deque[str] = deque()
        self._closers: list[Callable[[], None]] = []
        self._nodes: dict[str, NodeEndpoint] = {}
        self._admins: dict[str, Any] = {}  # node -> Admin; the first is the gateway's node
        self._admin: Any = None
        self._admin_lock = threading.Lock()  # Admin connections are shared by many threads
        self._gateway_pool: AttachedPool | None = None  # attached connections for request inputs and results
        self._redis_url = self.config.redis_url
        self._hinter: QueueHinter | None = None
        self._gpus: dict[str, dict[str, str]] = {}  # workflow -> GPU function -> GPU (see _place)
        self._topo: Topology | None = None
        self._tenants: TenantIds | None = None
        self.dedup = RuntimeDedup(self.config.dedup, self.config.dedup_domain)
        self._closers.append(self.dedup.close)
        self.logstore = self._logstore()
        if sandbox_enabled(self.config.sandbox, self.config.executor):
            self._tenants = TenantIds(self.config.sandbox_uid_base)
        elif self.config.sandbox == "auto" and self.config.executor == "process":
            log.warning("functions run as uid %d, the runtime's own: they can read what it can (the node's "
                        "state and tokens). Run as root for a uid per tenant (docs/security.md).", os.getuid())
        self.cluster = self._cluster_view()
        self._locality = False
        try:
            self._start_backends()
        except BaseException:
            self.close()
            raise
        self._hint_admins: dict[str, Any] = {}  # node -> the hinter's own Admin connection
        if self.config.queue_hints:
            self._hinter = QueueHinter(self._hint_batch, self._send_hints, self.config.queue_hint_interval_s)
        self._ending: deque[_Invocation] = deque()  # invocations whose data the ender frees
        self._end_cv = threading.Condition()
        self._ender_stop = False
        self._ender_thread = threading.Thread(target=self._ender, name="gfaas-ender", daemon=True)
        self._ender_thread.start()
        self._res_lock = threading.Lock()  # the ledgers; taken before any pool's lock, never under one
        self._ledgers: dict[str, Ledger] = {}
        self._autoscaler = Autoscaler(lambda: list(self._pools.values()), self.config.scale_tick_s)

    def _cluster_view(self) -> Cluster:
        c = self.config
        key = PeerKey.from_file(c.cluster_key_file) if c.cluster_key_file else None
        redis = None
        if c.join:
            from ..config import NodeConfig
            from ..dataplane.directory import redis_client

            redis = redis_client(NodeConfig(node_id="gateway", redis_url=c.join, cluster_key_file=c.cluster_key_file,
                                            redis_password_file=c.redis_password_file), 5.0)
            self._closers.append(redis.close)
        return Cluster(key, redis)

    def _logstore(self) -> LogStore:
        """The functions' logs (runtime.logs): in ``log_dir``, or a private directory removed at close."""
        d = self.config.log_dir
        if not d:
            d = tempfile.mkdtemp(prefix="gfaas-logs-", dir="/tmp")
            self._closers.append(lambda: shutil.rmtree(d, ignore_errors=True))
        store = LogStore(d)
        self._closers.append(store.close)
        return store

    def logs(self, workflow: str, function: str | None = None, invocation: str | None = None,
             since: float | None = None, limit: int = 1000, after: int | None = None) -> list[dict[str, Any]]:
        """The last ``limit`` kept log lines of ``workflow``'s functions, oldest first, each a dict of
        ``seq, time, workflow, version, function, invocation, stream, level, text`` (runtime.logs).

        Filters: one ``function``; one ``invocation`` (``""``: lines printed outside any task, such as
        a model load); ``since`` (a ``time.time()``); ``after`` (a ``seq`` already seen: what
        follow-mode readers poll with). ``NotFound`` for a workflow neither deployed nor logged."""
        if limit < 0:
            raise SpecError(f"limit={limit} must be >= 0")
        with self._lock:
            deployed = workflow in self._specs
        if not deployed and not self.logstore.known(workflow):
            raise NotFound(f"no workflow {workflow!r} is deployed or has logs here; deployed: {self.workflows()}")
        return self.logstore.read(workflow, function, invocation, since, after, limit)

    def deadline_added(self, at: float) -> None:
        """A call with a deadline (monotonic ``at``) was queued: the scaler expires it then if still queued."""
        self._autoscaler.wake_by(at)

    def queues_changed(self, inv: Any = None, queue: str | None = None) -> None:
        """``inv``'s functions moved (queued, dispatched, finished), a request entered or left
        ``queue``: the hinter sends where they stand now, soon (runtime.hints)."""
        if self._hinter is not None:
            self._hinter.changed(inv.id if inv is not None else None, queue)

    # -- setup
    def _start_backends(self) -> None:
        cfg = self.config
        if cfg.executor == "ray":
            from .ray_executor import ensure_ray, shutdown_ray

            if self.cluster.key is not None and cfg.ray_address:  # the cluster's Ray token (deploy.ray_node)
                os.environ.setdefault("RAY_AUTH_MODE", "token")
                os.environ.setdefault("RAY_AUTH_TOKEN", self.cluster.key.ray_token())

            if ensure_ray(cfg.ray_address):
                self._closers.append(shutdown_ray)
        if cfg.transport == "redis":
            self._ensure_redis()

        nodes = list(cfg.nodes)
        if not nodes:
            from ..config import NodeConfig
            from ..dataplane.local import LocalNode

            run_dir = tempfile.mkdtemp(prefix="gfaas-rt-", dir="/tmp")
            self._closers.append(lambda: shutil.rmtree(run_dir, ignore_errors=True))
            joined: dict[str, Any] = {}
            if cfg.join:  # the gateway's node is a node of the cluster: peers pull requests from it
                joined = {"redis_url": cfg.join, "redis_password_file": cfg.redis_password_file,
                          "cluster_key_file": cfg.cluster_key_file, "transfer_host": cfg.transfer_host or "127.0.0.1"}
            node_cfg = NodeConfig(node_id="gateway" if cfg.join else "rt0",
                                  socket_path=os.path.join(run_dir, "node.sock"),
                                  state_dir=os.path.join(run_dir, "state"), capacity_bytes=cfg.node_capacity_bytes,
                                  devices=node_devices(cfg.gpus), **joined)
            node = LocalNode(node_cfg).__enter__()
            self._closers.append(lambda: node.__exit__(None, None, None))
            nodes = [NodeEndpoint(node_cfg.node_id, node_cfg.socket_path, node_cfg.state_dir)]
        if cfg.join:
            nodes += self._joined_nodes({n.name for n in nodes})
        from_directory = {n.name for n in nodes[len(cfg.nodes) or 1:]} if cfg.join else set()
        for n in nodes:
            try:
                admin = self._connect_admin(n)
            except (RemoteError, DaemonUnavailable) as exc:
                if n.name not in from_directory:
                    raise
                # A node registered in the directory but not answering (a dead machine's entry stays
                # until it restarts): the cluster is served without it.
                log.warning("joined node %s at %s does not answer (%s); left out", n.name, n.address, exc)
                continue
            self._closers.append(admin.close)
            self._nodes[n.name], self._admins[n.name] = n, admin
        self.cluster.node_ids = {a.node_id: name for name, a in self._admins.items()}
        self.cluster.probe = self._probe
        self._admin = self._admins[nodes[0].name]
        self._locality = cfg.locality if cfg.locality is not None else (cfg.executor == "ray" and len(self._nodes) > 1)
        self._gateway_pool = AttachedPool(self._admin.attach)
        self._closers.append(self._gateway_pool.close)  # (before the node connections: closers run in reverse)

    def _joined_nodes(self, have: set[str]) -> list[NodeEndpoint]:
        """The nodes registered in ``join``'s directory (other than ``have``)."""
        assert self.cluster.redis is not None and self.cluster.key is not None
        found = discover(self.cluster.redis, self.cluster.key)
        out = [NodeEndpoint(n["node"], n["socket"], address=n["address"]) for n in found if n["node"] not in have]
        log.info("joined %s: nodes %s", self.config.join, [n.name for n in out])
        return out

    def _connect_admin(self, n: NodeEndpoint) -> Any:
        """A control connection to ``n``: its Unix socket, or its transfer port for a node elsewhere."""
        from ..dataplane.client import Admin

        if n.address and not n.state_dir:
            from ..dataplane.peer_control import PeerAdmin

            if self.cluster.key is None:
                raise ConfigError(f"node {n.name!r} at {n.address} is on another machine: set cluster_key_file")
            return PeerAdmin(n.address, n.name, self.cluster.key)
        return Admin(n.socket_path, state_dir=n.state_dir or None)

    def _ensure_redis(self) -> None:
        """Start the baseline's throwaway Redis the first time an invocation needs it."""
        with self._lock:
            if self._redis_url:
                return
            from ..dataplane.redis_server import RedisServer

            # With a password: other local users must not read or rewrite the baseline's objects. The
            # URL carrying it travels to workers over their control socket only, never in argv.
            srv = RedisServer(password=True, lifeline=True).__enter__()
            self._closers.append(lambda: srv.__exit__(None, None, None))
            self._redis_url = f"redis://:{srv.password}@127.0.0.1:{srv.port}/0"

    def node_of(self, workflow: str, function: str) -> str:
        """The node a function runs on (``placement``, else the first node)."""
        p = self.config.placement
        return p.get(f"{workflow}/{function}") or p.get(function) or next(iter(self._nodes), "")

    def transport_settings(self, node: str = "", kind: str = "") -> dict[str, str]:
        if (kind or self.config.transport) == "redis":
            return {"kind": "redis", "redis_url": self._redis_url}
        endpoint = self._nodes[node] if node else next(iter(self._nodes.values()))
        return {"kind": "gfaas", "socket_path": endpoint.socket_path}

    def tenant_identity(self, workflow: str) -> Identity | None:
        """The uid and gid the workers of ``workflow`` run under; ``None`` without a sandbox."""
        return self._tenants(workflow) if self._tenants is not None else None

    def start_worker(self, init: Init, node: str = "") -> Any:
        if node and node in self._nodes and init.transport.get("socket_path") != self._nodes[node].socket_path:
            init = msgspec.structs.replace(init, transport=self.transport_settings(node))
        try:
            worker = self._new_worker(init, node)
        except FunctionFailed:
            if self._locality and node:
                self.cluster.mark_down(node, f"a worker of {init.workflow}/{init.function} did not start there")
            raise
        worker.gfaas_node = node
        if self._locality and node:
            worker.name = f"{worker.name}@{node}"  # where each call ran shows in its record
        self.logstore.add(init.workflow, init.function, "", getattr(worker, "start_logs", ()), str(init.version))
        if init.dedup != "off":
            with self._admin_lock:
                self.dedup.started(worker, init.workflow, init.function, self._admins.get(node) or self._admin)
        return worker

    def _new_worker(self, init: Init, node: str) -> Any:
        if self.config.executor == "inproc":
            return InProcessWorker(init)
        if self.config.executor == "ray":
            from .ray_executor import RayWorker

            pin = {ray_resource(node): RAY_SLIVER} if self._locality and node else {}
            return RayWorker(init, num_cpus=self.config.ray_cpus_per_worker, resources=pin,
                             start_timeout=60.0 if pin else 300.0)
        netns = self._nodes[node].netns if node in self._nodes else ""
        return ProcessWorker(init, prefix=["ip", "netns", "exec", netns] if netns else None,
                             binder=self._binder(node))

    def _binder(self, node: str) -> Binder | None:
        """An attached connection to ``node``'s daemon for a new worker process, which serves all of its
        tasks there (bound per task; no connection, Hello or token per task). None: connect per task."""
        from ..dataplane.client import Binder

        admin = self._admins.get(node) or self._admin
        if admin is None:
            return None
        try:
            sock, welcome = admin.attach_socket()
        except GfaasError as exc:
            log.warning("no attached daemon connection for a new worker (it connects per task): %s", exc)
            return None
        return Binder(sock, welcome, self.transport_settings(node, "gfaas")["socket_path"])

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
            admin = self._admins.get(node)
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
        ident = self.tenant_identity(spec.name)
        init = Init(spec.name, function, spec.text, self.config.scale, self.transport_settings(node),
                    self.config.threads_per_worker, self.device_of(spec.name, function),
                    self.gpu_of(spec.name, function), ident.uid if ident else -1, ident.gid if ident else -1,
                    **self.dedup.init_fields(spec.name), gpu_passing=self.config.gpu_passing, code_dir=code_dir,
                    version=version)
        pool = FunctionPool(self, pool_key(spec.name, version, function), node, init,
                            f.scaling or self.default_scaling(), res, self.gpu_of(spec.name, function),
                            self.config.max_queue, self.config.scale_tick_s)
        p = self.config.placement
        pool.locality = self._locality
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
                others = [p for p in self._pools.values() if p is not pool and p.node == node]
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
                raise NotFound(f"no workflow {workflow!r} is deployed; deployed: {sorted(self._specs)}")
            pools = {f.name: self._pools.get(pool_key(workflow, cur.number, f.name)) for f in cur.spec.functions}
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
                with self._lock:
                    self._restore_gpus(spec.name, prior)
                if stored is not None and isinstance(exc, FunctionFailed):
                    raise CodePackageError(f"workflow {spec.name!r} (code {stored.digest[:12]}): {exc}; a handler "
                                           "names module:function of a module inside the package") from None
                raise
            with self._lock:
                old = self._versions.add(WorkflowVersion(number, spec, stored, note=note))
                self._specs[spec.name] = spec
                for p in pools:
                    self._pools[p.key] = p
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

        def busy() -> bool:
            with self._lock:
                return any(i.spec.name == workflow and i.version == version and i.result is None
                           for i in self._invs.values())

        def drain() -> None:
            deadline = time.monotonic() + self.config.drain_timeout_s
            while busy() and time.monotonic() < deadline and not self._closed:
                time.sleep(0.02)
            with self._lock:
                pools = [p for key, p in self._pools.items() if key.startswith(prefix)]
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
            if self._specs.pop(workflow, None) is None:
                raise NotFound(f"no workflow {workflow!r} is deployed; deployed: {sorted(self._specs)}")
            self._gpus.pop(workflow, None)
            self._versions.drop(workflow)
            pools = [p for key, p in self._pools.items() if key.startswith((f"{workflow}/", f"{workflow}@"))]
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
            p.close()  # joins its dispatch threads (a running task ends first) and stops its workers
        with self._lock:
            for p in pools:
                if self._pools.get(p.key) is p:
                    del self._pools[p.key]
                while p.queue:  # queued tasks never run: they no longer count against their invocation
                    inv, fn, _ = p.queue.popleft()
                    p.left += 1
                    inv.queued.pop(fn, None)
                    inv.running -= 1
                    self._maybe_release(inv)
            for inv in [i for i in self._invs.values() if i.spec.name == workflow and i.result is None
                        and (version is None or i.version == version)]:
                inv.running += 1  # _fail_locked counts one task as ending
                self._fail_locked(inv, reason)
        self.queues_changed()

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
        self._gpus[spec.name] = place_gpu_functions(spec, topo, free, _measured_sizes(spec))  # type: ignore[arg-type]
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
            admin = self._admins.get(node)
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

                placed.update(place_gpu_functions(spec, topo, names, _measured_sizes(spec)))
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
        admin = self._admins.get(self.node_of(workflow, function))
        if k is None or admin is None or admin.device_kind != "cuda" or k not in admin.devices:
            return "cpu"
        if self.config.executor == "ray":
            # A Ray actor sees only the GPUs Ray assigned it (CUDA_VISIBLE_DEVICES), none without a
            # num_gpus request: GPU placement under Ray is issue 20's; until then it computes on the CPU.
            log.warning("%s/%s: the ray executor runs GPU functions on the CPU (no GPU requests yet)",
                        workflow, function)
            return "cpu"
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
        self._spec(workflow)  # NotFound for an unknown workflow
        with self._lock:
            return dict(self._gpus.get(workflow, {}))

    def workflows(self) -> list[str]:
        with self._lock:
            return sorted(self._specs)

    def describe(self, workflow: str) -> dict[str, Any]:
        return self._spec(workflow).describe()

    def submit(self, workflow: str, inputs: Mapping[str, np.ndarray] | None = None, seed: int | None = None,
               transport: str | None = None, deadline_s: float | None = None) -> str:
        """Start an invocation (:meth:`RuntimeAPI.submit`). ``deadline_s``: seconds from now within which
        its functions must start: a function still queued then is not run (the invocation fails as
        expired, freeing the worker for work someone still waits for), and a submit whose first
        functions' queues could not start it in time is refused at once with ``Overloaded``."""
        if deadline_s is not None and not deadline_s > 0:
            raise SpecError(f"deadline_s={deadline_s!r}: give seconds > 0, or None for no deadline")
        with self._lock:
            current = self._versions.current(workflow)
        if current is None:
            raise NotFound(f"no workflow {workflow!r} is deployed; deployed: {self.workflows()}")
        spec, version = current.spec, current.number
        kind = transport or self.config.transport
        if kind not in ("gfaas", "redis"):
            raise ConfigError(f"transport {kind!r} is not 'gfaas' or 'redis'")
        arrays = self._inputs(spec, inputs, seed)
        if kind == "redis":
            self._ensure_redis()
        inv_id = secrets.token_hex(16)  # the data plane's invocation ID too: 128 random bits
        tokens: dict[str, str] = {}
        if kind == "gfaas":
            tokens = self._open_everywhere(spec.name, [f.name for f in spec.functions] + [GATEWAY], inv_id)
        inv = _Invocation(inv_id, spec, DagState(spec), time.perf_counter(), tokens, kind, version=version,
                          deadline=None if deadline_s is None else time.monotonic() + deadline_s)
        with self._lock:
            self._invs[inv_id] = inv
            drive = self.drives.input_drive(self._seq)
            self._seq += 1
        inv.homes.update(((INPUT, name), drive) for name in arrays)
        try:
            t0 = time.perf_counter()
            t = self._gateway_transport(inv)
            try:
                for name, arr in arrays.items():
                    readers = spec.readers(INPUT, name)
                    if readers:
                        inv.refs[(INPUT, name)] = t.put(arr, readers)
            finally:
                t.close()
            inv.host_s += time.perf_counter() - t0
            with self._lock:
                ready, skipped = inv.dag.start()
                complete = self._note(inv, skipped)
            self._schedule(inv, ready, complete)
        except Exception as exc:
            self._fail(inv, f"could not start: {exc}")
            if isinstance(exc, Overloaded):
                raise
        return inv_id

    def _open_everywhere(self, workflow: str, functions: list[str], inv_id: str) -> dict[str, str]:
        """Open the invocation on every node (that is up) with the same tokens: drawn by the first node,
        or, with a cluster key, derived from it (each node on another machine derives its own)."""
        key = self.cluster.key
        # Before the lock: a node due for a probe is probed here, on an admin connection (under the lock).
        down = {name for name in self._admins if not self.cluster.up(name)} if len(self._admins) > 1 else set()
        with self._admin_lock:
            if key is None:
                tokens: dict[str, str] = self._admin.open_invocation(workflow, functions, inv_id).tokens
            else:
                tokens = key.function_tokens(inv_id, functions)
                self._admin.open_invocation(workflow, functions, inv_id, tokens)
            for name, admin in self._admins.items():
                if admin is self._admin or name in down:
                    continue
                try:  # (a node on another machine is sent no tokens: PeerAdmin drops them, it derives its own)
                    admin.open_invocation(workflow, functions, inv_id, tokens)
                except (RemoteError, DaemonUnavailable) as exc:
                    if not self._locality:
                        raise
                    self.cluster.mark_down(name, str(exc))  # its workers get no calls of this invocation
        return tokens

    # -- locality across nodes (runtime.cluster, policy.locality)
    def function_nodes(self, pool: FunctionPool) -> list[str]:
        """The nodes a new worker of ``pool`` may start on now: its placed node, or with ``locality``
        every node that is up (and, under Ray, has a Ray node beside it)."""
        if not self._locality or pool.pinned:
            return [pool.node]
        nodes = [n for n in self._nodes if self.cluster.up(n)]
        if self.config.executor == "ray":
            from .ray_executor import _ray

            ray_nodes = self.cluster.ray_nodes(_ray(), nodes)
            nodes = [n for n in nodes if n in ray_nodes]
        return nodes

    def slot_node(self, pool: FunctionPool, waiting: list[str | None], workers: dict[str, int]) -> str:
        """Where ``pool``'s next worker starts: among :meth:`function_nodes`, the one the waiting calls
        prefer most (``waiting``: each queued call's preferred node), then the one with fewest workers."""
        cands = self.function_nodes(pool)
        if not cands:
            raise FunctionFailed(f"no node can run {pool.key} now: every node is down or has no Ray node "
                                 f"(nodes: {sorted(self._nodes)}); start `gfaas node start --join ... --ray-address ...`")
        weights: dict[str, int] = {}
        for n in waiting:
            if n is not None:
                weights[n] = weights.get(n, 0) + 1
        return choose_node(cands, weights, workers)

    def _note_preference(self, inv: _Invocation, fn: str) -> None:
        """The node holding most of ``fn``'s inputs, per the global directory (policy.locality)."""
        f = inv.spec.function(fn)
        refs = [inv.refs.get((i.source, i.output), "") for i in f.inputs]
        held = self.cluster.input_bytes(refs)
        if held:
            inv.prefer[fn] = choose_node(sorted(held), held)

    def _probe(self, node: str) -> None:
        with self._admin_lock:
            self._admins[node].snapshot()

    def _check_node(self, node: str) -> None:
        """A worker on ``node`` died: if its daemon does not answer either, leave the node out."""
        admin = self._admins.get(node)
        if admin is None or admin is self._admin:
            return
        try:
            with self._admin_lock:
                admin.snapshot()
        except GfaasError as exc:
            self.cluster.mark_down(node, f"its daemon does not answer ({exc})")

    def status(self, invocation_id: str) -> str:
        return self._inv(invocation_id).status

    def result(self, invocation_id: str, timeout: float | None = None) -> InvocationResult:
        inv = self._inv(invocation_id)
        if not inv.done.wait(timeout):
            raise TimeoutError(f"invocation {invocation_id} still {inv.status} after {timeout} s")
        assert inv.result is not None
        return inv.result

    def add_done_callback(self, invocation_id: str, callback: Callable[[InvocationResult], None]) -> None:
        """Call ``callback(result)`` once the invocation has finished (at once if it has), on the
        thread that finishes it: keep it short and non-blocking (the gateway wakes an asyncio future
        with it, so no thread waits per request). ``NotFound`` for unknown IDs."""
        inv = self._inv(invocation_id)
        with self._lock:
            if inv.result is None:
                inv.callbacks.append(callback)
                return
            res = inv.result
        callback(res)

    def invoke(self, workflow: str, inputs: Mapping[str, np.ndarray] | None = None, seed: int | None = None,
               timeout: float | None = None, transport: str | None = None) -> InvocationResult:
        """Submit and wait: the synchronous call."""
        return self.result(self.submit(workflow, inputs, seed, transport), timeout)

    def node_stats(self) -> dict[str, dict[str, Any]]:
        """Each node daemon's ``Admin.stats()``, by node name."""
        with self._admin_lock:
            return {name: admin.stats() for name, admin in self._admins.items()}

    def node_snapshots(self) -> list[dict[str, Any]]:
        """Each node daemon's live figures (``Admin.snapshot()``: counters only, cheap enough to poll),
        in the order of the runtime's nodes; each carries its ``node_id`` and the runtime's ``node`` name."""
        with self._admin_lock:
            return [{**admin.snapshot(), "node": name} for name, admin in self._admins.items()]

    def node_object(self, node: str, ref: Any) -> dict[str, Any]:
        """``Admin.object_info(ref)`` on ``node`` (the runtime's name for it, or the daemon's node_id): size, tier, producer, consumers and age of one object.
        ``NotFound`` for a node the runtime does not use or an object the node does not hold;
        ``InvalidDataRef`` for a ``ref`` that names no object."""
        admin = self._admins.get(node) or next((a for a in self._admins.values() if a.node_id == node), None)
        if admin is None:
            raise NotFound(f"no node {node!r} is used by this runtime; its nodes: {sorted(self._admins)}")
        with self._admin_lock:
            out: dict[str, Any] = admin.object_info(ref)
        return out

    def memory_report(self) -> dict[str, Any]:
        """What page merging saves now (``RuntimeConfig.dedup``): each live worker's RSS, PSS and
        KSM-merged bytes, the shared store's files and the copies they save, and each node's merge
        controller report (``gfaas dedup status``)."""
        workers = [asdict(w) for w in self.dedup.memory()]
        nodes: dict[str, Any] = {}
        if self.dedup.mode in ("merge", "on"):
            with self._admin_lock:
                for name, admin in self._admins.items():
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

    def queue_depths(self) -> dict[str, int]:
        with self._lock:
            pools = list(self._pools.values())
        return {p.key: len(p.queue) for p in pools}

    def queue_positions(self, invocation_id: str) -> dict[str, int]:
        """Where this invocation waits: function -> requests ahead of it in that function's queue.

        This is what queue-aware eviction reads: an object whose consumers are far back can go first.
        """
        inv = self._inv(invocation_id)
        out = {}
        for f in inv.spec.functions:
            pool = self._pools.get(pool_key(inv.spec.name, inv.version, f.name))
            pos = pool.position(invocation_id) if pool is not None else None
            if pos is not None:
                out[f.name] = pos
        return out

    def send_queue_hints(self, invocation_id: str | None = None) -> int:
        """Tell every node daemon now where this invocation's (or, with None, every open gfaas
        invocation's) functions wait, for queue-aware eviction (``Admin.queue_state``): queued
        functions by their place in their queue, running ones at 0, finished or skipped ones as
        done. With ``queue_hints`` on (the default) the runtime does this by itself as queues
        change. Returns the invocations hinted."""
        if invocation_id is not None:
            ids = {self._inv(invocation_id).id}
        else:
            with self._lock:
                ids = {i.id for i in self._invs.values() if i.kind == "gfaas" and not i.ended}
        if self._hinter is not None:  # one round at a time, so an older state never arrives last
            return len(ids.intersection(self._hinter.flush(ids)))
        entries, heads = self._hint_batch(ids, set())
        with self._admin_lock:
            for admin in self._admins.values():
                admin.queue_state([QueueEntry(*e) for e in entries], heads)
        return len(entries)

    def _hint_batch(self, invocations: set[str], queues: set[str]) -> HintBatch:
        """The queue hints of ``invocations`` (those still open on the data plane) and the heads of
        ``queues`` and of the queues they wait in: O(what changed), never a pass over every queue."""
        with self._lock:
            snaps = [(inv.id, dict(inv.queued), dict(inv.dag.state))
                     for inv in (self._invs.get(i) for i in invocations)
                     if inv is not None and inv.kind == "gfaas" and not inv.ended]
            pools = self._pools
        entries = []
        queues = set(queues)
        for inv_id, queued, state in snaps:
            # "ready" and not in its queue: running now (or about to be queued), position 0 either way
            tickets = {f: t for f, t in queued.items() if state.get(f) == "ready"}
            running = [f for f, st in state.items() if st == "ready" and f not in tickets]
            done = sorted(f for f, st in state.items() if st in ("done", "skipped"))
            entries.append((inv_id, tickets, running, done))
            queues.update(q for q, _ in tickets.values())
        heads = {q: pool.left for q in queues if (pool := pools.get(q)) is not None}
        return entries, heads

    def _send_hints(self, batch: HintBatch) -> None:
        """The hinter's round: one ``QueueState`` per node, on the hinter's own connections."""
        entries = [QueueEntry(*e) for e in batch[0]]
        for node in list(self._nodes):
            if not self.cluster.up(node):
                continue
            try:
                self._own_admin(self._hint_admins, node).queue_state(entries, batch[1])
            except Exception:
                stale = self._hint_admins.pop(node, None)
                if stale is not None:  # perhaps broken mid-call: a fresh connection next round
                    stale.close()
                raise

    def close(self) -> None:
        self._closed = True
        if getattr(self, "_autoscaler", None) is not None:
            self._autoscaler.close()
        if self._hinter is not None:
            self._hinter.close()
            self._hinter = None
        for admin in getattr(self, "_hint_admins", {}).values():
            admin.close()
        for p in list(self._pools.values()):
            p.close()
        self._pools.clear()
        if getattr(self, "_ender_thread", None) is not None:
            self._stop_ender()
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

    # -- internals
    def _spec(self, workflow: str) -> WorkflowSpec:
        with self._lock:
            spec = self._specs.get(workflow)
        if spec is None:
            raise NotFound(f"no workflow {workflow!r} is deployed; deployed: {self.workflows()}")
        return spec

    def _inv(self, invocation_id: str) -> _Invocation:
        with self._lock:
            inv = self._invs.get(invocation_id)
        if inv is None:
            raise NotFound(f"no invocation {invocation_id!r} is known here (finished ones are kept for a while)")
        return inv

    def _inputs(self, spec: WorkflowSpec, inputs: Mapping[str, np.ndarray] | None,
                seed: int | None) -> dict[str, np.ndarray]:
        if (inputs is None) == (seed is None):
            raise SpecError("give either inputs or a seed for the workflow's input generator, not both or neither")
        if inputs is None:
            if self._input_generator is None:
                raise SpecError(f"workflow {spec.name!r} has no input generator here; pass inputs")
            inputs = self._input_generator(spec.name, int(seed or 0), self.config.scale)
        diff = name_diff(spec.inputs, inputs, "unknown")
        if diff:
            raise SpecError(f"workflow {spec.name!r} takes inputs {sorted(spec.inputs)}; "
                            f"got {sorted(inputs)}{diff}")
        out = {}
        for name, value in inputs.items():
            arr = np.asarray(value)
            spec.inputs[name].check(arr, f"workflow {spec.name!r} input {name!r}")
            out[name] = arr
        return out

    def _gateway_transport(self, inv: _Invocation) -> Transport:
        """The platform's side of an invocation (its request inputs, its results): on the data plane,
        a long-lived connection from the pool bound to the invocation's gateway credentials."""
        if inv.kind == "gfaas" and self._gateway_pool is not None:
            return self._gateway_pool.transport(inv.tokens.get(GATEWAY, ""))
        cfg = TransportConfig(**self.transport_settings("", inv.kind))  # type: ignore[arg-type]
        return open_transport(cfg, inv.id, GATEWAY, inv.tokens.get(GATEWAY, ""))

    def _note(self, inv: _Invocation, skipped: list[str]) -> bool:
        """Record skips (under the lock); True for the one caller that must complete the invocation."""
        for fn in skipped:
            inv.records[fn] = FunctionRecord(fn, skipped=True)
        if inv.dag.complete and not inv.completing:
            inv.completing = True
            return True
        return False

    def _schedule(self, inv: _Invocation, ready: list[str], complete: bool) -> None:
        for fn in ready:
            with self._lock:
                inv.running += 1
                inv.enqueued[fn] = time.perf_counter()
            try:
                pool = self._pools.get(pool_key(inv.spec.name, inv.version, fn))
                if pool is None:  # undeployed while the invocation ran
                    raise NotFound(f"workflow {inv.spec.name!r} was undeployed")
                if self._locality and inv.kind == "gfaas":
                    self._note_preference(inv, fn)
                pool.submit(inv, fn)
            except (Overloaded, NotFound):
                with self._lock:
                    inv.running -= 1
                raise
        if complete:
            self._complete(inv)

    def run_task(self, inv: _Invocation, fn: str, worker: Any, pool: FunctionPool, cold_start_s: float = 0.0) -> None:
        started = time.perf_counter()
        inv.status = "running"
        f = inv.spec.function(fn)
        inputs = {i.name: inv.refs[(i.source, i.output)] for i in f.inputs}
        consumers: dict[str, list[str]] = {}
        for out in f.outputs:
            readers = inv.spec.readers(fn, out)
            if (fn, out) in inv.spec.outputs.values():
                readers.append(GATEWAY)
            if readers:
                consumers[out] = readers
        budget = input_deadline(0.0, pool.compute_s) if pool.compute_s > 0 else 0.0
        # The drive of the first input: where a marked function runs, and where a function's outputs live.
        home = inv.homes.get((f.inputs[0].source, f.inputs[0].output), -1)
        where = self.drives.claim(home) if f.accelerator else Decision("", home)
        node = getattr(worker, "gfaas_node", "") or pool.node
        task = Task(inv.id, inv.tokens.get(fn, ""), inputs, [i.name for i in f.inputs if i.from_workflow], consumers,
                    self.transport_settings(node, inv.kind), deadline_s=budget, accel=where.preset)
        try:
            reply = worker.run(task, f.timeout_s or self.config.function_timeout_s)
        except WorkerDied as exc:
            log.warning("%s; replacing it", exc)
            if self._locality and not isinstance(exc, TaskTimedOut):
                self._check_node(node)
            pool.replace_dead(worker)
            kept = self.logstore.read(inv.spec.name, fn, inv.id, limit=50)
            self.failed(inv, fn, str(exc), Failure(fn, type(exc).__name__, "", failure_lines(kept, inv.id)))
            return
        finally:
            self.drives.release(where)
        recs = self.logstore.add(inv.spec.name, fn, inv.id, reply.logs, str(inv.version)) if reply.logs else []
        if isinstance(reply, Failed):
            if self._locality and reply.error in ("DaemonUnavailable", "RemoteError"):
                self._check_node(node)  # its node's daemon is gone: no more calls there
            self.failed(inv, fn, reply.message, Failure(fn, reply.error, reply.trace, failure_lines(recs, inv.id)))
            return
        assert isinstance(reply, Done)
        if reply.hinted_bytes:  # ctx.merge during the call
            with self._admin_lock:
                self.dedup.hinted(worker, inv.spec.name, fn, self._admins.get(node) or self._admin,
                                  reply.hinted_bytes)
        if reply.compute_s > 0:
            pool.compute_s = reply.compute_s
        rec = FunctionRecord(fn, worker.name, started - inv.enqueued[fn], reply.fn_get_s, reply.compute_s,
                             reply.put_s, slo_s=slo_for(reply.compute_s) if reply.compute_s > 0 else 0.0,
                             deadline_s=input_deadline(0.0, reply.compute_s), placement=where.placement,
                             drive=where.drive if f.accelerator else -1, accel_s=reply.accel_s,
                             cold_start_s=cold_start_s)
        with self._lock:
            inv.records[fn] = rec
            inv.host_s += reply.host_get_s + reply.host_put_s
            for out, ref in reply.outputs.items():
                inv.refs[(fn, out)] = ref
                inv.homes[(fn, out)] = where.drive if where.placement == DSCS else home
            inv.running -= 1
            if inv.status == "failed":
                self._maybe_release(inv)
                return
            try:
                ready, skipped = inv.dag.finished(fn, reply.scalars)
            except FunctionFailed as exc:
                inv.running += 1  # _fail_locked counts one task as ending
                self._fail_locked(inv, str(exc))
                return
            complete = self._note(inv, skipped)
        self.queues_changed(inv)  # fn is done (queue hints)
        try:
            self._schedule(inv, ready, complete)
        except (Overloaded, NotFound) as exc:
            self._fail(inv, str(exc))

    def failed(self, inv: _Invocation, fn: str, message: str, failure: Failure | None = None) -> None:
        with self._lock:
            if failure is not None and inv.result is None and inv.failure is None:
                inv.failure = failure
            self._fail_locked(inv, message)

    def dropped(self, inv: _Invocation, fn: str) -> None:
        with self._lock:
            inv.running -= 1
            self._maybe_release(inv)

    def _fail(self, inv: _Invocation, message: str) -> None:
        with self._lock:
            inv.running += 1
            self._fail_locked(inv, message)

    def _fail_locked(self, inv: _Invocation, message: str) -> None:
        inv.running -= 1
        if inv.status != "failed" and inv.result is None:
            inv.status, inv.error = "failed", message
            self._set_result(inv, {})
            log.info("invocation %s failed: %s", inv.id, message)
        self._maybe_release(inv)

    def _maybe_release(self, inv: _Invocation) -> None:
        if inv.running == 0:
            self._end_data(inv)

    def _complete(self, inv: _Invocation) -> None:
        outputs: dict[str, np.ndarray] = {}
        try:
            t0 = time.perf_counter()
            t = self._gateway_transport(inv)
            try:
                for name, (fn, out) in inv.spec.outputs.items():
                    ref = inv.refs.get((fn, out))
                    if ref is not None:
                        outputs[name] = np.array(t.get(ref), copy=True)
            finally:
                t.close()
            inv.host_s += time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - reported as the invocation's failure
            with self._lock:
                inv.running += 1
                self._fail_locked(inv, f"collecting the outputs failed: {exc}")
            return
        with self._lock:
            if inv.result is None:
                inv.status = "done"
                self._set_result(inv, outputs)
            self._maybe_release(inv)

    def _set_result(self, inv: _Invocation, outputs: dict[str, np.ndarray]) -> None:
        recs = tuple(inv.records.get(f.name, FunctionRecord(f.name, skipped=True)) for f in inv.spec.functions)
        ran = [r for r in recs if not r.skipped]
        b = Breakdown(queue_s=sum(r.queued_s for r in ran), host_pass_s=inv.host_s,
                      fn_pass_s=sum(r.get_s + r.put_s for r in ran), compute_s=sum(r.compute_s for r in ran),
                      total_s=time.perf_counter() - inv.submitted, accel_s=sum(r.accel_s for r in ran),
                      cold_start_s=sum(r.cold_start_s for r in ran))
        scalars = {f"{fn}.{k}": v for fn, vals in inv.dag.scalars.items() for k, v in vals.items()}
        inv.result = InvocationResult(inv.id, inv.spec.name, inv.status, outputs, scalars, inv.error, b, recs,
                                      inv.failure if inv.status == "failed" else None)
        inv.done.set()
        for cb in inv.callbacks:  # each waiter is told of its own invocation only (no broadcast)
            try:
                cb(inv.result)
            except Exception:  # noqa: BLE001 - a waiter's failure must not fail the invocation
                log.exception("a done-callback of invocation %s failed", inv.id)
        inv.callbacks.clear()
        self._finished.append(inv.id)
        while len(self._finished) > 10_000:  # keep recent results fetchable, not all forever
            self._invs.pop(self._finished.popleft(), None)

    def _end_data(self, inv: _Invocation) -> None:
        """Free everything the invocation stored, once no task of it is in flight (called under the
        lock): handed to the ender thread, so the daemon round trips are off every caller's path and
        the lock is not held across them (the next submit waited for them: docs/performance.md)."""
        if inv.ended:
            return
        inv.ended = True
        with self._end_cv:
            self._ending.append(inv)
            self._end_cv.notify()

    def _ender(self) -> None:
        """Free what ended, in batches: one ``EndInvocations`` round trip per node for all the
        invocations that ended since the last one, on connections of this thread's own, so an end
        never waits behind a submit's open (or holds it up) on the shared ``_admin_lock``."""
        own: dict[str, Any] = {}  # node -> this thread's Admin connection
        try:
            while True:
                with self._end_cv:
                    while not self._ending and not self._ender_stop:
                        self._end_cv.wait()
                    if not self._ending:
                        return
                    batch = list(self._ending)
                    self._ending.clear()
                self._free(batch, own)
        finally:
            for admin in own.values():
                admin.close()

    def _stop_ender(self) -> None:
        """Free what is still pending, then stop the ender (before the node connections close)."""
        with self._end_cv:
            self._ender_stop = True
            self._end_cv.notify()
        self._ender_thread.join(30)

    def _own_admin(self, own: dict[str, Any], node: str) -> Any:
        """A background thread's own Admin connection to ``node`` (made on first use)."""
        admin = own.get(node)
        if admin is None:
            from ..dataplane.client import Admin

            n = self._nodes[node]
            admin = own[node] = Admin(n.socket_path, state_dir=n.state_dir or None) if n.state_dir or not n.address \
                else self._connect_admin(n)
        return admin

    def _free(self, invs: list[_Invocation], own: dict[str, Any]) -> None:
        ids = [inv.id for inv in invs if inv.kind == "gfaas"]
        if ids:
            for node in list(self._nodes):
                if not self.cluster.up(node):
                    continue  # a node that is down lost its objects; it is not waited for
                try:
                    self._own_admin(own, node).end_invocations(ids)
                except Exception:  # noqa: BLE001 - the results stand; leftovers go with the node
                    log.exception("could not free the data of %d invocations on node %s", len(ids), node)
                    stale = own.pop(node, None)
                    if stale is not None:  # perhaps broken mid-call: a fresh connection next time
                        stale.close()
        for inv in invs:
            if inv.kind == "gfaas":
                continue
            try:
                keys = [r.removeprefix("redis:").split("|")[0] for r in inv.refs.values()]
                if keys:
                    RedisTransport(TransportConfig("redis", redis_url=self._redis_url), inv.id, GATEWAY)._r.delete(*keys)
            except Exception:  # noqa: BLE001 - the result stands; leftovers go with the server
                log.exception("could not free the data of invocation %s", inv.id)


def runtime_config(**overrides: Any) -> RuntimeConfig:
    """``RuntimeConfig`` with overrides (a convenience for the CLI)."""
    return replace(RuntimeConfig(), **overrides)


def _rmtree_code(root: str) -> None:
    """Remove the runtime's code packages (their directories are read-only)."""
    from pathlib import Path

    from .codepkg import remove_tree

    remove_tree(Path(root))


def _measured_sizes(spec: WorkflowSpec) -> Any:
    """The measured edge sizes of a reference workflow (what the simulator places it by), else
    ``None``: declared shapes stand in (:func:`~gfaas.runtime.placement.function_edges`)."""
    from .. import workflows as reference

    if spec.name not in reference.names():
        return None
    from ..workflows.measured import edge_sizes

    return edge_sizes().get(spec.name)
