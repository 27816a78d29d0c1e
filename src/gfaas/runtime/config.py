"""How the local runtime runs: :class:`RuntimeConfig`, and :class:`NodeEndpoint` for daemons it is given."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..errors import ConfigError
from ..policy.autoscale import keep_alive_policy
from ..policy.polling import DEFAULT_POLL_US, MAX_POLL_US
from ..units import GiB
from .cluster import check_join
from .dedup import check_mode as check_dedup_mode
from .gpus import check_gpus
from .heap import HEAP_MODES
from .sandbox import sandbox_enabled
from .spec import MAX_TIMEOUT_S

MAX_INLINE = 512 * 1024  # RuntimeConfig.inline_max_bytes: a task or reply message holds at most 1 MiB


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
        inline_max_bytes: arrays up to this size pass between the functions of a gfaas invocation
            inside the runtime's task and reply messages rather than through the node's data plane
            (request inputs and results too); an invocation of only such values costs the node daemon
            nothing. Larger ones stay zero-copy references. 0: everything through the data plane.
        fuse_chains: run a function that reads from one other function alone, and is its only
            reader, in that function's warm worker right after it (:mod:`gfaas.policy.fusion`: both
            CPU functions of the workflow with no model, accelerator or ``scaling:`` of their own, on
            the same node with the same reservation), when what passes between them is carried as
            values: one round trip for the pair, not two. False: every function in its own workers.
        fork_server: start process workers by forking a template process that has imported what every
            worker imports (:mod:`gfaas.runtime.forkserver`): a start costs a fork, not an
            interpreter's start-up. False: each worker is a fresh interpreter. Workers in a network
            namespace (emulated cluster nodes) are always fresh interpreters.
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
        poll_us: how long (microseconds) a warm worker asks for its next task, and whoever reads the
            reply of a lone invocation (the caller of ``invoke`` itself, else the invoker's thread),
            without blocking before they sleep (:mod:`gfaas.policy.polling`:
            a sleeping process costs a wake-up of tens of microseconds on a virtual machine; polling
            costs CPU while it lasts). 0: always sleep; never on a single core.
        worker_heap: ``"reuse"`` (default): a warm worker keeps the memory its handlers free and
            serves the next call's large arrays from it, with no page faults (:mod:`gfaas.runtime.heap`;
            an idle worker then holds about its largest call's working set); ``"release"``: the C
            library's behaviour, every block over 32 MiB mapped afresh and given back when freed.
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
    inline_max_bytes: int = 64 * 1024
    fuse_chains: bool = True
    fork_server: bool = True
    log_dir: str = ""
    cluster_key_file: str = ""
    join: str = ""
    redis_password_file: str = ""
    transfer_host: str = ""
    locality: bool | None = None
    poll_us: int = DEFAULT_POLL_US
    worker_heap: Literal["reuse", "release"] = "reuse"

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
        if not isinstance(self.fuse_chains, bool):
            raise ConfigError(f"fuse_chains={self.fuse_chains!r} must be true or false")
        if isinstance(self.inline_max_bytes, bool) or not isinstance(self.inline_max_bytes, int) \
                or not 0 <= self.inline_max_bytes <= MAX_INLINE:
            raise ConfigError(f"inline_max_bytes={self.inline_max_bytes!r} must be a whole number of bytes in "
                              f"[0, {MAX_INLINE}] (0: every value through the data plane)")
        if isinstance(self.poll_us, bool) or not isinstance(self.poll_us, int) or not 0 <= self.poll_us <= MAX_POLL_US:
            raise ConfigError(f"poll_us={self.poll_us!r} must be a whole number of microseconds in [0, {MAX_POLL_US}] "
                              "(0: never poll)")
        if self.worker_heap not in HEAP_MODES:
            raise ConfigError(f"worker_heap={self.worker_heap!r} is not one of {', '.join(map(repr, HEAP_MODES))}")
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
