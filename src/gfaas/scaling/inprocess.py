"""An in-process stand-in for :class:`~gfaas.scaling.manager.Manager`: the same node logic
(:class:`~gfaas.scaling.node.Node`'s serving methods) and the same events, without namespaces,
processes or sockets, so the serving loop is tested everywhere (no root needed).

Blocks move by the schedule one step per ``polls_per_step`` polls of the serving loop (or sooner,
whenever no node has work queued): the step's transfers arrive as ``block`` events, and ``done``
after the last step.
Node work (``fwd``, ``export``, ``import``, ``release``) runs when sent, in order, like a node's
control loop; a stage's hidden states go straight to the next stage's node (a call instead of a
connection), which checks them against what the manager announced, as a real node does. Deterministic: the same requests and schedule give the same events.
"""

from __future__ import annotations

import queue
import time
from typing import Any

from ..models.llm import LlamaConfig, aligned_buffer, packed_size, preset, random_blocks
from ..policy.multicast import Schedule
from . import frames as F
from .node import Node
from .warm import warm_orders


class _QueueNode(Node):
    """A node whose frames go to the in-process manager's queue."""

    def __init__(self, me: int, sink: queue.Queue[tuple[int, F.Frame]]) -> None:
        super().__init__(out=None)  # type: ignore[arg-type]
        self.me, self._sink = me, sink

        self.peers: list[_QueueNode] = []

    def emit(self, kind: str, meta: dict[str, Any] | None = None, payload: bytes | memoryview = b"") -> None:
        self._sink.put((self.me, F.Frame(kind, meta or {}, bytes(payload))))

    def _send_hidden(self, dst: int, meta: dict[str, Any], payload: bytes) -> None:
        self.peers[dst]._on_hidden(self.me, meta, payload)  # the next stage runs at once, in order


class InProcessManager:
    """``nodes`` in-process nodes of a model of ``blocks`` blocks, nodes ``0..sources-1`` loaded."""

    def __init__(self, nodes: int, cfg: LlamaConfig | str, blocks: int, sources: int = 1, seed: int = 0,
                 polls_per_step: int = 4) -> None:
        self.polls_per_step = polls_per_step
        self.cfg = preset(cfg) if isinstance(cfg, str) else cfg
        self.blocks, self.sources = blocks, sources
        self.sizes = [packed_size(self.cfg, b, blocks) for b in range(blocks)]
        self._packed = random_blocks(self.cfg, seed, blocks)
        self._events: queue.Queue[tuple[int, F.Frame]] = queue.Queue()
        self.nodes = [_QueueNode(i, self._events) for i in range(nodes)]
        for n in self.nodes:
            n.peers = self.nodes
            n.cfg, n.blocks, n.sizes, n.floor_s = self.cfg, blocks, self.sizes, 0.0
        self._steps: list[list[tuple[int, int, int]]] = []
        self._step = 0
        self._polls = 0
        self._run = -1
        self._done_nodes: list[int] = []

    def start_multicast(self, schedule: Schedule) -> tuple[int, float]:
        self._run += 1
        for i, n in enumerate(self.nodes):
            n.held.clear()
            n.stages.clear()
            n.run_id = self._run
            if i < schedule.sources:
                for b, blk in enumerate(self._packed):
                    n.held[b] = memoryview(blk)
        self._steps = [[(tr.dst, tr.block, t) for tr in step] for t, step in enumerate(schedule.steps)]
        self._done_nodes = list(range(len(self.nodes)))
        self._step = self._polls = 0
        return self._run, time.monotonic()

    def start_warm(self, nodes: list[int] | range, bytes_per_s: float) -> tuple[int, float]:
        """A warm scale-out: each of ``nodes`` gets one more block per step, in its
        :func:`~gfaas.scaling.warm.warm_orders` order (the rate is not emulated here)."""
        self._run += 1
        for i, n in enumerate(self.nodes):
            n.run_id = self._run
            if i < self.sources:
                n.held = {b: memoryview(blk) for b, blk in enumerate(self._packed)}
            elif i in nodes:
                n.held.clear()
                n.stages.clear()
        orders = warm_orders(len(nodes), self.blocks)
        self._steps = [[(n, order[t], t) for n, order in zip(nodes, orders, strict=True)] for t in range(self.blocks)]
        self._step = self._polls = 0
        self._done_nodes = list(nodes)
        return self._run, time.monotonic()

    def send(self, node: int, kind: str, meta: dict[str, Any], payload: bytes | memoryview = b"") -> None:
        n = self.nodes[node]
        if kind == "fwd":
            n.fwd(meta, memoryview(payload))
        elif kind == "export":
            n.export(meta)
        elif kind == "import":
            n.import_(meta, memoryview(payload))
        elif kind == "release":
            n.release(meta)
        else:
            raise ValueError(f"the in-process manager does not take {kind!r} frames")

    def poll_event(self, timeout: float) -> tuple[int, F.Frame] | None:
        self._polls += 1
        if self._events.empty() or self._polls >= self.polls_per_step:
            self._polls = 0
            t = self._step
            self._step += 1
            if t < len(self._steps):
                for dst, blk, step in self._steps[t]:
                    buf = aligned_buffer(self.sizes[blk])
                    buf[:] = self._packed[blk]
                    self.nodes[dst].held[blk] = buf
                    self._events.put((dst, F.Frame("block", {"run": self._run, "block": blk, "step": step})))
            elif t == len(self._steps):
                for i in self._done_nodes:
                    self._events.put((i, F.Frame("done", {"run": self._run, "sent": []})))
        try:
            return self._events.get_nowait()
        except queue.Empty:
            return None
