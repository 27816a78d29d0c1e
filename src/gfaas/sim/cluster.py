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
from ..policy.bandwidth import MIN_TRANSFER_S
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

#: The scalars of a function with no condition over its outputs: one shared empty dict rather than one
#: per call (DagState and DagCore copy what they are given).
_NO_SCALARS: dict[str, float] = {}


@dataclass(slots=True)  # one per GPU function per request: no __dict__ to allocate and collect
class FnStats:
    queue_s: float = 0.0
    get_s: float = 0.0
    compute_s: float = 0.0
    put_s: float = 0.0
    alloc_s: float = 0.0     # the part of put_s before any byte moves: allocations and the store's own cost
    slo_s: float = 0.0       # gfaas.policy.slo_for(compute_s)
    deadline_s: float = 0.0  # gfaas.policy.input_deadline(0, compute_s): its transfers' due time after it starts


@dataclass(slots=True)
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
        self.queues: dict[str, deque[tuple[float, Callable[[Callable[[], None]], None], Hashable]]] = {}
        self.queued = 0  # executions in the queues
        self.busy = False
        self.waiting: dict[Hashable, tuple[float, int]] = {}  # key -> (arrival, submission order)
        self._seq = 0

    def submit(self, function: str, arrival: float, body: Callable[[Callable[[], None]], None],
               key: Hashable = None) -> None:
        """Queue ``body(release)``; with a ``key``, ``positions`` can find it."""
        self._seq += 1
        if key is not None:
            self.waiting[key] = (arrival, self._seq)
        q = self.queues.get(function)
        if q is None:
            q = self.queues[function] = deque()
        q.append((arrival, body, key))
        self.queued += 1

    def next(self) -> Callable[[Callable[[], None]], None] | None:
        best = None
        for q in self.queues.values():
            if q and (best is None or q[0][0] < best[0][0]):
                best = q
        if best is None:
            return None
        _, body, key = best.popleft()
        self.queued -= 1
        if key is not None:
            del self.waiting[key]
        return body

    def run(self, function: str, arrival: float, body: Callable[[Callable[[], None]], None],
            key: Hashable = None) -> None:
        """``submit`` and start it if the GPU is idle. An idle GPU has nothing queued (``release``
        starts the next one), so then it starts at once, without the queue's round trip."""
        if self.busy:
            self.submit(function, arrival, body, key)
        else:
            self._seq += 1
            self.busy = True
            body(self.release)

    def release(self) -> None:
        """The running execution has ended: the next queued one, if any, starts."""
        self.busy = False
        if self.queued:
            body = self.next()
            assert body is not None
            self.busy = True
            body(self.release)

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
        self._fn_cost: dict[tuple[str, str, int], tuple[float, float, float]] = {}  # see _cost
        self._plans: dict[int, tuple[Deployment, dict[str, _Fn]]] = {}  # id(deployment) -> see _fn_plans
        self._dag_plans: dict[int, tuple[object, object]] = {}  # id(spec) -> (spec, its native DagPlan)
        self.records: list[RequestRecord] = []
        self._ids = 0
        self.on_finish: Callable[[RequestRecord], None] | None = None
        #: keep every request's DagState decisions in its record (tests compare them with the runtime's)
        self.keep_events = False
        #: (workflow, request id) -> condition scalars per function; None: drawn from the seeded RNG
        self.condition_values: Callable[[str, int], Mapping[str, Mapping[str, float]]] | None = None
        # Facts of ``cfg`` every put reads (``store_device``'s first case, ``alloc_s``), looked up once
        self._store_local = cfg.store == "gpu-local"
        self._alloc = self.alloc_s()
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
                mine = set(gpu_of.values())  # (not one union of every set: taken grows with the cluster)
                free = [g for g in pool if g not in used_gpus and g not in taken and g not in mine] or pool
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
        self.gpus[gpu].run(function, arrival, body, key)

    def _fn_plans(self, dep: Deployment) -> dict[str, _Fn]:
        """``dep``'s functions as every request runs them (built on its first request)."""
        held = self._plans.get(id(dep))
        if held is not None and held[0] is dep:
            return held[1]
        wf = dep.workflow
        host = {n: self.topo.host_of(n) for n in set(dep.node.values())}
        gpu = {f.name: dep.gpu[f.name] if f.kind == "gpu" else None for f in wf.functions}
        out = {f.name: _Fn(f.name, f.model, f.batch, gpu[f.name], self.gpus.get(gpu[f.name] or ""),
                           host[dep.node[f.name]], f.input_bytes, f.output_bytes,
                           tuple(((e.src, e.dst), e.nbytes, wf.function(e.src).kind == "gpu") for e in wf.preds(f.name)),
                           tuple(((e.src, e.dst), e.dst, e.nbytes,
                                  host[dep.node[e.dst]] if wf.function(e.dst).kind == "cpu" else None)
                                 for e in wf.succs(f.name)))
               for f in wf.functions}
        self._plans[id(dep)] = (dep, out)
        return out

    def _cost(self, f: _Fn) -> tuple[float, float, float]:
        """(compute time, FnStats.slo_s, FnStats.deadline_s) of ``f``, kept on it: the same for every
        request (a GPU function's, for every function of that model on that GPU)."""
        if f.gpu is None:
            cost = (self.profile.seconds(f.model, None, f.batch), 0.0, 0.0)
        else:
            key = (f.model, f.gpu, f.batch)
            held = self._fn_cost.get(key)
            if held is None:
                compute = self.profile.seconds(f.model, self.topo.device(f.gpu).model, f.batch)
                held = self._fn_cost[key] = (compute, slo_for(compute) if compute > 0 else 0.0,
                                             input_deadline(0.0, compute))
            cost = held
        f.cost = cost
        return cost

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


@dataclass(slots=True)
class _Fn:
    """One function of one deployment, as every request runs it (``Cluster._fn_plans``)."""

    name: str
    model: str
    batch: int
    gpu: str | None  # None: a CPU function, on its node's host
    device: GPU | None  # Cluster.gpus[gpu]
    host: str  # its node's host device
    input_bytes: int
    output_bytes: int
    preds: tuple[tuple[tuple[str, str], int, bool], ...]  # (edge, bytes, from a GPU function)
    succs: tuple[tuple[tuple[str, str], str, int, str | None], ...]  # (edge, consumer, bytes, its host if a CPU one)
    cost: tuple[float, float, float] | None = None  # Cluster._cost, on its first run


class _Request:
    """One request walking through its workflow's DAG, as the runtime's DagState decides."""

    def __init__(self, cluster: Cluster, dep: Deployment, rec: RequestRecord) -> None:
        self.c = cluster
        self.dep = dep
        self.rec = rec
        plan = cluster._plans.get(id(dep))  # cluster._fn_plans(dep), without its frame once built
        self.fns = plan[1] if plan is not None and plan[0] is dep else cluster._fn_plans(dep)
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
            for edge, _, _ in self.fns[fn].preds:
                key = self.objects.pop(edge, None)
                if key is not None and mem is not None:
                    mem.consume(key)
        for fn in ready:
            self._run(fn)
        if self.dag.complete:
            self.rec.finish = self.c.sim.now
            if self.c.on_finish is not None:
                self.c.on_finish(self.rec)

    def _run(self, fn: str) -> None:
        f = self.fns[fn]
        c = self.c
        mem = c.memory
        if f.gpu is None:
            if mem is not None:  # a CPU function reads its inputs from where they are, off the model
                for edge, _, _ in f.preds:
                    if edge in self.objects:
                        mem.consume(self.objects[edge])
            readers = self.dag.readers(fn, self.scalars.get(fn, _NO_SCALARS))
            for edge, dst, _, _ in f.succs:
                if dst in readers:
                    self.location[edge] = f.host
            c.sim.schedule((f.cost or c._cost(f))[0], self._finished, fn)
            return
        ex = _Exec(self, f, f.cost or c._cost(f))
        if mem is not None:
            mem.requested(f.gpu, fn)
        # run_on_gpu, without its frame; the key only serves the storage policy's queue positions
        # (GPU.positions)
        assert f.device is not None
        f.device.run(fn, self.rec.arrival, ex.body, None if mem is None else (self.rec.ident, fn))

    def _timed(self, done: Callable[[], None], edge: tuple[str, str], t0: float) -> Callable[[], None]:
        """``done`` that first records the edge's passing time (producer's put + the wait since ``t0``)."""
        def landed() -> None:
            self.rec.edges[edge] = self.put_s.get(edge[0], 0.0) + self.c.sim.now - t0
            done()

        return landed

    def _finished(self, fn: str) -> None:
        self._decided(*self.dag.finished(fn, self.scalars.get(fn, _NO_SCALARS)))


class _Exec:
    """One execution of a GPU function in a request: it holds its GPU while it gets its inputs,
    computes and puts its outputs (the module docstring); each step is a method, not a closure."""

    __slots__ = ("r", "f", "compute", "stats", "ready", "t0", "t1", "release", "moves")

    def __init__(self, r: _Request, f: _Fn, cost: tuple[float, float, float]) -> None:
        compute, slo_s, deadline_s = cost  # Cluster._cost
        self.r, self.f, self.compute = r, f, compute
        self.stats = r.rec.fns[f.name] = FnStats(slo_s=slo_s, deadline_s=deadline_s)
        self.ready = r.c.sim.now

    def body(self, release: Callable[[], None]) -> None:
        """Its turn on the GPU: fetch every input at once."""
        r, f, c = self.r, self.f, self.r.c
        gpu = f.gpu
        assert gpu is not None
        self.release = release
        t0 = self.t0 = c.sim.now
        stats = self.stats
        stats.queue_s = t0 - self.ready
        compute = self.compute  # _due(t0, compute, stats.slo_s), without its frame
        if compute <= 0:
            deadline = t0 + MIN_TRANSFER_S
        else:
            d = t0 + stats.slo_s - compute
            m = t0 + MIN_TRANSFER_S
            deadline = m if m > d else d
        location, objects = r.location, r.objects
        ins: list[tuple[str, int, tuple[str, str] | None, bool]] = []  # (from, bytes, edge or None: host data, timed)
        if f.input_bytes:
            ins.append((f.host, f.input_bytes, None, False))
        for edge, nbytes, from_gpu in f.preds:
            loc = location.get(edge)
            if loc is not None:  # else nothing stored for this edge
                ins.append((loc, nbytes, edge, from_gpu))
        if not ins:
            c.sim.schedule(0.0, self.computed)
            return
        done = _countdown(len(ins), self.computed)
        for src, nbytes, e, timed in ins:  # every input at once
            landed = r._timed(done, e, t0) if timed and e else done
            if e is not None and e in objects:
                assert c.memory is not None
                c.memory.fetch(objects[e], gpu, landed, deadline)
            else:
                c.plane.move(src, gpu, nbytes, landed, deadline)

    def computed(self) -> None:
        c = self.r.c
        self.stats.get_s = c.sim.now - self.t0
        c.sim.schedule(self.compute, self.put)

    def put(self) -> None:
        """Store an output per consumer that may still run, send results home."""
        r, f, c, stats = self.r, self.f, self.r.c, self.stats
        gpu = f.gpu
        assert gpu is not None
        mem = c.memory
        stats.compute_s = self.compute
        self.t1 = c.sim.now
        moves: list[tuple[str, str, int]] = []
        allocs = 0
        delay = 0.0
        stored: dict[str, int] = {}
        readers = r.dag.readers(f.name, r.scalars.get(f.name, _NO_SCALARS))
        for edge, dst, nbytes, dst_host in f.succs:
            if dst not in readers:
                continue
            if dst_host is not None:  # a CPU consumer: to its host memory, like a result
                r.location[edge] = dst_host
                moves.append((gpu, dst_host, nbytes))
                continue
            where = gpu if c._store_local else c.store_device(gpu)
            if mem is not None and where in c.gpus:
                key = (r.rec.ident, edge[0], edge[1])
                obj, cost = mem.put(key, nbytes, where, f.name, (r.rec.ident, f.name), r.dep.gpu[dst],
                                    (r.rec.ident, dst), gpu, r.rec.arrival)
                r.objects[edge] = key
                delay += cost
                stored[where] = stored.get(where, 0) + nbytes
                if obj.moving:  # sent to host memory in the background: not the put's copy
                    where = gpu
                elif where != gpu:
                    obj.moving = True  # being written: nobody may move or read it yet
            elif where in c.gpus:
                allocs += 1
            r.location[edge] = where
            if where != gpu:
                moves.append((gpu, where, nbytes))
        if mem is not None:
            for home, n in stored.items():
                mem.stored(home, f.name, n)
        if f.output_bytes:
            moves.append((gpu, f.host, f.output_bytes))
        delay += allocs * c._alloc
        stats.alloc_s = delay
        self.moves = moves
        c.sim.schedule(delay, self.go)

    def go(self) -> None:
        """Start every move of the put at once, all due at one deadline."""
        c = self.r.c
        moves = self.moves
        if not moves:
            c.sim.schedule(0.0, self.done_put)
            return
        now, compute = c.sim.now, self.compute  # _due(now, compute, slo_s), without its frame
        if compute <= 0:
            due = now + MIN_TRANSFER_S
        else:
            d = now + self.stats.slo_s - compute
            m = now + MIN_TRANSFER_S
            due = m if m > d else d
        done = _countdown(len(moves), self.done_put)
        move = c.plane.move
        for a, b, n in moves:
            move(a, b, n, done, due)

    def done_put(self) -> None:
        r, f, c = self.r, self.f, self.r.c
        self.stats.put_s = c.sim.now - self.t1
        r.put_s[f.name] = self.stats.put_s
        if c.memory is not None:
            for edge, _, _, _ in f.succs:
                if edge in r.objects:
                    c.memory.settle(r.objects[edge])
        self.release()
        r._finished(f.name)


def _due(start: float, compute: float, slo: float) -> float:
    """``input_deadline(start, compute)`` given ``slo = slo_for(compute)`` (``FnStats.slo_s``), the same
    float in one frame instead of three: ``max(start + slo - compute, start + MIN_TRANSFER_S)``
    (tests/unit/test_sim_cluster_due.py holds it to the policy). ``_Exec.body`` and ``_Exec.go`` inline
    these lines, without the call."""
    if compute <= 0:
        return start + MIN_TRANSFER_S
    d = start + slo - compute
    m = start + MIN_TRANSFER_S
    return m if m > d else d


def _countdown(k: int, then: Callable[[], None]) -> Callable[[], None]:
    """A callback that calls ``then`` on its ``k``-th call (``then`` itself for one: no count to keep)."""
    if k == 1:
        return then
    left = [k]

    def one() -> None:
        left[0] -= 1
        if left[0] == 0:
            then()

    return one
