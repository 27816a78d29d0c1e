"""A cluster running workflows: GPUs time-shared by function instances, a data plane, requests.

Execution model (the same for every system, so differences come from the data plane only):

- Each GPU function of a deployed workflow is bound to one GPU. A GPU runs one function
  execution at a time; waiting executions sit in per-function FIFO queues and the GPU takes the
  one whose request arrived first (time-sharing, as in seed 001 §4.3.2's footnote).
- An execution holds its GPU while it *gets* its inputs, computes, and *puts* its outputs, the
  way a function instance is busy during its own I/O. Its inputs are the host data it starts from
  and its predecessors' objects, fetched in parallel; its outputs are one object per outgoing edge,
  stored as the system's ``store`` mode says, plus results sent back to host memory.
- CPU functions run on the host without contention (cores are not the bottleneck studied).
- A conditional edge is taken with its probability, drawn per request from a seeded RNG; a function
  none of whose incoming edges is taken is skipped.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from ..policy import group_nodes, place_workflow
from ..topology import Topology
from .dataplane import DataPlane
from .kernel import Simulator
from .profiles import Profile
from .systems import CUDA_MALLOC_S, POOL_ALLOC_S, SystemConfig
from .workflows import Workflow

log = logging.getLogger(__name__)

SLO_FACTOR = 1.5  # SLO = 1.5x the profiled execution time (seed 001 §4.3.2, §6.3)


@dataclass
class FnStats:
    queue_s: float = 0.0
    get_s: float = 0.0
    compute_s: float = 0.0
    put_s: float = 0.0


@dataclass
class RequestRecord:
    workflow: str
    ident: int
    arrival: float
    finish: float = -1.0
    fns: dict[str, FnStats] = field(default_factory=dict)

    @property
    def latency(self) -> float:
        return self.finish - self.arrival

    @property
    def passing_s(self) -> float:
        """Time spent getting and putting data, summed over the request's GPU functions."""
        return sum(s.get_s + s.put_s for s in self.fns.values())


class GPU:
    """One GPU: per-function FIFO queues, one execution at a time, oldest request first."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.queues: dict[str, deque[tuple[float, Callable[[], None]]]] = {}
        self.busy = False

    def submit(self, function: str, arrival: float, start: Callable[[], None]) -> None:
        self.queues.setdefault(function, deque()).append((arrival, start))

    def next(self) -> Callable[[], None] | None:
        best = None
        for q in self.queues.values():
            if q and (best is None or q[0][0] < best[0][0]):
                best = q
        return best.popleft()[1] if best is not None else None


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
        self.records: list[RequestRecord] = []
        self._ids = 0
        self.on_finish: Callable[[RequestRecord], None] | None = None

    # ---- deployment -----------------------------------------------------------------------------
    def deploy(self, wf: Workflow, replicas: int = 1, gpus: Sequence[str] | None = None,
               nodes: Sequence[int] | None = None) -> list[Deployment]:
        """Place ``replicas`` copies of ``wf``; each takes GPUs not yet used, sharing when they run out."""
        if not self.topo.gpus:
            raise ConfigError(f"topology {self.topo.name!r} has no GPU to deploy {wf.name!r} on")
        out: list[Deployment] = []
        for r in range(replicas):
            node_of = self._group(wf, nodes)
            gpu_of: dict[str, str] = {}
            for node in sorted(set(node_of.values())):
                fns = [f for f in wf.gpu_functions if node_of[f] == node]
                pool = [g for g in (gpus or self.topo.gpus) if self.topo.device(g).node == node]
                used = {g for ds in self.deployments.values() for d in ds for g in d.gpu.values()}
                used |= {g for d in out for g in d.gpu.values()} | set(gpu_of.values())
                free = [g for g in pool if g not in used] or pool
                edges = [(e.src, e.dst, e.nbytes) for e in wf.edges if e.src in fns and e.dst in fns]
                gpu_of.update(place_workflow(self.topo, fns, edges, free,
                                             topology_aware=self.cfg.placement == "mapa",
                                             seed=self.rng.randrange(1 << 30) + r))
            out.append(Deployment(wf, gpu_of, node_of))
        self.deployments.setdefault(wf.name, []).extend(out)
        return out

    def _group(self, wf: Workflow, nodes: Sequence[int] | None) -> dict[str, int]:
        """Nodes per function. Given several nodes, a replica is spread evenly over them (the
        inter-node experiments study exactly that case) with group_nodes keeping the cut small."""
        use = list(nodes) if nodes is not None else self.topo.nodes[:1]
        if len(use) == 1:
            return {f.name: use[0] for f in wf.functions}
        order = wf.topological_order()
        gpu_fns = [f for f in order if f in wf.gpu_functions]
        share = -(-len(gpu_fns) // len(use))
        slots = {n: share for n in use}
        edges = [(e.src, e.dst, e.nbytes) for e in wf.edges if e.src in gpu_fns and e.dst in gpu_fns]
        placed = group_nodes(gpu_fns, edges, slots)
        out: dict[str, int] = {}
        last = placed[gpu_fns[0]] if gpu_fns else use[0]
        for f in order:  # CPU functions run on the host of the node of the next GPU function
            out[f] = placed.get(f, last)
            last = out[f]
        return out

    # ---- requests -------------------------------------------------------------------------------
    def submit(self, workflow: str, at: float) -> None:
        """Schedule one request of ``workflow`` arriving at absolute time ``at``."""
        self.sim.at(at, self._arrive, workflow)

    def submit_many(self, workflow: str, times: Sequence[float] | np.ndarray) -> None:
        for t in times:
            self.submit(workflow, float(t))

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
    def run_on_gpu(self, gpu: str, function: str, arrival: float, body: Callable[[Callable[[], None]], None]) -> None:
        """Queue ``body(release)`` on ``gpu``; ``body`` must call ``release()`` when the execution ends."""
        g = self.gpus[gpu]

        def start() -> None:
            g.busy = True

            def release() -> None:
                g.busy = False
                nxt = g.next()
                if nxt is not None:
                    nxt()

            body(release)

        g.submit(function, arrival, start)
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
    """One request walking through its workflow's DAG."""

    def __init__(self, cluster: Cluster, dep: Deployment, rec: RequestRecord) -> None:
        self.c = cluster
        self.dep = dep
        self.rec = rec
        wf = dep.workflow
        self.order = wf.topological_order()
        taken: dict[tuple[str, str], bool] = {}
        active: set[str] = set()
        for f in self.order:
            preds = wf.preds(f)
            if not preds or any(taken[(e.src, e.dst)] for e in preds):
                active.add(f)
            for e in wf.succs(f):
                taken[(e.src, e.dst)] = f in active and (e.prob >= 1 or cluster.rng.random() < e.prob)
        self.taken = taken
        self.active = active
        self.waiting = {f: sum(1 for e in wf.preds(f) if taken[(e.src, e.dst)]) for f in active}
        self.location: dict[tuple[str, str], str] = {}  # edge -> device holding its object
        self.left = len(active)

    def start(self) -> None:
        for f in self.order:
            if f in self.active and self.waiting[f] == 0:
                self._run(f)

    def _host(self, fn: str) -> str:
        return self.c.topo.host_of(self.dep.node[fn])

    def _run(self, fn: str) -> None:
        spec = self.dep.workflow.function(fn)
        c = self.c
        if spec.kind == "cpu":
            for e in self.dep.workflow.succs(fn):
                self.location[(e.src, e.dst)] = self._host(fn)
            c.sim.schedule(c.profile.seconds(spec.model, None, spec.batch), self._finished, fn)
            return
        gpu = self.dep.gpu[fn]
        stats = FnStats()
        self.rec.fns[fn] = stats
        ready = c.sim.now
        compute = c.profile.seconds(spec.model, c.topo.device(gpu).model, spec.batch)
        deadline_slack = max(compute * (SLO_FACTOR - 1.0), 1e-3)

        def body(release: Callable[[], None]) -> None:
            stats.queue_s = c.sim.now - ready
            t0 = c.sim.now
            gets: list[tuple[str, int]] = []
            if spec.input_bytes:
                gets.append((self._host(fn), spec.input_bytes))
            for e in self.dep.workflow.preds(fn):
                if self.taken[(e.src, e.dst)]:
                    gets.append((self.location[(e.src, e.dst)], e.nbytes))
            _all(c, [(src, gpu, n) for src, n in gets], c.sim.now + deadline_slack, lambda: computed(t0, release))

        def computed(t0: float, release: Callable[[], None]) -> None:
            stats.get_s = c.sim.now - t0
            c.sim.schedule(compute, put, release)

        def put(release: Callable[[], None]) -> None:
            stats.compute_s = compute
            t1 = c.sim.now
            moves: list[tuple[str, str, int]] = []
            allocs = 0
            for e in self.dep.workflow.succs(fn):
                if not self.taken[(e.src, e.dst)]:
                    continue
                where = c.store_device(gpu)
                self.location[(e.src, e.dst)] = where
                if c.topo.device(where).kind == "gpu":
                    allocs += 1
                if where != gpu:
                    moves.append((gpu, where, e.nbytes))
            if spec.output_bytes:
                moves.append((gpu, self._host(fn), spec.output_bytes))
            delay = allocs * c.alloc_s()

            def go() -> None:
                _all(c, moves, c.sim.now + deadline_slack, lambda: stored(t1, release))

            c.sim.schedule(delay, go)

        def stored(t1: float, release: Callable[[], None]) -> None:
            stats.put_s = c.sim.now - t1
            release()
            self._finished(fn)

        c.run_on_gpu(gpu, fn, self.rec.arrival, body)

    def _finished(self, fn: str) -> None:
        self.left -= 1
        for e in self.dep.workflow.succs(fn):
            if self.taken[(e.src, e.dst)]:
                self.waiting[e.dst] -= 1
                if self.waiting[e.dst] == 0:
                    self._run(e.dst)
        if self.left == 0:
            self.rec.finish = self.c.sim.now
            if self.c.on_finish is not None:
                self.c.on_finish(self.rec)


def _all(c: Cluster, moves: Sequence[tuple[str, str, int]], deadline: float, then: Callable[[], None]) -> None:
    """Start every move at once; call ``then`` when the last one has landed."""
    if not moves:
        c.sim.schedule(0.0, then)
        return
    left = [len(moves)]

    def one() -> None:
        left[0] -= 1
        if left[0] == 0:
            then()

    for src, dst, n in moves:
        c.plane.move(src, dst, n, one, deadline)
