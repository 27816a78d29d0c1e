"""Serving requests while a model scales out (seed 002 §4.3-4.4), on the real testbed.

One scale-out is one multicast run (:meth:`Manager.start_multicast`); while it runs, the manager
replays a burst of requests and serves them on whatever instances exist:

* the sources hold the whole model from the start (hot) and serve locally;
* ``gfaas``: a :class:`~gfaas.policy.pipelines.PipelinePlanner` turns each block arrival into
  execution pipelines over partly loaded nodes; a pipeline of ``s`` stages takes up to ``s``
  requests at once, each at a different stage (2D pipelining: stages work on different requests at
  the same time); hidden states go from stage to stage node to node over the links
  (:meth:`_send_pass`), and only the last stage's token comes back; when one of its
  nodes holds the whole model the pipeline retires and each of its requests, at its next token
  boundary, carries its state (tokens and every layer's KV cache, exported by the stages and merged)
  to that node, which goes on serving it locally;
* ``tree`` and ``load-then-serve``: a node serves only once it holds the whole model (FaaSNet's
  tree multicast, or ServerlessLLM-like loading of the whole model node after node from the source).

Requests wait in one FIFO queue; an instance takes the next one while it has fewer than its
capacity in flight (``local_capacity`` for a node, one per stage for a pipeline). Decoding is
greedy and every pass returns the next token, so every system must produce the tokens of a
one-process run.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import ConfigError, ScalingError
from ..models.llm import LlamaConfig, RequestState
from ..policy.multicast import Schedule
from ..policy.pipelines import PipelinePlanner
from . import frames as F
from .workload import Request

log = logging.getLogger("gfaas.scaling")

class Executor(Protocol):
    """What the serving loop needs of the nodes: :class:`~gfaas.scaling.manager.Manager` (real
    processes and links) or :class:`~gfaas.scaling.inprocess.InProcessManager`."""

    cfg: LlamaConfig
    blocks: int

    def start_multicast(self, schedule: Schedule) -> tuple[int, float]: ...

    def start_warm(self, nodes: list[int], bytes_per_s: float) -> tuple[int, float]: ...

    def send(self, node: int, kind: str, meta: dict[str, Any], payload: bytes | memoryview = b"") -> None: ...

    def poll_event(self, timeout: float) -> tuple[int, F.Frame] | None: ...


SYSTEMS: dict[str, str] = {"gfaas": "binomial", "tree": "tree", "load-then-serve": "sequential"}


@dataclass
class Instance:
    """A serving instance: one node with the whole model, or a pipeline of (node, first, last) stages."""

    iid: int
    stages: list[tuple[int, int, int]]
    capacity: int
    kind: str  # "local" or "pipeline"
    members: set[int] = field(default_factory=set)
    retiring: bool = False
    pipeline_id: int | None = None


@dataclass
class _Run:
    req: Request
    tokens: list[int]
    inst: Instance | None = None
    out: list[int] = field(default_factory=list)
    first_token_s: float | None = None
    done_s: float | None = None
    parts: list[RequestState] = field(default_factory=list)
    target: Instance | None = None


@dataclass
class ServeResult:
    """Per request: TTFT (seconds from arrival to the first token) and the generated tokens; every
    token's completion time (seconds after the scale-out started); when each instance came up."""

    system: str
    ttft_s: dict[int, float]
    tokens: dict[int, list[int]]
    token_times: list[float]
    instances: list[tuple[float, str, tuple[int, ...]]]
    migrations: int
    multicast_s: float
    hidden_hops: int = 0  # passes whose last stage got its input from another node's stage


class Server:
    """Serve ``requests`` during one scale-out of ``mgr``'s nodes by ``system``."""

    def __init__(self, mgr: Executor, system: str, requests: Sequence[Request], local_capacity: int = 2) -> None:
        if system not in SYSTEMS:
            raise ConfigError(f"system {system!r} is unknown; one of {', '.join(SYSTEMS)}")
        self.mgr, self.system, self.requests = mgr, system, list(requests)
        self.local_capacity = local_capacity
        self.B = mgr.blocks
        self._ids = itertools.count()
        self.instances: list[Instance] = []
        self.local_of: dict[int, Instance] = {}
        self.by_pipeline: dict[int, Instance] = {}
        self.queue: deque[_Run] = deque()
        self.runs: dict[int, _Run] = {}
        self.held: dict[int, set[int]] = {}
        self.log: list[tuple[float, str, tuple[int, ...]]] = []
        self.token_times: list[float] = []
        self.migrations = 0
        self.hidden_hops = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    # ---- instances -------------------------------------------------------------------------------
    def _add(self, stages: list[tuple[int, int, int]], kind: str, pipeline_id: int | None = None) -> Instance:
        cap = self.local_capacity if kind == "local" else len(stages)
        inst = Instance(next(self._ids), stages, cap, kind, pipeline_id=pipeline_id)
        self.instances.append(inst)
        if kind == "local":
            self.local_of[stages[0][0]] = inst
        if pipeline_id is not None:
            self.by_pipeline[pipeline_id] = inst
        self.log.append((self.now(), kind, tuple(s[0] for s in stages)))
        return inst

    def _on_block(self, planner: PipelinePlanner | None, node: int, block: int, step: int) -> None:
        if planner is None:
            self.held.setdefault(node, set()).add(block)
            if len(self.held[node]) == self.B:
                self._add([(node, 0, self.B - 1)], "local")
            return
        retired: list[Instance] = []
        for ch in planner.on_blocks(step, {node: [block]}):
            if ch.kind == "formed" and ch.pipeline is not None:
                st = [(s.node, s.start, s.stop - 1) for s in ch.pipeline.stages]
                self._add(st, "pipeline", ch.pipeline.id)
            elif ch.kind == "retired" and ch.pipeline is not None:
                inst = self.by_pipeline.pop(ch.pipeline.id)
                inst.retiring = True
                retired.append(inst)
                self.log.append((self.now(), "retired", tuple(s[0] for s in inst.stages)))
            elif ch.kind == "local" and ch.node is not None:
                self._add([(ch.node, 0, self.B - 1)], "local")
        for inst in retired:
            target = next(self.local_of[n] for n, _, _ in inst.stages if n in self.local_of)
            for rid in inst.members:
                self.runs[rid].target = target

    # ---- requests --------------------------------------------------------------------------------
    def _send_pass(self, run: _Run, payload: bytes) -> None:
        """Start one pass of ``run`` over its instance: the first stage gets the tokens; each later
        stage is told what to expect from the node before it (request, token step, its blocks, rows),
        announced before the first stage starts so that it is known when the hidden states arrive."""
        assert run.inst is not None
        stages, rid, step = run.inst.stages, run.req.rid, len(run.out)
        rows = len(payload) // 8
        for j in range(len(stages) - 1, -1, -1):
            node, first, last = stages[j]
            meta: dict[str, Any] = {"rid": rid, "step": step, "first": first, "last": last}
            if j + 1 < len(stages):
                meta["next"] = [stages[j + 1][0], stages[j + 1][1]]
            if j > 0:
                self.mgr.send(node, "fwd", {**meta, "prev": stages[j - 1][0], "rows": rows})
            else:
                self.mgr.send(node, "fwd", meta, payload)

    def _tokens_payload(self, run: _Run) -> bytes:
        fed = len(run.tokens) - 1 if run.out else 0  # after a token, only it is new to the caches
        return np.asarray(run.tokens[fed:], dtype="<i8").tobytes()

    def _dispatch(self) -> None:
        while self.queue:
            free = [i for i in self.instances if not i.retiring and len(i.members) < i.capacity]
            if not free:
                return
            inst = min(free, key=lambda i: (len(i.members) / i.capacity, i.kind != "local", i.iid))
            run = self.queue.popleft()
            run.inst = inst
            inst.members.add(run.req.rid)
            self._send_pass(run, self._tokens_payload(run))

    def _on_out(self, run: _Run, meta: dict[str, object], payload: bytes | memoryview) -> None:
        inst = run.inst
        assert inst is not None
        if meta.get("first") != inst.stages[-1][1] or meta.get("step") != len(run.out):
            raise ScalingError(f"request {run.req.rid}: a token from blocks {meta.get('first')}.. at step "
                               f"{meta.get('step')}, expected blocks {inst.stages[-1][1]}.. at step {len(run.out)}")
        if meta.get("via") is not None:
            self.hidden_hops += 1
        tok = int(np.frombuffer(payload, dtype="<i8")[0])
        t = self.now()
        run.out.append(tok)
        run.tokens.append(tok)
        self.token_times.append(t)
        if run.first_token_s is None:
            run.first_token_s = t
        if len(run.out) >= run.req.gen:
            run.done_s = t
            inst.members.discard(run.req.rid)
            for node in {n for n, _, _ in inst.stages}:
                self.mgr.send(node, "release", {"rid": run.req.rid})
            self._dispatch()
        elif run.target is not None:
            self._migrate(run)
        else:
            self._send_pass(run, self._tokens_payload(run))

    def _migrate(self, run: _Run) -> None:
        """Ask every stage of the retiring pipeline for its part of the request's KV cache."""
        assert run.inst is not None
        run.parts = []
        for node, first, last in run.inst.stages:
            self.mgr.send(node, "export", {"rid": run.req.rid, "first": first, "last": last})

    def _on_state(self, run: _Run, payload: bytes | memoryview) -> None:
        assert run.inst is not None and run.target is not None
        run.parts.append(RequestState.from_bytes(bytes(payload), self.mgr.cfg))
        if len(run.parts) < len(run.inst.stages):
            return
        state = RequestState.merge(run.tokens, [p.kv for p in run.parts])
        run.inst.members.discard(run.req.rid)
        target, run.target = run.target, None
        node = target.stages[0][0]
        self.mgr.send(node, "import", {"rid": run.req.rid, "first": 0, "last": self.B - 1}, state.to_bytes(self.mgr.cfg))
        run.inst = target
        target.members.add(run.req.rid)
        self.migrations += 1
        self._send_pass(run, self._tokens_payload(run))
        self._dispatch()

    # ---- the loop --------------------------------------------------------------------------------
    def run(self, schedule: Schedule, timeout: float = 300.0) -> ServeResult:
        """Serve during a cold scale-out: the multicast ``schedule`` from its sources."""
        planner = PipelinePlanner.for_schedule(schedule) if self.system == "gfaas" else None
        run_id, t0 = self.mgr.start_multicast(schedule)
        return self._serve(planner, run_id, t0, schedule.sources, set(range(schedule.nodes)), timeout)

    def run_warm(self, nodes: Sequence[int], sources: int, bytes_per_s: float, timeout: float = 300.0) -> ServeResult:
        """Serve during a warm scale-out: ``nodes`` load the model from their host-memory caches at
        ``bytes_per_s`` each, in rotated block orders; ``gfaas`` lets them join execution pipelines
        while they load, the other systems serve from a node once it holds the whole model. Nodes
        ``0..sources-1`` hold it from the start."""
        group = list(nodes)
        planner = PipelinePlanner([group], self.B) if self.system == "gfaas" else None
        run_id, t0 = self.mgr.start_warm(group, bytes_per_s)
        return self._serve(planner, run_id, t0, sources, set(group), timeout)

    def _serve(self, planner: PipelinePlanner | None, run_id: int, t0: float, sources: int, loading: set[int],
               timeout: float) -> ServeResult:
        self.t0 = t0
        for src in range(sources):
            self._add([(src, 0, self.B - 1)], "local")
        pending = sorted(self.requests, key=lambda r: (r.arrival_s, r.rid))
        nxt = 0
        done_nodes: set[int] = set()
        multicast_s = 0.0
        deadline = time.monotonic() + timeout
        finished = 0
        while finished < len(pending) or len(done_nodes) < len(loading):
            while nxt < len(pending) and pending[nxt].arrival_s <= self.now():
                r = pending[nxt]
                self.runs[r.rid] = _Run(r, list(r.prompt))
                self.queue.append(self.runs[r.rid])
                nxt += 1
            self._dispatch()
            wait = pending[nxt].arrival_s - self.now() if nxt < len(pending) else 1.0
            if time.monotonic() > deadline:
                raise ScalingError(f"{self.system}: serving did not finish within {timeout:.0f} s")
            ev = self.mgr.poll_event(max(0.0, min(wait, 1.0)) + 1e-4)
            if ev is None:
                continue
            node, fr = ev
            self._handle(node, fr, planner, run_id, done_nodes)
            if fr.kind == "done" and len(done_nodes) == len(loading):
                multicast_s = self.now()
            finished = sum(1 for r in self.runs.values() if r.done_s is not None)
        return ServeResult(
            self.system,
            {rid: r.first_token_s - r.req.arrival_s for rid, r in self.runs.items() if r.first_token_s is not None},
            {rid: r.out for rid, r in self.runs.items()},
            sorted(self.token_times), self.log, self.migrations, multicast_s, self.hidden_hops)

    def _handle(self, node: int, fr: F.Frame, planner: PipelinePlanner | None, run_id: int,
                done_nodes: set[int]) -> None:
        if fr.kind == "block" and fr.meta.get("run") == run_id:
            self._on_block(planner, node, int(fr.meta["block"]), int(fr.meta["step"]))
        elif fr.kind == "done" and fr.meta.get("run") == run_id:
            done_nodes.add(node)
        elif fr.kind == "out" and not fr.meta.get("imported"):
            self._on_out(self.runs[int(F.need(fr.meta, "rid", int))], fr.meta, fr.payload)
        elif fr.kind == "state":
            self._on_state(self.runs[int(F.need(fr.meta, "rid", int))], fr.payload)
