"""Simulated model scale-out at paper scale: PipeCast and its baselines (seed 002 §4, §7).

A :class:`Fleet` is a cluster of GPU nodes serving one LLM. Scaling out moves the model's blocks
to new nodes with a :class:`Multicast` that follows a plan of :mod:`gfaas.policy.multicast` (the
same plan the real executor follows) as fluid flows on :class:`~gfaas.sim.network.Network`; block
arrivals drive the same :class:`~gfaas.policy.pipelines.PipelinePlanner` as the real executor, so
that partly loaded nodes serve through execution pipelines and switch to local serving once they
hold the whole model.

**The transfer rule.** A node has one send port and one receive port (its NIC), as in the
single-port model of the plans. A transfer of the plan starts as soon as (1) its sender holds the
block, (2) the sender finished its earlier sends of the plan and (3) the receiver finished its
earlier receives; steps are an order, not a clock. Ports never share a link, so on an idle uniform
cluster every block takes ``block bytes / link rate`` and a plan of ``S`` steps takes at most
``S`` block times (exactly ``S`` when its critical path has ``S`` transfers, as the binomial
pipeline's does). Blocks arrive at each node in the plan's order.

**Serving** (one stated model, the same for every system). An *instance* is a local replica (one
node) or an execution pipeline (several nodes, each running a consecutive range of blocks). A
node's GPUs act as one tensor-parallel server (:class:`NodeGpu`, FIFO). Requests are batched per
iteration (continuous batching: at most :data:`MAX_BATCH` sequences and
:data:`MAX_PREFILL_TOKENS` new prompt tokens per batch; a request's prompt is never chunked).
One iteration on a stage holding a fraction ``f`` of the model takes the roofline maximum of

* memory: ``f * (weight bytes + KV bytes of the decoding sequences) / (GPUs * HBM rate * HBM_EFF)``;
* compute: ``f * 2 * params * (prompt tokens + decoding sequences) / (GPUs * peak FLOP/s * MFU)``.

2D pipelining (seed 002 Fig. 6a): each stage works on a different batch, so a pipeline of ``S``
stages keeps up to ``S`` batches in flight. An instance admits ``MAX_BATCH * B / (blocks of its
largest stage)`` requests, i.e. in proportion to its throughput; the dispatcher sends the oldest
waiting request to the instance with the most room. Between stages
the batch's activations (``dim * 2`` bytes per token) travel over the network after a fixed
:data:`HOP_OVERHEAD_S`. When a pipeline is retired because one of its nodes went local, its
started requests continue on that node after their KV caches (the other stages' share) have
crossed the network (batches in flight finish first); requests not started yet go back to the
dispatcher. The prefill iteration yields the first token (TTFT).

**Baselines** (:data:`SYSTEMS`): ``gfaas`` (binomial multicast with k-way transmission and
execution pipelines), ``faasnet`` (binary-tree multicast, serve once local), ``nccl`` (NCCL's
broadcast is a pipelined ring: modelled as the ``chain`` scheme at block granularity, serve once
local), ``serverlessllm`` (each new node loads from its local SSD at :data:`SSD_GBPS`, or from its
host-memory cache over PCIe on a hit, then serves) and ``ideal`` (loads take no time).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..policy.multicast import Schedule
from ..policy.multicast import plan as plan_multicast
from ..policy.pipelines import Pipeline, PipelinePlanner
from ..topology import GB, Topology
from .kernel import Simulator
from .network import Network

# ---- the models -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlmSpec:
    """A Llama-2 model's sizes (Touvron et al. 2023, Table 1 and the released configs)."""

    name: str
    params: float
    layers: int
    dim: int
    kv_dim: int  # KV heads x head width (70B uses grouped-query attention: 8 x 128)
    dtype_bytes: int = 2  # fp16, as seed 002 serves them

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_dim * self.dtype_bytes

    @property
    def activation_bytes_per_token(self) -> float:
        return self.dim * self.dtype_bytes


LLAMA2: dict[str, LlmSpec] = {
    "7b": LlmSpec("llama-2-7b", 6.74e9, 32, 4096, 4096),
    "13b": LlmSpec("llama-2-13b", 13.02e9, 40, 5120, 5120),
    "70b": LlmSpec("llama-2-70b", 68.98e9, 80, 8192, 1024),
}


@dataclass(frozen=True)
class GpuSpec:
    """Per-GPU serving rates. H800 SXM (NVIDIA datasheet): 3.35 TB/s HBM3, 989 TFLOP/s dense FP16
    (the H100 SXM's; the H800 cuts NVLink only). The efficiencies are our assumptions: decoding
    typically reaches ~80% of HBM bandwidth and prefill ~50% of peak FLOP/s in vLLM-class engines."""

    name: str = "H800"
    hbm_gbps: float = 3350.0
    tflops: float = 989.0
    hbm_eff: float = 0.8
    mfu: float = 0.5


H800 = GpuSpec()

#: Sequences per batch (vLLM-like continuous batching; our assumption).
MAX_BATCH = 32
#: New prompt tokens per batch (prompts are not chunked; a longer one goes alone).
MAX_PREFILL_TOKENS = 8192
#: Fixed cost of handing a batch to the next pipeline stage (send/recv set-up and synchronisation
#: of a Python-driven pipeline). Seed 002 §7.3 reports this overhead but not its size: assumed.
HOP_OVERHEAD_S = 1e-3
#: Local NVMe SSD read rate for ServerlessLLM (one PCIe 4.0 NVMe drive, ~6-7 GB/s sequential in
#: vendor datasheets; ServerlessLLM's loader runs near the drive's rate). Seed 002's Table 1 does
#: not give a usable SSD rate (its columns are garbled in our copy): assumed.
SSD_GBPS = 6.0
#: Blocks a model is cut into (seed 002 picks ``b`` by offline profiling and does not print it).
DEFAULT_BLOCKS = 16

SYSTEMS: tuple[str, ...] = ("gfaas", "faasnet", "nccl", "serverlessllm")
SCHEME_OF: dict[str, str] = {"gfaas": "binomial", "faasnet": "tree", "nccl": "chain"}


def block_bytes(model: LlmSpec, blocks: int) -> float:
    """Bytes of one block: the weights split evenly into ``blocks`` (whole layers in the real model;
    even here, which changes block sizes by at most one layer's share)."""
    if blocks < 1:
        raise ConfigError(f"blocks={blocks}: a model has at least 1 block")
    return model.weight_bytes / blocks


# ---- requests and serving ----------------------------------------------------------------------


@dataclass(eq=False)
class Request:
    id: int
    arrival: float
    prompt: int
    output: int
    generated: int = 0
    first_token: float = math.nan
    finished: float = math.nan
    # Recorded only, never read by the simulation: where a TTFT goes (docs/scaling.md).
    placed: float = math.nan  # first handed to an instance
    prefill_start: float = math.nan  # its prompt entered a batch

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def waited(self) -> float:
        """Seconds from arrival until its prefill batch started: for an instance, then in its queue."""
        return self.prefill_start - self.arrival

    @property
    def prefill(self) -> float:
        """Seconds from the start of its prefill batch to its first token (``waited + prefill == ttft``
        up to rounding)."""
        return self.first_token - self.prefill_start

    @property
    def context(self) -> int:
        return self.prompt + self.generated


class NodeGpu:
    """A node's GPUs as one FIFO server: ``run(seconds, done)`` queues a piece of work."""

    __slots__ = ("busy", "queue", "sim")

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.busy = False
        self.queue: deque[tuple[float, Callable[[], None]]] = deque()

    def run(self, seconds: float, done: Callable[[], None]) -> None:
        self.queue.append((seconds, done))
        if not self.busy:
            self._start()

    def _start(self) -> None:
        seconds, done = self.queue.popleft()
        self.busy = True
        self.sim.schedule(seconds, self._finish, done)

    def _finish(self, done: Callable[[], None]) -> None:
        self.busy = False
        if self.queue:
            self._start()
        done()


@dataclass(eq=False)
class _Batch:
    reqs: list[Request]
    prefill_tokens: int
    decoding: int
    kv_tokens: int


class Instance:
    """A serving instance: stages ``(node, first block, end block)`` in block order."""

    def __init__(self, fleet: Fleet, stages: Sequence[tuple[int, int, int]], pipeline: int | None = None) -> None:
        self.fleet = fleet
        self.stages = tuple(stages)
        self.pipeline = pipeline
        self.active: set[Request] = set()
        self.ready: deque[Request] = deque()
        self.free = [True] * len(self.stages)
        self.waiting: list[deque[_Batch]] = [deque() for _ in self.stages]
        self.closed = False
        self.successor: Instance | None = None
        self.in_flight = 0
        self.unstarted = 0  # prompt tokens admitted but not yet in a batch

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(s[0] for s in self.stages)

    @property
    def capacity(self) -> int:
        """Requests it admits: in proportion to its throughput, which its largest stage sets (a
        balanced pipeline of ``S`` stages runs ``S`` batches at once, each stage 1/S of the work)."""
        largest = max(stop - start for _, start, stop in self.stages)
        return max(1, round(MAX_BATCH * self.fleet.blocks / largest))

    @property
    def room(self) -> int:
        """Requests it takes now: none while a batch's worth of prompts already waits for it."""
        if self.closed or self.unstarted >= MAX_PREFILL_TOKENS:
            return 0
        return self.capacity - len(self.active)

    def admit(self, req: Request) -> None:
        self.active.add(req)
        self.ready.append(req)
        if not req.generated:
            self.unstarted += req.prompt
            if math.isnan(req.placed):
                req.placed = self.fleet.sim.now
        self._pump()

    def _pump(self) -> None:
        if self.closed or not self.free[0] or not self.ready:
            return
        reqs: list[Request] = []
        prefill = decoding = kv = 0
        while self.ready and len(reqs) < MAX_BATCH:
            r = self.ready[0]
            if r.generated == 0:
                if reqs and prefill + r.prompt > MAX_PREFILL_TOKENS:
                    break
                prefill += r.prompt
                self.unstarted -= r.prompt
                r.prefill_start = self.fleet.sim.now
            else:
                decoding += 1
                kv += r.context
            reqs.append(self.ready.popleft())
        self.in_flight += 1
        self._enter(0, _Batch(reqs, prefill, decoding, kv))

    def _enter(self, j: int, batch: _Batch) -> None:
        self.free[j] = False
        node, start, stop = self.stages[j]
        seconds = self.fleet.iteration_s(node, (stop - start) / self.fleet.blocks, batch)
        self.fleet.gpus[node].run(seconds, lambda: self._left(j, batch))

    def _left(self, j: int, batch: _Batch) -> None:
        self.free[j] = True
        if j + 1 < len(self.stages):
            tokens = batch.prefill_tokens + batch.decoding
            nbytes = tokens * self.fleet.model.activation_bytes_per_token
            src, dst = self.stages[j][0], self.stages[j + 1][0]
            self.fleet.sim.schedule(HOP_OVERHEAD_S, self.fleet.send, src, dst, nbytes,
                                    lambda: self._arrive(j + 1, batch))
        else:
            self._done(batch)
        if j == 0:
            self._pump()
            self.fleet.dispatch()
        elif self.waiting[j]:
            self._enter(j, self.waiting[j].popleft())

    def _arrive(self, j: int, batch: _Batch) -> None:
        if self.free[j]:
            self._enter(j, batch)
        else:
            self.waiting[j].append(batch)

    def _done(self, batch: _Batch) -> None:
        self.in_flight -= 1
        now = self.fleet.sim.now
        moving: list[Request] = []
        for r in batch.reqs:
            r.generated += 1
            self.fleet.tokens.append(now)
            if r.generated == 1:
                r.first_token = now
                self.fleet.processed.append((now, r.prompt + 1))
            else:
                self.fleet.processed.append((now, 1))
            if r.generated >= r.output:
                r.finished = now
                self.active.discard(r)
                self.fleet.completed += 1
            elif self.closed:
                self.active.discard(r)
                moving.append(r)
            else:
                self.ready.append(r)
        if moving:
            self._hand_over(moving)
        self.fleet.dispatch()
        self._pump()

    def retire(self, successor: Instance) -> None:
        """Stop taking batches; requests move to ``successor`` (KV caches cross the network)."""
        self.closed = True
        self.successor = successor
        moving = [r for r in self.ready if r.generated]
        fresh = [r for r in self.ready if not r.generated]
        self.ready.clear()
        self.unstarted = 0
        for r in (*moving, *fresh):
            self.active.discard(r)
        # Requests not started yet hold no KV cache: they go back to the dispatcher, first in line.
        self.fleet.waiting.extendleft(reversed(fresh))
        if moving:
            self._hand_over(moving)
        self.fleet.dispatch()

    def _hand_over(self, reqs: list[Request]) -> None:
        assert self.successor is not None
        succ = self.successor
        dst = succ.nodes[0]
        kv = sum(r.context for r in reqs) * self.fleet.model.kv_bytes_per_token
        flows = [(node, kv * (stop - start) / self.fleet.blocks) for node, start, stop in self.stages if node != dst]
        left = [len(flows)]

        def arrived() -> None:
            left[0] -= 1
            if left[0] == 0:
                for r in reqs:
                    succ.admit(r)

        if not flows:
            for r in reqs:
                succ.admit(r)
        for node, nbytes in flows:
            self.fleet.send(node, dst, nbytes, arrived)


# ---- multicast --------------------------------------------------------------------------------


class Multicast:
    """Moves blocks following ``schedule`` (plan ids ``i`` are fleet nodes ``members[i]``).

    ``on_blocks(plan_step, {plan node: [blocks]})`` is called once per instant with every block that
    arrived at that instant (so that the planner sees a step's arrivals together, as in
    :func:`gfaas.policy.pipelines.pipeline_changes`); ``arrivals[i]`` records ``(time, block)``.
    """

    def __init__(self, fleet: Fleet, schedule: Schedule, members: Sequence[int],
                 on_blocks: Callable[[int, dict[int, list[int]]], None] | None = None,
                 on_done: Callable[[], None] | None = None, from_host: frozenset[int] = frozenset()) -> None:
        if len(members) != schedule.nodes or len(set(members)) != len(members):
            raise ConfigError(f"a plan for {schedule.nodes} nodes needs as many distinct fleet nodes; got {list(members)}")
        self.fleet = fleet
        self.schedule = schedule
        self.members = tuple(members)
        self.on_blocks = on_blocks
        self.on_done = on_done
        self.from_host = from_host  # plan ids of sources that send from host memory (RDMA), not a GPU
        n = schedule.nodes
        self.sends: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]  # (step, dst, block)
        self.recvs: list[list[int]] = [[] for _ in range(n)]  # sender, in step order
        for t, step in enumerate(schedule.steps):
            for tr in step:
                self.sends[tr.src].append((t, tr.dst, tr.block))
                self.recvs[tr.dst].append(tr.src)
        self.held = [set(range(schedule.blocks)) if i < schedule.sources else set() for i in range(n)]
        self.next_send = [0] * n
        self.next_recv = [0] * n
        self.sending = [False] * n
        self.receiving = [False] * n
        self.arrivals: list[list[tuple[float, int]]] = [[] for _ in range(n)]
        self.left = schedule.num_transfers
        self.finished_at = math.nan
        self._pending: dict[int, list[int]] = {}
        self._pending_step = 0

    def start(self) -> None:
        if self.left == 0:
            self.finished_at = self.fleet.sim.now
            if self.on_done:
                self.fleet.sim.schedule(0.0, self.on_done)
            return
        for i in range(self.schedule.nodes):
            self._try(i)

    def _try(self, i: int) -> None:
        if self.sending[i] or self.next_send[i] >= len(self.sends[i]):
            return
        step, dst, block = self.sends[i][self.next_send[i]]
        if block not in self.held[i] or self.receiving[dst] or self.recvs[dst][self.next_recv[dst]] != i:
            return
        self.sending[i] = self.receiving[dst] = True
        self.fleet.send_block(self.members[i], self.members[dst], block, lambda: self._arrived(i, dst, block, step),
                              from_host=i in self.from_host)

    def _arrived(self, src: int, dst: int, block: int, step: int) -> None:
        now = self.fleet.sim.now
        self.sending[src] = self.receiving[dst] = False
        self.next_send[src] += 1
        self.next_recv[dst] += 1
        self.held[dst].add(block)
        self.arrivals[dst].append((now, block))
        self.left -= 1
        if not self._pending:
            self.fleet.sim.schedule(0.0, self._flush, priority=1)
        self._pending.setdefault(dst, []).append(block)
        self._pending_step = max(self._pending_step, step + 1)
        self._try(src)
        self._try(dst)
        if self.next_recv[dst] < len(self.recvs[dst]):
            self._try(self.recvs[dst][self.next_recv[dst]])

    def _flush(self) -> None:
        arrived, self._pending = self._pending, {}
        step, self._pending_step = self._pending_step, 0
        if self.on_blocks:
            self.on_blocks(step, arrived)
        if self.left == 0 and math.isnan(self.finished_at):
            self.finished_at = self.fleet.sim.now
            if self.on_done:
                self.on_done()


# ---- the fleet --------------------------------------------------------------------------------


@dataclass
class GpuInterval:
    node: int
    start: float
    end: float = math.nan


class Fleet:
    """GPU nodes of ``topology`` serving ``model`` under ``system``'s way of scaling out."""

    def __init__(self, topology: Topology, model: LlmSpec, system: str, *, blocks: int = DEFAULT_BLOCKS,
                 gpu: GpuSpec = H800, sim: Simulator | None = None) -> None:
        if system not in (*SYSTEMS, "ideal"):
            raise ConfigError(f"system={system!r} is unknown; pick one of {', '.join((*SYSTEMS, 'ideal'))}")
        self.topology = topology
        self.model = model
        self.system = system
        self.blocks = blocks
        self.block_bytes = block_bytes(model, blocks)
        self.gpu = gpu
        self.sim = sim or Simulator()
        self.net = Network(self.sim, topology)
        self.node_ids = topology.nodes
        self.node_gpus = [sorted(topology.of_kind("gpu", n), key=_gpu_index) for n in self.node_ids]
        if not all(self.node_gpus):
            raise ConfigError(f"topology {topology.name!r} has a node without GPUs; every node must hold one")
        self.gpus_per_node = len(self.node_gpus[0])
        need = model.weight_bytes / self.gpus_per_node
        mem = topology.device(self.node_gpus[0][0]).memory_bytes
        if mem and need > mem:
            raise ConfigError(f"{model.name} needs {need / GB:.0f} GB per GPU on {topology.name!r}, more than "
                              f"its {mem / GB:.0f} GB; use nodes with more GPUs (e.g. h800x4)")
        self.gpus = [NodeGpu(self.sim) for _ in self.node_ids]
        self.instances: list[Instance] = []
        self.local: dict[int, Instance] = {}
        self.waiting: deque[Request] = deque()
        self.tokens: list[float] = []  # when each generated token came out
        self.processed: list[tuple[float, int]] = []  # (when, prompt + generated tokens a batch finished)
        self.completed = 0
        self.intervals: list[GpuInterval] = []
        self._alloc: dict[int, GpuInterval] = {}
        self.hot_at: dict[int, float] = {}
        self.first_serving: dict[int, float] = {}
        self.host_cache_until: dict[int, float] = {}
        self.multicasts: list[Multicast] = []
        self.sending: dict[int, int] = {}  # node -> running multicasts it takes part in
        self.loading: set[int] = set()

    # ---- network helpers ------------------------------------------------------------------
    def route(self, a: str, b: str) -> list[str]:
        """GPU ``a`` to GPU ``b``: NVLink through the NVSwitch inside a node, GPUDirect RDMA
        (GPU, PCIe switch, NIC, fabric, NIC, PCIe switch, GPU) across nodes."""
        topo = self.topology
        da, db = topo.device(a), topo.device(b)
        if da.node == db.node:
            if topo.nvlink_gbps(a, b) > 0:
                sw = [x for x in topo.neighbours(a, "nvlink") if topo.device(x).kind == "nvswitch"]
                return [a, sw[0], b] if sw and topo.edge(a, b) is None else [a, b]
            return [a, _switch(topo, a), b]
        return [a, _switch(topo, a), self._nic(da.node, a), "fabric", self._nic(db.node, b), _switch(topo, b), b]

    def _nic(self, node: int, gpu: str) -> str:
        sw = _switch(self.topology, gpu)
        for nic in self.topology.nics_of(node):
            if self.topology.edge(sw, nic) is not None:
                return nic
        raise ConfigError(f"node {node} of {self.topology.name!r} has no NIC on {gpu}'s PCIe switch {sw}")

    def send(self, src: int, dst: int, nbytes: float, done: Callable[[], None]) -> None:
        """Bytes between two nodes' first GPUs (activations, KV caches)."""
        if src == dst:
            self.sim.schedule(0.0, done)
            return
        self.net.start(self.route(self.node_gpus[src][0], self.node_gpus[dst][0]), nbytes, done)

    def owner_gpu(self, node: int, block: int) -> str:
        """The GPU of ``node`` that runs ``block`` (consecutive blocks per GPU)."""
        return self.node_gpus[node][block * self.gpus_per_node // self.blocks]

    def send_block(self, src: int, dst: int, block: int, done: Callable[[], None], from_host: bool = False) -> None:
        hops = self.route(self.owner_gpu(src, block), self.owner_gpu(dst, block))
        if from_host:  # RDMA straight from the host-memory copy: host -> PCIe switch -> NIC -> ...
            hops = [self.topology.host_of(src), *hops[1:]]
        self.net.start(hops, self.block_bytes, done)

    # ---- serving ------------------------------------------------------------------------
    def iteration_s(self, node: int, frac: float, batch: _Batch) -> float:
        g, m = self.gpus_per_node, self.model
        mem = frac * (m.weight_bytes + batch.kv_tokens * m.kv_bytes_per_token) / (g * self.gpu.hbm_gbps * GB * self.gpu.hbm_eff)
        flops = frac * 2 * m.params * (batch.prefill_tokens + batch.decoding)
        return max(mem, flops / (g * self.gpu.tflops * 1e12 * self.gpu.mfu))

    def submit(self, req: Request) -> None:
        self.waiting.append(req)
        self.dispatch()

    def dispatch(self) -> None:
        while self.waiting:
            best = max(self.instances, key=lambda i: i.room, default=None)
            if best is None or best.room <= 0:
                return
            best.admit(self.waiting.popleft())

    def _add_instance(self, inst: Instance) -> None:
        self.instances.append(inst)
        for n in inst.nodes:
            self.first_serving.setdefault(n, self.sim.now)
        self.dispatch()

    def _drop_instance(self, inst: Instance) -> None:
        if inst in self.instances:
            self.instances.remove(inst)

    def go_local(self, node: int) -> Instance:
        """``node`` holds the whole model: a local replica starts serving on it."""
        inst = Instance(self, [(node, 0, self.blocks)])
        self.local[node] = inst
        self.hot_at[node] = self.sim.now
        self.loading.discard(node)
        self._add_instance(inst)
        return inst

    # ---- GPU accounting -------------------------------------------------------------------
    def allocate(self, node: int) -> None:
        if node in self._alloc:
            raise ConfigError(f"node {node} is already allocated")
        iv = GpuInterval(node, self.sim.now)
        self._alloc[node] = iv
        self.intervals.append(iv)

    def release(self, node: int) -> None:
        inst = self.local.pop(node)
        inst.closed = True
        self._drop_instance(inst)
        self._alloc.pop(node).end = self.sim.now
        self.hot_at.pop(node, None)
        self.host_cache_until[node] = self.sim.now + HOST_KEEP_ALIVE_S

    def gpu_seconds(self, until: float) -> float:
        return sum(((until if math.isnan(iv.end) else iv.end) - iv.start) for iv in self.intervals) * self.gpus_per_node

    @property
    def allocated(self) -> list[int]:
        return sorted(self._alloc)

    # ---- scaling out ----------------------------------------------------------------------
    def start_hot(self, nodes: Sequence[int]) -> None:
        """Nodes that hold the model in GPU memory at the start (the ``k`` sources)."""
        for n in nodes:
            self.allocate(n)
            self.go_local(n)

    def scale_out(self, new: Sequence[int], sources: Sequence[int] = ()) -> None:
        """Load the model onto ``new`` nodes (allocated from now on), the way ``system`` does:
        multicast from ``sources`` (hot nodes) when there are any, else from each node's own
        host-memory cache or SSD."""
        new = list(new)
        for n in new:
            self.allocate(n)
            self.loading.add(n)
        if not new:
            return
        now = self.sim.now
        if self.system == "ideal":
            for n in new:
                self.go_local(n)
            return
        warm = [n for n in new if self.host_cache_until.get(n, -1.0) >= now]
        cold = [n for n in new if n not in warm]
        if self.system in ("gfaas", "serverlessllm"):
            for n in warm:
                self._load_local(n, PCIE_FROM_HOST)
        else:
            cold = new
        if not cold:
            return
        from_host = False
        if not sources and self.system == "gfaas":
            # Seed 002 §5: one replica in RDMA-registered memory anywhere is enough, host memory included.
            sources = [n for n in self.node_ids if self.host_cache_until.get(n, -1.0) >= now and n not in cold]
            from_host = True
        if self.system == "serverlessllm" or not sources:
            for n in cold:
                self._load_local(n, SSD_GBPS)
            return
        k = min(len(sources), len(cold), MAX_SOURCES)
        self._multicast(list(sources)[:k], cold, from_host)

    def _load_local(self, node: int, gbps: float | None) -> None:
        """Load from the node's own host memory (``gbps`` None: the PCIe link's rate) or SSD."""
        host = self.topology.host_of(node)
        gpus = self.node_gpus[node]
        left = [len(gpus)]

        def done() -> None:
            left[0] -= 1
            if left[0] == 0:
                self.go_local(node)

        for g in gpus:
            hops = [host, _switch(self.topology, g), g]
            self.net.start(hops, self.model.weight_bytes / len(gpus), done,
                           cap_gbps=None if gbps is None else gbps / len(gpus))

    def _multicast(self, sources: list[int], dests: list[int], from_host: bool = False) -> Multicast:
        members = [*sources, *dests]
        sched = plan_multicast(len(members), self.blocks, len(sources), SCHEME_OF[self.system])
        planner = PipelinePlanner.for_schedule(sched) if self.system == "gfaas" else None
        pipes: dict[int, Instance] = {}
        for s in members:  # destinations forward blocks too: none is released before the plan ends
            self.sending[s] = self.sending.get(s, 0) + 1

        def on_blocks(step: int, arrived: dict[int, list[int]]) -> None:
            if planner is None:
                for i in arrived:
                    if len(mc.held[i]) == self.blocks:
                        self.go_local(members[i])
                return
            retired: Instance | None = None
            for ch in planner.on_blocks(step, arrived):
                if ch.kind == "retired":
                    assert ch.pipeline is not None
                    retired = pipes.pop(ch.pipeline.id)
                elif ch.kind == "local":
                    assert ch.node is not None
                    inst = self.go_local(members[ch.node])
                    if retired is not None:
                        self._drop_instance(retired)
                        retired.retire(inst)
                        retired = None
                else:
                    assert ch.pipeline is not None
                    pipes[ch.pipeline.id] = self._pipeline(ch.pipeline, members)

        def on_done() -> None:
            for s in members:
                self.sending[s] -= 1

        mc = Multicast(self, sched, members, on_blocks, on_done,
                       frozenset(range(len(sources))) if from_host else frozenset())
        self.multicasts.append(mc)
        mc.start()
        return mc

    def _pipeline(self, pipe: Pipeline, members: Sequence[int]) -> Instance:
        inst = Instance(self, [(members[s.node], s.start, s.stop) for s in pipe.stages], pipeline=pipe.id)
        self._add_instance(inst)
        return inst


#: Host memory to GPU over the node's PCIe link at its rate (``None``: no cap beyond the links).
PCIE_FROM_HOST: float | None = None
#: Seed 002 §2.3 keeps models in host memory for 15 s after use (the tail of its keep-alive study).
HOST_KEEP_ALIVE_S = 15.0
#: At most this many hot nodes act as sources of one multicast (seed 002 evaluates k in {1, 2, 4}).
MAX_SOURCES = 4


def _gpu_index(name: str) -> int:
    tail = name.rsplit("gpu", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _switch(topo: Topology, gpu: str) -> str:
    sw = topo.pcie_switch_of(gpu)
    if sw is None:
        raise ConfigError(f"{gpu} of {topo.name!r} hangs off no PCIe switch; the scale-out model needs one")
    return sw


# ---- one scale-out under a burst (seed 002 Figs. 8-9) ------------------------------------------


@dataclass
class BurstResult:
    system: str
    requests: list[Request]
    tokens: list[float]
    processed: list[tuple[float, int]]
    first_serving: dict[int, float]
    multicast_s: float

    def ttfts(self) -> list[float]:
        return [r.ttft for r in self.requests]


def run_burst(topology: Topology, model: LlmSpec, system: str, sources: int,
              requests: Sequence[tuple[float, int, int]], *, blocks: int = DEFAULT_BLOCKS,
              horizon: float | None = None) -> BurstResult:
    """Nodes ``0..sources-1`` hold the model; at time 0 every other node starts loading it while
    ``requests`` (arrival, prompt tokens, output tokens) arrive. Runs until every request finished
    (or ``horizon``)."""
    n = len(topology.nodes)
    if not 1 <= sources < n:
        raise ConfigError(f"sources={sources}: pass 1 <= sources < {n} (the topology's nodes)")
    fleet = Fleet(topology, model, system, blocks=blocks)
    fleet.start_hot(range(sources))
    fleet.scale_out(range(sources, n), sources=range(sources))
    reqs = [Request(i, a, p, max(o, 1)) for i, (a, p, o) in enumerate(requests)]
    for r in reqs:
        fleet.sim.at(r.arrival, fleet.submit, r)
    fleet.sim.run(horizon)
    unfinished = [r for r in reqs if math.isnan(r.first_token)]
    if unfinished and horizon is None:
        raise ConfigError(f"{len(unfinished)} requests never got a first token under {system}; this is a bug")
    mc = [m.finished_at for m in fleet.multicasts]
    return BurstResult(system, reqs, fleet.tokens, fleet.processed, fleet.first_serving, max(mc) if mc else math.nan)


def multicast_seconds(topology: Topology, model: LlmSpec, scheme: str, *, sources: int = 1,
                      blocks: int = DEFAULT_BLOCKS) -> tuple[float, Multicast]:
    """Seconds until every node of ``topology`` holds ``model`` (nodes ``0..sources-1`` start with
    it), moving blocks under ``scheme``; and the :class:`Multicast` with its arrival record."""
    fleet = Fleet(topology, model, "gfaas", blocks=blocks)
    n = len(topology.nodes)
    sched = plan_multicast(n, blocks, sources, scheme)
    mc = Multicast(fleet, sched, list(range(n)))
    mc.start()
    fleet.sim.run()
    return mc.finished_at, mc


# ---- autoscaling on a bursty trace (seed 002 Figs. 10-11) ---------------------------------------

#: Requests in the system (queued or being served) per instance the autoscaler aims for, like
#: Knative's concurrency target; half a batch, so that an instance is added before one is full.
TARGET_CONCURRENCY = MAX_BATCH // 2
#: How often the autoscaler looks (seconds) and how long a lower demand must last before it scales
#: in (Knative's stable window, 60 s by default; short here because the trace's rate changes every
#: second and seed 002 §7.4 studies how fast systems scale in).
SCALER_TICK_S = 0.5
SCALE_IN_WINDOW_S = 5.0


@dataclass
class TraceResult:
    system: str
    requests: list[Request]
    gpu_seconds: float
    timeline: list[tuple[float, int]]  # (time, GPUs allocated), one per autoscaler tick
    span: float
    # gpu_seconds by what the nodes did (NODE_STATES), as seen at each tick
    states: dict[str, float] = field(default_factory=dict)


#: What an allocated node did, for :attr:`TraceResult.states`, as seen at a tick: loading the model
#: and not serving yet; loading while serving as a stage of a pipelined instance (PipeCast); serving
#: (holding the model, in an instance with requests); idle (holding the model, no request: kept warm).
NODE_STATES = ("loading", "loading_serving", "serving", "idle")


def _node_states(fleet: Fleet) -> dict[str, int]:
    """How many allocated nodes are in each of :data:`NODE_STATES` now."""
    serving: set[int] = set()
    for inst in fleet.instances:
        if inst.active or inst.in_flight:
            serving.update(inst.nodes)
    out = dict.fromkeys(NODE_STATES, 0)
    for n in fleet.allocated:
        busy = n in serving
        if n in fleet.loading:
            out["loading_serving" if busy else "loading"] += 1
        else:
            out["serving" if busy else "idle"] += 1
    return out


def serving_rps(model: LlmSpec, gpus: int, mean_prompt: float, mean_output: float, gpu: GpuSpec = H800) -> float:
    """Requests per second one local replica sustains under the cost model (prefill at peak
    FLOP/s x MFU, decode at full batches): used to size loads, not by the simulation itself."""
    prefill = 2 * model.params * mean_prompt / (gpus * gpu.tflops * 1e12 * gpu.mfu)
    decode = model.weight_bytes / (gpus * gpu.hbm_gbps * GB * gpu.hbm_eff) * max(mean_output - 1, 0) / MAX_BATCH
    return 1.0 / (prefill + decode)


def run_trace(topology: Topology, model: LlmSpec, system: str, requests: Sequence[tuple[float, int, int]],
              *, blocks: int = DEFAULT_BLOCKS) -> TraceResult:
    """Serve ``requests`` with a queue-driven autoscaler: every :data:`SCALER_TICK_S` it wants
    ``ceil(requests in the system / TARGET_CONCURRENCY)`` instances (at most the nodes; zero when
    nothing is there: serverless scales to zero), scales out at once (nodes with the model in host memory first) and scales in to the
    largest want of the last :data:`SCALE_IN_WINDOW_S` (``ideal``: of this tick only), releasing idle
    local replicas. GPU time
    counts every node from the start of its load to its release."""
    fleet = Fleet(topology, model, system, blocks=blocks)
    nodes = list(range(len(topology.nodes)))
    fleet.start_hot([0])
    reqs = [Request(i, a, p, max(o, 1)) for i, (a, p, o) in enumerate(requests)]
    for r in reqs:
        fleet.sim.at(r.arrival, fleet.submit, r)
    end = max((r.arrival for r in reqs), default=0.0)
    wants: deque[tuple[float, int]] = deque()
    # Ideal scaling (seed 002 §7.4): loads and unloads take no time, so nothing is kept warm either.
    window = 0.0 if system == "ideal" else SCALE_IN_WINDOW_S
    timeline: list[tuple[float, int]] = []
    # Allocations change only at ticks, so GPU time split by the nodes' states at the tick before sums
    # to gpu_seconds exactly; a state changing between ticks (a load ending) counts from the next one.
    states = dict.fromkeys(NODE_STATES, 0.0)
    seen: list[tuple[float, dict[str, int]]] = []

    def account(now: float) -> None:
        if seen:
            t, counts = seen[-1]
            for k, c in counts.items():
                states[k] += c * (now - t) * fleet.gpus_per_node

    def tick() -> None:
        now = fleet.sim.now
        account(now)
        outstanding = len(fleet.waiting) + sum(len(i.active) for i in fleet.instances)
        want = min(len(nodes), math.ceil(outstanding / TARGET_CONCURRENCY))
        wants.append((now, want))
        while wants and wants[0][0] < now - window:
            wants.popleft()
        allocated = fleet.allocated
        if want > len(allocated):
            free = [n for n in nodes if n not in allocated]
            free.sort(key=lambda n: -fleet.host_cache_until.get(n, -1.0))
            hot = [n for n in allocated if n in fleet.local and n not in fleet.loading]
            fleet.scale_out(free[: want - len(allocated)], sources=hot)
        else:
            keep = max(w for _, w in wants)
            idle = [n for n in allocated if n in fleet.local and not fleet.local[n].active
                    and not fleet.local[n].in_flight and not fleet.sending.get(n)]
            for n in idle[: max(0, len(allocated) - keep)]:
                fleet.release(n)
        timeline.append((now, len(fleet.allocated) * fleet.gpus_per_node))
        seen[:] = [(now, _node_states(fleet))]
        if now < end or fleet.completed < len(reqs):
            fleet.sim.schedule(SCALER_TICK_S, tick)

    fleet.sim.schedule(0.0, tick)
    fleet.sim.run()
    span = fleet.sim.now
    account(span)
    return TraceResult(system, reqs, fleet.gpu_seconds(span), timeline, span, states)
