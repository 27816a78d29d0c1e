"""Flow-level network model: transfers as fluid flows on multi-hop paths.

Each flow crosses a list of directed edges of a :class:`~gfaas.topology.Topology`. Rates follow
max-min fairness over the edges' capacities, with an optional per-flow cap: a flow whose rate the
policy set (an SLO share, a path reservation) gets at most that cap, and whatever it leaves on a link
is shared by the others. Rates are recomputed whenever a flow starts, ends or has its cap changed,
which is exact for piecewise-constant rates.

A multi-hop flow streams at its bottleneck rate from the first byte: chunked pipelining is taken as
perfect (no fill time of the store-and-forward stages), which favours multi-hop paths by at most
one chunk's time per intermediate stage.

Cost at cluster scale (see ``docs/design/simulator.md``). Max-min rates of flows that share no edge,
directly or through other flows, do not depend on each other, so a change re-runs the allocation
only over the *component* of the flow/edge graph it touches (on a cluster: mostly one node's few
flows), not over every live flow. A flow's ``remaining`` is advanced lazily, when its own rate
changes, and the bytes each edge carried are summed then too (``bytes_moved`` adds the part in
flight when read). Finish times sit in a heap, and one kernel event (priority -1) fires at the
soonest; it is moved only when that time changes. :meth:`Network.begin` / :meth:`Network.commit`
group the changes of one instant into one re-allocation (no time passes in between, so the rates are
the same as re-allocating after each change). All of this gives the same rates as one global
max-min allocation up to float rounding (the per-round shares are summed in a different order);
``tests/unit/test_sim_network_partition.py`` checks it against a global reference.

:class:`PyNetwork` below is the reference; :class:`NativeNetwork` is the same model in Rust
(``native/src/network.rs``), whose floats come from the same operations in the same order, so runs
agree bit for bit. ``Network`` is the native one when the simulator's core is (``kernel.CORE``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..native import native_class
from ..topology import GB, Topology
from .kernel import CORE, Event, Simulator

EdgeKey = tuple[str, str]
_EPS_BYTES = 1e-6
#: finish times within this many seconds after a completion event are checked for being done too
#: (the exact test is the byte threshold in ``_complete``; this only bounds the candidates)
_SLACK_S = 1e-9


class Flow:
    """One fluid flow. ``rate`` is in bytes per second; ``remaining`` in bytes at time ``t`` (use
    :meth:`Network.left` for the bytes left now)."""

    __slots__ = ("cap", "done", "edges", "finish", "ident", "on_done", "rate", "remaining", "t")

    def __init__(self, ident: int, edges: tuple[EdgeKey, ...], nbytes: float, cap: float | None,
                 on_done: Callable[[], None], t: float = 0.0) -> None:
        self.ident = ident
        self.edges = edges
        self.remaining = float(nbytes)
        self.cap = cap
        self.on_done = on_done
        self.rate = 0.0
        self.done = False
        self.t = t
        self.finish = math.inf


def _ident(f: Flow) -> int:
    return f.ident


class PyNetwork:
    """The fluid network of one simulation; every edge of the topology is a shared resource."""

    def __init__(self, sim: Simulator, topology: Topology) -> None:
        self.sim = sim
        self.topology = topology
        self.capacity: dict[EdgeKey, float] = {(e.src, e.dst): e.gbps * GB for e in topology.edges()}
        self.flows: dict[int, Flow] = {}
        self._seq = 0
        self._on: dict[EdgeKey, dict[Flow, None]] = {}  # edge -> live flows crossing it
        self._moved: dict[EdgeKey, float] = {}  # bytes carried up to each flow's last rate change
        self._dirty: dict[Flow, None] = {}  # live flows whose component needs new rates
        self._depth = 0  # open begin() calls
        self._finish: list[tuple[float, int, Flow]] = []  # (finish time, ident, flow); stale entries skipped
        self._next: Event | None = None
        self._paths: dict[tuple[str, ...], tuple[EdgeKey, ...]] = {}  # hops -> checked edges

    # ---- public ---------------------------------------------------------------------------------
    def start(self, hops: Sequence[str], nbytes: float, on_done: Callable[[], None],
              cap_gbps: float | None = None) -> Flow:
        """Start moving ``nbytes`` along ``hops``; ``on_done()`` runs when the last byte arrives."""
        key = tuple(hops)
        edges = self._paths.get(key)
        if edges is None:  # a path seen for the first time: check its links once
            edges = tuple(zip(key[:-1], key[1:], strict=True))
            for e in edges:
                if e not in self.capacity:
                    raise ConfigError(f"path {'->'.join(hops)} uses {e[0]}->{e[1]}, which is not a link of "
                                      f"topology {self.topology.name!r}")
            self._paths[key] = edges
        if nbytes < 0:
            raise ConfigError(f"a flow cannot carry {nbytes} bytes; give a size >= 0")
        self._seq += 1
        cap = None if cap_gbps is None else cap_gbps * GB
        flow = Flow(self._seq, edges, nbytes, cap, on_done, self.sim.now)
        if not edges or nbytes <= _EPS_BYTES:
            flow.done = True
            self.sim.schedule(0.0, on_done)
            return flow
        self.flows[flow.ident] = flow
        on = self._on
        for e in edges:
            users = on.get(e)
            if users is None:
                on[e] = {flow: None}
            else:
                users[flow] = None
        self._dirty[flow] = None
        if not self._depth:
            self.commit()
        return flow

    def set_cap(self, flow: Flow, cap_gbps: float | None) -> None:
        """Change a flow's rate cap (a new SLO share); takes effect now."""
        self.set_caps([(flow, cap_gbps)])

    def set_caps(self, caps: Sequence[tuple[Flow, float | None]]) -> None:
        """Change several caps with one re-allocation of rates."""
        dirty = self._dirty
        for flow, cap_gbps in caps:
            if not flow.done:
                flow.cap = None if cap_gbps is None else cap_gbps * GB
                dirty[flow] = None
        if not self._depth:
            self.commit()

    def cancel(self, flow: Flow) -> float:
        """Stop a flow without calling its callback; returns the bytes it had left."""
        if flow.done:
            return 0.0
        self._settle(flow, self.sim.now)
        flow.done = True
        self._drop(flow)
        if not self._depth:
            self.commit()
        return flow.remaining

    def left(self, flow: Flow) -> float:
        """Bytes ``flow`` has still to move at the current time."""
        if flow.done:
            return 0.0
        return flow.remaining - flow.rate * (self.sim.now - flow.t) if self.sim.now > flow.t else flow.remaining

    @property
    def bytes_moved(self) -> dict[EdgeKey, float]:
        """Bytes each edge has carried so far (edges that carried none are absent)."""
        out = dict(self._moved)
        now = self.sim.now
        for f in self.flows.values():
            dt = now - f.t
            if dt > 0:
                moved = f.rate * dt
                for e in f.edges:
                    out[e] = out.get(e, 0.0) + moved
        return out

    def begin(self) -> None:
        """Start a batch: starts, cancels and cap changes until the matching :meth:`commit` are
        re-allocated once, at the commit. Batches nest; time must not pass inside one."""
        self._depth += 1

    def commit(self) -> None:
        """End a batch (or apply pending changes): new rates for every component a change touched,
        and the completion event moved to the soonest finish."""
        if self._depth:
            self._depth -= 1
            if self._depth:
                return
        dirty = self._dirty
        if dirty:
            self._dirty = {}
            now = self.sim.now
            seen: set[Flow] = set()
            on = self._on
            push = heapq.heappush
            heap = self._finish
            for f in dirty:
                if f.done or f in seen:
                    continue
                # The component of f in the flow/edge graph.
                seen.add(f)
                comp = [f]
                stack = [f]
                while stack:
                    g = stack.pop()
                    for e in g.edges:
                        for h in on[e]:
                            if h not in seen:
                                seen.add(h)
                                comp.append(h)
                                stack.append(h)
                if len(comp) > 1:
                    comp.sort(key=_ident)  # start order, so float sums (and runs) are reproducible
                for g in comp:
                    if now > g.t:
                        self._settle(g, now)
                self._allocate(comp)
                for g in comp:
                    rate = g.rate
                    if rate > 0:
                        rem = g.remaining
                        g.finish = now + (rem if rem > 0.0 else 0.0) / rate
                        push(heap, (g.finish, g.ident, g))
                    else:
                        g.finish = math.inf
            if len(heap) > 64 + 4 * len(self.flows):  # drop stale entries now and then
                self._finish = heap = [(f.finish, f.ident, f) for f in self.flows.values() if f.finish < math.inf]
                heapq.heapify(heap)
        self._reschedule()

    # ---- internals ------------------------------------------------------------------------------
    def _settle(self, f: Flow, now: float) -> None:
        """Advance ``f`` to ``now`` at its current rate and book the bytes on its edges."""
        dt = now - f.t
        if dt > 0:
            moved = f.rate * dt
            f.remaining -= moved
            acc = self._moved
            for e in f.edges:
                acc[e] = acc.get(e, 0.0) + moved
        f.t = now

    def _drop(self, f: Flow) -> None:
        """Take a finished or cancelled flow out; the flows it shared edges with need new rates."""
        del self.flows[f.ident]
        on = self._on
        dirty = self._dirty
        for e in f.edges:
            users = on[e]
            del users[f]
            for h in users:
                dirty[h] = None
        f.finish = math.inf

    def _allocate(self, flows: list[Flow]) -> None:
        """Max-min fair rates with per-flow caps (progressive filling) over one component."""
        capacity = self.capacity
        if len(flows) == 1:  # the common case: its bottleneck, or its cap
            f = flows[0]
            share = min([capacity[e] for e in f.edges])
            if f.cap is not None:
                share = min(share, f.cap)
            f.rate = max(share, 0.0)
            return
        users: dict[EdgeKey, int] = {}
        for f in flows:
            f.rate = 0.0
            for e in f.edges:
                users[e] = users.get(e, 0) + 1
        left = {e: capacity[e] for e in users}
        count = users
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
                      or any(left[e] <= capacity[e] * 1e-12 for e in f.edges)]
            if not frozen:  # numerical safety: nothing binds (cannot happen with finite capacities)
                break
            for f in frozen:
                del active[f]
                for e in f.edges:
                    count[e] -= 1

    def _soonest(self) -> float:
        heap = self._finish
        while heap:
            t, _, f = heap[0]
            if not f.done and f.finish == t:
                return t
            heapq.heappop(heap)
        return math.inf

    def _reschedule(self) -> None:
        t = self._soonest()
        nxt = self._next
        if nxt is not None:
            if nxt.time == t:
                return  # already due then: keep the event (no cancel and re-push)
            self.sim.cancel(nxt)
            self._next = None
        if t < math.inf:
            self._next = self.sim.at(t, self._complete, priority=-1)

    def _complete(self) -> None:
        self._next = None
        now = self.sim.now
        heap = self._finish
        pop = heapq.heappop
        finished: list[Flow] = []
        keep: list[tuple[float, int, Flow]] = []
        while heap and heap[0][0] <= now + _SLACK_S:
            entry = pop(heap)
            f = entry[2]
            if f.done or f.finish != entry[0]:
                continue  # stale
            rem = f.remaining - f.rate * (now - f.t) if now > f.t else f.remaining
            # Done: within rounding of its last byte, or its finish time is here (float residue).
            if rem <= max(_EPS_BYTES, f.rate * 1e-12) or entry[0] <= now:
                f.finish = math.inf  # a duplicate entry of it is stale now
                finished.append(f)
            else:
                keep.append(entry)
        for entry in keep:
            heapq.heappush(heap, entry)
        if len(finished) > 1:
            finished.sort(key=_ident)
        for f in finished:
            self._settle(f, now)
            f.done = True
            f.remaining = 0.0
            self._drop(f)
        # What the callbacks start, cancel or re-cap at this instant is re-allocated once, with the
        # flows that just ended.
        self.begin()
        try:
            for f in finished:
                f.on_done()
        finally:
            self.commit()


_Fluid: Any = native_class("FluidNetwork")

if _Fluid is not None:
    class NativeNetwork(_Fluid):
        """:class:`PyNetwork`'s contract in Rust (``native/src/network.rs``): the same rates, finish
        times and bytes, bit for bit."""

        __slots__ = ()
else:
    NativeNetwork = None  # type: ignore[assignment, misc]

if TYPE_CHECKING:
    Network = PyNetwork
else:
    Network = NativeNetwork if CORE == "native" and NativeNetwork is not None else PyNetwork
