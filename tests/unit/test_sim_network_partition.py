"""The partitioned, lazily advanced fluid network against a global max-min reference.

``gfaas.sim.network.Network`` re-allocates rates only over the component of the flow/edge graph a
change touches, advances each flow only when its own rate changes, and batches the changes of one
instant (``begin``/``commit``). ``GlobalNetwork`` below is the model it replaced: every change re-runs
progressive filling over every live flow and advances every flow. On random flow sets (starts, caps,
cap changes, cancels) both must give the same finish times and bytes per edge, up to float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.sim.kernel import Event, Simulator
from gfaas.sim.network import NativeNetwork, Network, PyNetwork
from gfaas.topology import Device, Link, Topology

# Every test here runs on each implementation (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("sim_core")

GB = 1e9


class _Flow:
    def __init__(self, ident: int, edges: tuple[tuple[str, str], ...], nbytes: float, cap: float | None,
                 on_done: Callable[[], None]) -> None:
        self.ident, self.edges, self.remaining, self.cap, self.on_done = ident, edges, nbytes, cap, on_done
        self.rate = 0.0
        self.done = False


class GlobalNetwork:
    """Reference: one max-min allocation over all live flows after every change (the pre-issue-24 model)."""

    def __init__(self, sim: Simulator, topo: Topology) -> None:
        self.sim = sim
        self.capacity = {(e.src, e.dst): e.gbps * GB for e in topo.edges()}
        self.flows: dict[int, _Flow] = {}
        self.seq = 0
        self.last = sim.now
        self.next: Event | None = None
        self.bytes_moved: dict[tuple[str, str], float] = {}

    def start(self, hops: list[str], nbytes: float, on_done: Callable[[], None], cap: float | None) -> _Flow:
        self._advance()
        self.seq += 1
        f = _Flow(self.seq, tuple(zip(hops[:-1], hops[1:], strict=True)), nbytes,
                  None if cap is None else cap * GB, on_done)
        self.flows[f.ident] = f
        self._reschedule()
        return f

    def set_caps(self, caps: list[tuple[_Flow, float | None]]) -> None:
        self._advance()
        for f, c in caps:
            if not f.done:
                f.cap = None if c is None else c * GB
        self._reschedule()

    def cancel(self, f: _Flow) -> float:
        if f.done:
            return 0.0
        self._advance()
        f.done = True
        del self.flows[f.ident]
        self._reschedule()
        return f.remaining

    def _advance(self) -> None:
        dt = self.sim.now - self.last
        if dt > 0:
            for f in self.flows.values():
                f.remaining -= f.rate * dt
                for e in f.edges:
                    self.bytes_moved[e] = self.bytes_moved.get(e, 0.0) + f.rate * dt
        self.last = self.sim.now

    def _allocate(self) -> None:
        flows = list(self.flows.values())
        users: dict[tuple[str, str], int] = {}
        for f in flows:
            f.rate = 0.0
            for e in f.edges:
                users[e] = users.get(e, 0) + 1
        left = {e: self.capacity[e] for e in users}
        active = dict.fromkeys(flows)
        while active:
            share = min((left[e] / n for e, n in users.items() if n), default=math.inf)
            for f in active:
                if f.cap is not None:
                    share = min(share, f.cap - f.rate)
            share = max(share, 0.0)
            for f in active:
                f.rate += share
            for e, n in users.items():
                left[e] -= share * n
            frozen = [f for f in active if (f.cap is not None and f.rate >= f.cap * (1 - 1e-12))
                      or any(left[e] <= self.capacity[e] * 1e-12 for e in f.edges)]
            if not frozen:
                break
            for f in frozen:
                del active[f]
                for e in f.edges:
                    users[e] -= 1

    def _reschedule(self) -> None:
        if self.next is not None:
            self.sim.cancel(self.next)
            self.next = None
        if not self.flows:
            return
        self._allocate()
        soonest = min((max(f.remaining, 0.0) / f.rate for f in self.flows.values() if f.rate > 0),
                      default=math.inf)
        if soonest < math.inf:
            self.next = self.sim.schedule(soonest, self._complete, priority=-1)

    def _complete(self) -> None:
        self.next = None
        self._advance()
        done = [f for f in self.flows.values() if f.remaining <= max(1e-6, f.rate * 1e-12)]
        for f in done:
            f.done = True
            f.remaining = 0.0
            del self.flows[f.ident]
        self._reschedule()
        for f in done:
            f.on_done()


def grid() -> Topology:
    """Two islands (a-b-c-d and e-f-g) plus a bridge d-e: flows form several components that
    merge and split as flows come and go."""
    devs = tuple(Device(n, "gpu") for n in "abcdefg")
    links = (Link("a", "b", "nvlink", 10), Link("b", "c", "nvlink", 4), Link("c", "d", "pcie", 6),
             Link("a", "d", "pcie", 2), Link("d", "e", "nvlink", 3), Link("e", "f", "nvlink", 8),
             Link("f", "g", "pcie", 5), Link("e", "g", "nvlink", 7))
    return Topology("grid", devs, links)


PATHS = [["a", "b"], ["a", "b", "c"], ["b", "c", "d"], ["a", "d"], ["d", "e"], ["c", "d", "e", "f"],
         ["e", "f"], ["f", "g"], ["e", "g"], ["g", "f", "e"], ["b", "a"], ["d", "c", "b"], ["g", "e", "d", "a"]]

op = st.tuples(
    st.sampled_from(["start", "start", "start", "cap", "cancel"]),
    st.integers(0, len(PATHS) - 1),                   # path
    st.floats(0.1, 20.0),                             # GB
    st.one_of(st.none(), st.floats(0.5, 12.0)),       # cap GB/s
    st.floats(0.0, 3.0).map(lambda t: round(t, 2)),   # start time (ties on purpose)
    st.integers(0, 40),                               # which earlier flow a cap/cancel targets
)


def _drive(net_cls: type, ops: list[tuple[str, int, float, float | None, float, int]], batch: bool
           ) -> tuple[dict[int, float], dict[int, float], dict[tuple[str, str], float]]:
    sim = Simulator()
    net = net_cls(sim, grid())
    flows: list[object] = []
    finish: dict[int, float] = {}
    left: dict[int, float] = {}

    def apply(i: int) -> None:
        kind, p, gb, cap, _, target = ops[i]
        if kind == "start" or not flows:
            k = len(flows)
            flows.append(net.start(PATHS[p], gb * GB, lambda: finish.__setitem__(k, sim.now), cap))
        elif kind == "cap":
            net.set_caps([(flows[target % len(flows)], cap)])
        else:
            k = target % len(flows)
            left[k] = net.cancel(flows[k])

    by_time: dict[float, list[int]] = {}
    for i, o in enumerate(ops):
        by_time.setdefault(o[4], []).append(i)

    def instant(idx: list[int]) -> None:
        if batch:
            net.begin()
        for i in idx:
            apply(i)
        if batch:
            net.commit()

    for t, idx in sorted(by_time.items()):
        sim.at(t, instant, idx)
    sim.run()
    return finish, left, dict(net.bytes_moved)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, min_size=1, max_size=25), st.booleans())
def test_partitioned_network_matches_global_max_min(ops: list[tuple[str, int, float, float | None, float, int]],
                                                   batch: bool) -> None:
    ref_finish, ref_left, ref_moved = _drive(GlobalNetwork, ops, batch=False)
    finish, left, moved = _drive(Network, ops, batch=batch)
    assert finish.keys() == ref_finish.keys()
    for k in finish:
        assert _close(finish[k], ref_finish[k]), (k, finish[k], ref_finish[k])
    assert left.keys() == ref_left.keys()
    for k in left:
        assert _close(left[k], ref_left[k]), (k, left[k], ref_left[k])
    assert {e for e, v in moved.items() if v > 1e-3} == {e for e, v in ref_moved.items() if v > 1e-3}
    for e in moved:
        assert _close(moved[e], ref_moved.get(e, 0.0)), (e, moved[e], ref_moved.get(e))


def test_independent_components_get_their_rates_without_touching_each_other() -> None:
    """Flows on the two islands: a change on one leaves the other's rate (and its bookkeeping time) alone."""
    sim = Simulator()
    net = Network(sim, grid())
    done: list[tuple[str, float]] = []
    ab = net.start(["a", "b"], 20 * GB, lambda: done.append(("ab", sim.now)))
    fg = net.start(["f", "g"], 10 * GB, lambda: done.append(("fg", sim.now)))
    sim.at(1.0, lambda: net.start(["a", "b"], 5 * GB, lambda: done.append(("ab2", sim.now))))
    sim.run(1.0)
    assert (ab.rate, fg.rate, fg.t) == (5 * GB, 5 * GB, 0.0)  # fg never re-advanced
    assert net.left(fg) == pytest.approx(5 * GB)
    sim.run()
    # ab: 10 GB/s for 1 s, then 5 GB/s each: ab2 (5 GB) ends at 2 (with fg, one event: start
    # order), ab's last 5 GB at 10 GB/s by 2.5
    assert done == [("fg", 2.0), ("ab2", 2.0), ("ab", 2.5)]
    assert net.bytes_moved[("a", "b")] == pytest.approx(25 * GB)


def test_a_batch_reallocates_once_and_moves_the_completion_event_once() -> None:
    """Three starts and a cap change in one batch: one completion event in the kernel, not four."""
    sim = Simulator()
    net = Network(sim, grid())
    net.begin()
    fs = [net.start(["a", "b"], GB, lambda: None) for _ in range(3)]
    net.set_caps([(fs[0], 1.0)])
    assert sim.pending == 0 and all(f.rate == 0.0 for f in fs)  # nothing allocated inside the batch
    net.commit()
    assert sim.pending == 1
    assert [f.rate for f in fs] == [1 * GB, 4.5 * GB, 4.5 * GB]


@settings(max_examples=150, deadline=None)
@given(st.lists(op, min_size=1, max_size=25), st.booleans())
def test_the_native_network_agrees_with_the_reference_bit_for_bit(
        ops: list[tuple[str, int, float, float | None, float, int]], batch: bool) -> None:
    """Not only up to rounding: the same finish times, bytes left and bytes per edge, as floats."""
    if NativeNetwork is None:
        pytest.skip("gfaas_native is not built here (make setup builds it; needs cargo)")
    native, ref = _drive(NativeNetwork, ops, batch=batch), _drive(PyNetwork, ops, batch=batch)
    assert native == ref
    assert [list(d) for d in native] == [list(d) for d in ref]  # and in the same order
