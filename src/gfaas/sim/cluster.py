"""A cluster running workflows: GPUs time-shared by function instances, a data plane, requests.

Execution model (the same for every system, so differences come from the data plane only):

- Each GPU function of a deployed workflow is bound to one GPU. A GPU runs one function
  execution at a time; waiting executions sit in per-function FIFO queues and the GPU takes the
  one whose request arrived first (time-sharing, as in seed 001 §4.3.2's footnote).
- An execution holds its GPU while it *gets* its inputs, computes, and *puts* its outputs, the
  way a function instance is busy during its own I/O. Its inputs are the host data it starts from
  and its predecessors' objects, fetched in parallel; its outputs are one object per outgoing edge,
  stored as the system's ``store`` mode says, plus results sent back to host memory.
- CPU functions run on the host without contention (cores are not the bottleneck studied). Data a
  GPU function sends to a CPU function goes to that function's host memory as part of the put.
- Which functions run and which are skipped is decided by the runtime's own
  :class:`~gfaas.runtime.dag.DagState`, stepped as functions finish. A condition (``when:``) reads a
  scalar that the simulator draws per request, at arrival, from the seeded RNG: it holds with the
  workflow's probability for it (``gfaas.sim.workflows.CONDITION_PROBABILITY``). A producer stores an
  output only for the consumers that can still run (``DagState.readers``).
- Every transfer of a function is due by ``gfaas.policy.input_deadline`` of its start and compute
  time (SLO = ``gfaas.policy.SLO_FACTOR`` x the profiled execution time), the rule the runtime
  records per function too.
- With a storage policy (``SystemConfig.storage``) GPU stores have a capacity and objects are
  evicted, migrated and restored by ``gfaas.sim.memory``; without one GPU memory is unlimited.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..policy import input_deadline, place_replicas, place_workflow, slo_for
from ..policy.locality import choose_node
from ..policy.placement import Layout
from ..runtime.dag import DagState
from ..topology import Topology
from .dag_native import DAG_KIND, compile_plan, new_core
from .dataplane import DataPlane
from .kernel import Simulator
from .memory import DEFAULT_GPU_MEMORY, MemoryModel, queue_position
from .profiles import Profile
from .systems import CUDA_MALLOC_S, POOL_ALLOC_S, SystemConfig
from .workflows import Workflow

log = logging.getLogger(__name__)


@dataclass
class FnStats:
    queue_s: float = 0.0
    get_s: float = 0.0
    compute_s: float = 0.0
    put_s: float = 0.0
    alloc_s: float = 0.0     # the part of put_s before any byte moves: allocations and the store's own cost
    slo_s: float = 0.0       # gfaas.policy.slo_for(compute_s)
    deadline_s: float = 0.0  # gfaas.policy.input_deadline(0, compute_s): its transfers' due time after it starts


@dataclass
class RequestRecord:
    workflow: str
    ident: int
    arrival: float
    finish: float = -1.0
    fns: dict[str, FnStats] = field(default_factory=dict)
    #: per GPU-to-GPU-function edge: the producer's put time plus the time the consumer waited for
    #: that edge's data (gFn-gFn data passing, 001 Fig. 18c)
    edges: dict[tuple[str, str], float] = field(default_factory=dict)
    #: the DagState decisions ``(function, "ready" | "skipped")`` in order, with ``Cluster.keep_events``
    events: list[tuple[str, str]] = field(default_factory=list)

    @property
    def latency(self) -> float:
        return self.finish - self.arrival

    @property
    def passing_s(self) -> float:
        """Time spent getting and putting data, summed over the request's GPU functions."""
        return sum(s.get_s + s.put_s for s in self.fns.values())

    @property
    def parts_s(self) -> tuple[float, float, float]:
        """``passing_s`` in three: (gets, puts less their allocations, allocations), summed over the
        request's functions."""
        alloc = sum(s.alloc_s for s in self.fns.values())
        return (sum(s.get_s for s in self.fns.values()), sum(s.put_s for s in self.fns.values()) - alloc, alloc)


class GPU:
    """One GPU: per-function FIFO queues, one execution at a time, oldest request first."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.queues: dict[str, deque[tuple[float, Callable[[], None], Hashable]]] = {}
        self.busy = False
        self.waiting: dict[Hashable, tuple[float, int]] = {}  # key -> (arrival, submission order)
        self._seq = 0

    def submit(self, function: str, arrival: float, start: Callable[[], None], key: Hashable = None) -> None:
        self._seq += 1
        if key is not None:
            self.waiting[key] = (arrival, self._seq)
        self.queues.setdefault(function, deque()).append((arrival, start, key))

    def next(self) -> Callable[[], None] | None:
        best = None
        for q in self.queues.values():
            if q and (best is None or q[0][0] < best[0][0]):
                best = q
        if best is None:
            return None
        _, start, key = best.popleft()
        if key is not None:
            del self.waiting[key]
        return start

    def positions(self) -> Callable[[Hashable, float | None], int | None]:
        """How many queued executions run before the one named by a key (oldest request first).

        An execution not queued yet whose request arrived at ``arrival`` will be taken after every
        queued one of an older (or equally old) request, so that is its position; without an
        arrival it has none (the policy puts it behind everything)."""
        order = sorted(self.waiting.values())

        def position(key: Hashable, arrival: float | None) -> int | None:
            mine = self.waiting.get(key)
            if mine is None and arrival is not None:
                mine = (arrival, 1 << 62)
            return queue_position(order, mine)

        return position


@dataclass(frozen=True)
class Deployment:
    """Where one replica of a workflow runs: GPU per GPU function, node per function."""

    workflow: Workflow
    gpu: dict[str, str]
    node: dict[str, int]


class Cluster:
    """Workflows deployed on a topology under one system configuration."""

    def __init__(self, topology: Topology, cfg: SystemConfig, *, seed: int = 0,
                 profile: Profile | None = None) -> None:
        self.topo = topology
        self.cfg = cfg
        self.sim = Simulator()
        self.plane = DataPlane(self.sim, topology, cfg)
        self.profile = profile or Profile()
        self.rng = random.Random(seed)
        self.gpus = {g: GPU(g) for g in topology.gpus}
        self.deployments: dict[str, list[Deployment]] = {}
        self._rr: dict[str, int] = {}
        self._fn_cost: dict[tuple[str, str, int], tuple[float, float, float]] = {}  # see _Request._run
        self._hosts: dict[int, str] = {}  # node -> its host device (Topology.host_of), see _Request._host
        self._dag_plans: dict[int, tuple[object, object]] = {}  # id(spec) -> (spec, its native DagPlan)
        self.records: list[RequestRecord] = []
        self._ids = 0
        self.on_finish: Callable[[RequestRecord], None] | None = None
        #: keep every request's DagState decisions in its record (tests compare them with the runtime's)
        self.keep_events = False
        #: (workflow, request id) -> condition scalars per function; None: drawn from the seeded RNG
        self.condition_values: Callable[[str, int], Mapping[str, Mapping[str, float]]] | None = None
        self.memory: MemoryModel | None = None
        if cfg.storage is not None and cfg.store != "host":
            self.memory = MemoryModel(self.sim, topology, cfg.storage, self.storage_capacity,
                                      self.plane.move,
                                      lambda g: self.gpus[g].positions())

    def storage_capacity(self, gpu: str) -> int:
        """Bytes of ``gpu``'s memory its store may use under this configuration."""
        mem = self.topo.device(gpu).memory_bytes or DEFAULT_GPU_MEMORY
        if self.cfg.storage_bytes is not None:
            return self.cfg.storage_bytes
        frac = self.cfg.storage_fraction
        if frac is None:
            frac = self.cfg.storage.cap_fraction if self.cfg.storage is not None else 1.0
        return int(frac * mem)

    # ---- deployment -----------------------------------------------------------------------------
    def deploy(self, wf: Workflow, replicas: int = 1, gpus: Sequence[str] | None = None,
               nodes: Sequence[int] | None = None, layout: Layout = "pack") -> list[Deployment]:
        """Place ``replicas`` copies of ``wf`` on ``nodes`` (default: every node holding one of
        ``gpus``, or of the topology's GPUs) by :func:`gfaas.policy.place_replicas`: with ``layout="pack"``
        each replica whole on one node, replicas to the least-loaded node first; with
        ``layout="spread"`` each replica over all ``nodes`` (the inter-node experiments). Within a node
        a replica takes GPUs not yet used, sharing when they run out."""
        if not self.topo.gpus:
            raise ConfigError(f"topology {self.topo.name!r} has no GPU to deploy {wf.name!r} on")
        allowed = list(gpus or self.topo.gpus)
        node_of_gpu = {g: self.topo.device(g).node for g in allowed}
        use = list(nodes) if nodes is not None else sorted(set(node_of_gpu.values()))
        pools: dict[int, list[str]] = {n: [] for n in use}
        for g in allowed:  # each node's GPUs in the order given
            pool = pools.get(node_of_gpu[g])
            if pool is not None:
                pool.append(g)
        used_gpus = {g for ds in self.deployments.values() for d in ds for g in d.gpu.values()}
        order = wf.topological_order()
        gpu_fns = [f for f in order if f in wf.gpu_functions]
        fn_edges = [(e.src, e.dst, e.nbytes) for e in wf.edges if e.src in gpu_fns and e.dst in gpu_fns]
        slots = {n: len(pools[n]) for n in use}
        used = {n: sum(g in used_gpus for g in pools[n]) for n in use}
        if not any(slots.values()):
            raise ConfigError(f"nodes {use} hold none of the GPUs {allowed!r}; name nodes that have GPUs")
        plan = place_replicas(gpu_fns, fn_edges, replicas, slots, used=used, layout=layout)
        out: list[Deployment] = []
        taken: set[str] = set()  # the GPUs of the replicas in out
        for r, placed in enumerate(plan):
            node_of = self._with_cpu_functions(wf, order, placed, use)
            gpu_of: dict[str, str] = {}
            for node in sorted(set(placed.values())):
                fns = [f for f in wf.gpu_functions if node_of[f] == node]
                pool = pools[node]
                used_now = used_gpus | taken | set(gpu_of.values())
                free = [g for g in pool if g not in used_now] or pool
                edges = [(e.src, e.dst, e.nbytes) for e in wf.edges if e.src in fns and e.dst in fns]
                gpu_of.update(place_workflow(self.topo, fns, edges, free,
                                             topology_aware=self.cfg.placement == "mapa",
                                             seed=self.rng.randrange(1 << 30) + r))
            out.append(Deployment(wf, gpu_of, node_of))
            taken.update(gpu_of.values())
        self.deployments.setdefault(wf.name, []).extend(out)
        return out

    @staticmethod
    def _with_cpu_functions(wf: Workflow, order: Sequence[str], placed: Mapping[str, int],
                            use: Sequence[int]) -> dict[str, int]:
        """Nodes per function: a CPU function runs on the host of the node that holds most of its
        input bytes (:func:`gfaas.policy.locality.choose_node`, as the runtime places a call), ties
        going to the node of the function before it in topological order (of the first GPU
        function, at the start)."""
        gpu_nodes = {placed[f] for f in placed}
        if len(gpu_nodes) <= 1:
            only = next(iter(gpu_nodes), use[0])
            return {f.name: only for f in wf.functions}
        out: dict[str, int] = {}
        gpu_fns = [f for f in order if f in placed]
        last = placed[gpu_fns[0]]
        for f in order:
            if f in placed:
                out[f] = placed[f]
            else:
                held: dict[int, int] = {}
                for e in wf.edges:
                    if e.dst == f and e.src in out:
                        held[out[e.src]] = held.get(out[e.src], 0) + e.nbytes
                out[f] = choose_node([last, *sorted(gpu_nodes - {last})], held)
            last = out[f]
        return out

    # ---- requests -------------------------------------------------------------------------------
    def submit(self, workflow: str, at: float) -> None:
        """Schedule one request of ``workflow`` arriving at absolute time ``at``."""
        self.sim.at(at, self._arrive, workflow)

    def submit_many(self, workflow: str, times: Sequence[float] | np.ndarray) -> None:
        """``submit(workflow, t)`` for every ``t`` in ``times``: the same order of events, but the
        arrivals wait outside the event heap until their turn (``Simulator.at_many``)."""
        self.sim.at_many(times, self._arrive, workflow)

    def run(self, until: float | None = None) -> list[RequestRecord]:
        self.sim.run(until)
        return self.records

    def _arrive(self, workflow: str) -> None:
        deps = self.deployments.get(workflow)
        if not deps:
            raise ConfigError(f"workflow {workflow!r} is not deployed; call deploy() first")
        k = self._rr.get(workflow, 0)
        self._rr[workflow] = k + 1
        self._ids += 1
        rec = RequestRecord(workflow, self._ids, self.sim.now)
        self.records.append(rec)
        _Request(self, deps[k % len(deps)], rec).start()

    # ---- GPU scheduling -------------------------------------------------------------------------
    def run_on_gpu(self, gpu: str, function: str, arrival: float, body: Callable[[Callable[[], None]], None],
                   key: Hashable = None) -> None:
        """Queue ``body(release)`` on ``gpu``; ``body`` must call ``release()`` when the execution ends.
        ``key`` names the queued execution so that the storage policy can find its queue position."""
        g = self.gpus[gpu]

        def start() -> None:
            g.busy = True

            def release() -> None:
                g.busy = False
                nxt = g.next()
                if nxt is not None:
                    nxt()

            body(release)

        g.submit(function, arrival, start, key)
        if not g.busy:
            nxt = g.next()
            if nxt is not None:
                nxt()

    def alloc_s(self) -> float:
        return POOL_ALLOC_S if self.cfg.elastic_pool else CUDA_MALLOC_S

    def store_device(self, producer_gpu: str) -> str:
        """Where a put from ``producer_gpu`` leaves its data under this system."""
        if self.cfg.store == "gpu-local":
            return producer_gpu
        node = self.topo.device(producer_gpu).node
        if self.cfg.store == "host":
            return self.topo.host_of(node)
        return self.rng.choice(self.topo.of_kind("gpu", node))


class _Request:
    """One request walking through its workflow's DAG, as the runtime's DagState decides."""

    def __init__(self, cluster: Cluster, dep: Deployment, rec: RequestRecord) -> None:
        self.c = cluster
        self.dep = dep
        self.rec = rec
        wf = dep.workflow
        assert wf.spec is not None
        self.dag: DagState | Any
        if DAG_KIND == "native":  # gfaas.sim.dag_native: the same decisions, stepped in Rust
            spec = wf.spec
            held = cluster._dag_plans.get(id(spec))
            if held is None or held[0] is not spec:
                held = cluster._dag_plans[id(spec)] = (spec, compile_plan(spec))
            self.dag = new_core(held[1], rec.events if cluster.keep_events else None)
        else:
            self.dag = DagState(wf.spec)
            if cluster.keep_events:
                rec.events = self.dag.events  # type: ignore[assignment]
        if cluster.condition_values is not None:
            self.scalars = {f: dict(v) for f, v in cluster.condition_values(wf.name, rec.ident).items()}
        else:  # drawn at arrival, in arrival order: every system sees the same branches per request
            self.scalars = wf.draw_scalars(cluster.rng)
        self.location: dict[tuple[str, str], str] = {}  # edge -> device holding its object
        self.objects: dict[tuple[str, str], Hashable] = {}  # edge -> its key in the memory model
        self.put_s: dict[str, float] = {}  # GPU function -> its put time

    def start(self) -> None:
        self._decided(*self.dag.start())

    def _decided(self, ready: list[str], skipped: list[str]) -> None:
        mem = self.c.memory
        for fn in skipped:  # data stored for a function that will not run is released
            for e in self.dep.workflow.preds(fn):
                key = self.objects.pop((e.src, e.dst), None)
                if key is not None and mem is not None:
                    mem.consume(key)
        for fn in ready:
            self._run(fn)
        if self.dag.complete:
            self.rec.finish = self.c.sim.now
            if self.c.on_finish is not None:
                self.c.on_finish(self.rec)

    def _readers(self, fn: str) -> set[str]:
        return set(self.dag.readers(fn, self.scalars.get(fn, {})))

    def _host(self, fn: str) -> str:
        node = self.dep.node[fn]
        hosts = self.c._hosts
        h = hosts.get(node)
        if h is None:
            h = hosts[node] = self.c.topo.host_of(node)
        return h

    def _run(self, fn: str) -> None:
        wf = self.dep.workflow
        spec = wf.function(fn)
        c = self.c
        mem = c.memory
        if spec.kind == "cpu":
            if mem is not None:  # a CPU function reads its inputs from where they are, off the model
                for e in wf.preds(fn):
                    if (e.src, e.dst) in self.objects:
                        mem.consume(self.objects[(e.src, e.dst)])
            readers = self._readers(fn)
            for e in wf.succs(fn):
                if e.dst in readers:
                    self.location[(e.src, e.dst)] = self._host(fn)
            c.sim.schedule(c.profile.seconds(spec.model, None, spec.batch), self._finished, fn)
            return
        gpu = self.dep.gpu[fn]
        stats = FnStats()
        self.rec.fns[fn] = stats
        ready = c.sim.now
        key = (spec.model, gpu, spec.batch)
        cost = c._fn_cost.get(key)
        if cost is None:  # the same for every request of this function on this GPU
            compute = c.profile.seconds(spec.model, c.topo.device(gpu).model, spec.batch)
            cost = c._fn_cost[key] = (compute, slo_for(compute) if compute > 0 else 0.0,
                                      input_deadline(0.0, compute))
        compute, stats.slo_s, stats.deadline_s = cost
        if mem is not None:
            mem.requested(gpu, fn)

        def body(release: Callable[[], None]) -> None:
            stats.queue_s = c.sim.now - ready
            t0 = c.sim.now
            deadline = input_deadline(t0, compute)
            starts: list[Callable[[Callable[[], None]], None]] = []
            if spec.input_bytes:
                starts.append(_mover(c, self._host(fn), gpu, spec.input_bytes, deadline))
            for e in wf.preds(fn):
                edge = (e.src, e.dst)
                if edge not in self.location:  # nothing stored for this edge
                    continue
                if edge in self.objects:
                    assert mem is not None
                    start = _fetcher(mem, self.objects[edge], gpu, deadline)
                else:
                    start = _mover(c, self.location[edge], gpu, e.nbytes, deadline)
                if wf.function(e.src).kind == "gpu":
                    start = self._timed(start, edge, t0)
                starts.append(start)
            _all(c, starts, lambda: computed(t0, release))

        def computed(t0: float, release: Callable[[], None]) -> None:
            stats.get_s = c.sim.now - t0
            c.sim.schedule(compute, put, release)

        def put(release: Callable[[], None]) -> None:
            stats.compute_s = compute
            t1 = c.sim.now
            moves: list[tuple[str, str, int]] = []
            allocs = 0
            delay = 0.0
            stored: dict[str, int] = {}
            readers = self._readers(fn)
            for e in wf.succs(fn):
                if e.dst not in readers:
                    continue
                consumer = wf.function(e.dst)
                if consumer.kind == "cpu":  # to the consumer's host memory, like a result
                    where = self._host(e.dst)
                    self.location[(e.src, e.dst)] = where
                    moves.append((gpu, where, e.nbytes))
                    continue
                where = c.store_device(gpu)
                if mem is not None and c.topo.device(where).kind == "gpu":
                    key = (self.rec.ident, e.src, e.dst)
                    obj, cost = mem.put(key, e.nbytes, where, fn, (self.rec.ident, fn), self.dep.gpu[e.dst],
                                        (self.rec.ident, e.dst), gpu, self.rec.arrival)
                    self.objects[(e.src, e.dst)] = key
                    delay += cost
                    stored[where] = stored.get(where, 0) + e.nbytes
                    if obj.moving:  # sent to host memory in the background: not the put's copy
                        where = gpu
                    elif where != gpu:
                        obj.moving = True  # being written: nobody may move or read it yet
                elif c.topo.device(where).kind == "gpu":
                    allocs += 1
                self.location[(e.src, e.dst)] = where
                if where != gpu:
                    moves.append((gpu, where, e.nbytes))
            if mem is not None:
                for home, n in stored.items():
                    mem.stored(home, fn, n)
            if spec.output_bytes:
                moves.append((gpu, self._host(fn), spec.output_bytes))
            delay += allocs * c.alloc_s()
            stats.alloc_s = delay

            def go() -> None:
                due = input_deadline(c.sim.now, compute)
                starts = [_mover(c, a, b, n, due) for a, b, n in moves]
                _all(c, starts, lambda: done_put(t1, release))

            c.sim.schedule(delay, go)

        def done_put(t1: float, release: Callable[[], None]) -> None:
            stats.put_s = c.sim.now - t1
            self.put_s[fn] = stats.put_s
            if mem is not None:
                for e in wf.succs(fn):
                    if (e.src, e.dst) in self.objects:
                        mem.settle(self.objects[(e.src, e.dst)])
            release()
            self._finished(fn)

        c.run_on_gpu(gpu, fn, self.rec.arrival, body, key=(self.rec.ident, fn))

    def _timed(self, start: Callable[[Callable[[], None]], None], edge: tuple[str, str],
               t0: float) -> Callable[[Callable[[], None]], None]:
        """``start`` that also records the edge's passing time (producer's put + this wait)."""
        def wrapped(done: Callable[[], None]) -> None:
            def landed() -> None:
                self.rec.edges[edge] = self.put_s.get(edge[0], 0.0) + self.c.sim.now - t0
                done()

            start(landed)

        return wrapped

    def _finished(self, fn: str) -> None:
        self._decided(*self.dag.finished(fn, self.scalars.get(fn, {})))


def _mover(c: Cluster, src: str, dst: str, n: int, deadline: float) -> Callable[[Callable[[], None]], None]:
    return lambda done: c.plane.move(src, dst, n, done, deadline)


def _fetcher(mem: MemoryModel, key: Hashable, gpu: str, deadline: float) -> Callable[[Callable[[], None]], None]:
    return lambda done: mem.fetch(key, gpu, done, deadline)


def _all(c: Cluster, starts: Sequence[Callable[[Callable[[], None]], None]], then: Callable[[], None]) -> None:
    """Start every transfer at once; call ``then`` when the last one has landed."""
    if not starts:
        c.sim.schedule(0.0, then)
        return
    if len(starts) == 1:  # the last one to land is the only one: no count to keep
        starts[0](then)
        return
    left = [len(starts)]

    def one() -> None:
        left[0] -= 1
        if left[0] == 0:
            then()

    for start in starts:
        start(one)
