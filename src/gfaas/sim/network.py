"""Flow-level network model: transfers as fluid flows on multi-hop paths.

Each flow crosses a list of directed edges of a :class:`~gfaas.topology.Topology`. Rates follow
max-min fairness over the edges' capacities, with an optional per-flow cap: a flow whose rate the
policy set (an SLO share, a path reservation) gets at most that cap, and whatever it leaves on a link
is shared by the others. Rates are recomputed whenever a flow starts, ends or has its cap changed,
which is exact for piecewise-constant rates.

A multi-hop flow streams at its bottleneck rate from the first byte: chunked pipelining is taken as
perfect (no fill time of the store-and-forward stages), which favours multi-hop paths by at most
one chunk's time per intermediate stage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..errors import ConfigError
from ..topology import GB, Topology
from .kernel import Event, Simulator

EdgeKey = tuple[str, str]
_EPS_BYTES = 1e-6


class Flow:
    """One fluid flow. ``rate`` is in bytes per second; ``remaining`` in bytes."""

    __slots__ = ("cap", "done", "edges", "ident", "on_done", "rate", "remaining")

    def __init__(self, ident: int, edges: tuple[EdgeKey, ...], nbytes: float, cap: float | None,
                 on_done: Callable[[], None]) -> None:
        self.ident = ident
        self.edges = edges
        self.remaining = float(nbytes)
        self.cap = cap
        self.on_done = on_done
        self.rate = 0.0
        self.done = False


class Network:
    """The fluid network of one simulation; every edge of the topology is a shared resource."""

    def __init__(self, sim: Simulator, topology: Topology) -> None:
        self.sim = sim
        self.topology = topology
        self.capacity: dict[EdgeKey, float] = {(e.src, e.dst): e.gbps * GB for e in topology.edges()}
        self.flows: dict[int, Flow] = {}
        self._seq = 0
        self._last = sim.now
        self._next: Event | None = None
        self.bytes_moved: dict[EdgeKey, float] = {}

    # ---- public ---------------------------------------------------------------------------------
    def start(self, hops: Sequence[str], nbytes: float, on_done: Callable[[], None],
              cap_gbps: float | None = None) -> Flow:
        """Start moving ``nbytes`` along ``hops``; ``on_done()`` runs when the last byte arrives."""
        edges = tuple(zip(hops[:-1], hops[1:], strict=True))
        for e in edges:
            if e not in self.capacity:
                raise ConfigError(f"path {'->'.join(hops)} uses {e[0]}->{e[1]}, which is not a link of "
                                  f"topology {self.topology.name!r}")
        if nbytes < 0:
            raise ConfigError(f"a flow cannot carry {nbytes} bytes; give a size >= 0")
        self._advance()
        self._seq += 1
        cap = None if cap_gbps is None else cap_gbps * GB
        flow = Flow(self._seq, edges, nbytes, cap, on_done)
        if not edges or nbytes <= _EPS_BYTES:
            flow.done = True
            self.sim.schedule(0.0, on_done)
            return flow
        self.flows[flow.ident] = flow
        self._reschedule()
        return flow

    def set_cap(self, flow: Flow, cap_gbps: float | None) -> None:
        """Change a flow's rate cap (a new SLO share); takes effect now."""
        self.set_caps([(flow, cap_gbps)])

    def set_caps(self, caps: Sequence[tuple[Flow, float | None]]) -> None:
        """Change several caps with one re-allocation of rates."""
        self._advance()
        for flow, cap_gbps in caps:
            if not flow.done:
                flow.cap = None if cap_gbps is None else cap_gbps * GB
        self._reschedule()

    def cancel(self, flow: Flow) -> float:
        """Stop a flow without calling its callback; returns the bytes it had left."""
        if flow.done:
            return 0.0
        self._advance()
        flow.done = True
        del self.flows[flow.ident]
        self._reschedule()
        return flow.remaining

    # ---- internals ------------------------------------------------------------------------------
    def _advance(self) -> None:
        now = self.sim.now
        dt = now - self._last
        if dt > 0:
            for f in self.flows.values():
                moved = f.rate * dt
                f.remaining -= moved
                for e in f.edges:
                    self.bytes_moved[e] = self.bytes_moved.get(e, 0.0) + moved
        self._last = now

    def _allocate(self) -> None:
        """Max-min fair rates with per-flow caps (progressive filling)."""
        flows = list(self.flows.values())
        users: dict[EdgeKey, list[Flow]] = {}
        for f in flows:
            f.rate = 0.0
            for e in f.edges:
                users.setdefault(e, []).append(f)
        left = {e: self.capacity[e] for e in users}
        count = {e: len(fs) for e, fs in users.items()}
        active = dict.fromkeys(flows)  # ordered, so float sums (and runs) are reproducible
        while active:
            # The tightest constraint: an edge's equal share, or a flow's own cap.
            share = min((left[e] / n for e, n in count.items() if n), default=math.inf)
            for f in active:
                if f.cap is not None:
                    share = min(share, f.cap - f.rate)
            share = max(share, 0.0)
            for f in active:
                f.rate += share
            for e, n in count.items():
                left[e] -= share * n
            frozen = [f for f in active
                      if (f.cap is not None and f.rate >= f.cap * (1 - 1e-12))
                      or any(left[e] <= self.capacity[e] * 1e-12 for e in f.edges)]
            if not frozen:  # numerical safety: nothing binds (cannot happen with finite capacities)
                break
            for f in frozen:
                del active[f]
                for e in f.edges:
                    count[e] -= 1

    def _reschedule(self) -> None:
        if self._next is not None:
            self.sim.cancel(self._next)
            self._next = None
        if not self.flows:
            return
        self._allocate()
        soonest = math.inf
        for f in self.flows.values():
            if f.rate > 0:
                soonest = min(soonest, max(f.remaining, 0.0) / f.rate)
        if soonest < math.inf:
            self._next = self.sim.schedule(soonest, self._complete, priority=-1)

    def _complete(self) -> None:
        self._next = None
        self._advance()
        finished = [f for f in self.flows.values() if f.remaining <= max(_EPS_BYTES, f.rate * 1e-12)]
        for f in finished:
            f.done = True
            f.remaining = 0.0
            del self.flows[f.ident]
        self._reschedule()
        for f in finished:
            f.on_done()
