"""Router invariants under random plan/release sequences (Hypothesis).

Checked after every operation, for every active plan (re-routed ones included): paths start and
end at the transfer's endpoints, follow real edges, never repeat a directed edge (nor a device,
when harvesting is topology-aware), carry a positive rate; no directed edge is oversubscribed and
each residual equals capacity minus what the active plans hold on it. Releasing everything gives
every edge its full capacity back. On an idle machine a plan carries at least the widest single
path, computed here independently of the router's own route lists.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.policy import Router, RoutingOptions
from gfaas.topology import Topology, preset

# Every test here runs on each implementation (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("router_class")

TOPOS = ("dgx-v100", "dgx-a100", "dgx-v100*2")


@cache
def topo(name: str) -> Topology:
    return preset(name)


def endpoints(t: Topology) -> list[str]:
    return t.gpus + t.of_kind("host")


options = st.builds(
    RoutingOptions,
    multipath=st.booleans(),
    topology_aware=st.booleans(),
    route_gpus=st.booleans(),
    nic_harvest=st.booleans(),
    max_hops=st.integers(1, 4),
    reroute_direct=st.booleans(),
    balance_busy=st.booleans(),
)


def check(r: Router, t: Topology) -> None:
    held: dict[tuple[str, str], float] = defaultdict(float)
    for tid, plan in r.active.items():
        assert plan.transfer == tid
        for path in plan.paths:
            assert path.gbps > 0, plan
            assert path.hops[0] == plan.src and path.hops[-1] == plan.dst, plan
            edges = path.edges
            assert len(set(edges)) == len(edges), path  # no directed edge twice
            if r.options.topology_aware:
                assert len(set(path.hops)) == len(path.hops), path  # loop-free
            for a, b in edges:
                assert t.edge(a, b) is not None, (a, b)
                held[(a, b)] += path.gbps
    for e in t.edges():
        used = held.get((e.src, e.dst), 0.0)
        assert used <= e.gbps + 1e-6, (e, used)
        assert math.isclose(r.residual(e.src, e.dst), e.gbps - used, abs_tol=1e-6), (e, used)


@settings(max_examples=200)
@given(st.sampled_from(TOPOS), options, st.data())
def test_random_plan_release_sequences_keep_every_invariant(name: str, opts: RoutingOptions,
                                                             data: st.DataObject) -> None:
    """No oversubscription, valid loop-free paths, exact restore after releasing everything."""
    t = topo(name)
    ends = endpoints(t)
    r = Router(t, opts)
    live: list[int] = []
    for step in range(data.draw(st.integers(1, 25), label="steps")):
        if live and data.draw(st.booleans(), label="release?"):
            tid = live.pop(data.draw(st.integers(0, len(live) - 1), label="which"))
            r.release(tid)
        else:
            src = data.draw(st.sampled_from(ends), label="src")
            dst = data.draw(st.sampled_from(ends), label="dst")
            r.plan(step, src, dst)
            live.append(step)
        moved = r.changed()
        assert all(p.transfer in live for p in moved)
        check(r, t)
    for tid in live:
        r.release(tid)
    for e in t.edges():
        assert abs(r.residual(e.src, e.dst) - e.gbps) <= 1e-9
    assert len(r.active) == 0


@settings(max_examples=30)
@given(st.sampled_from(TOPOS), st.data())
def test_plan_many_keeps_the_invariants(name: str, data: st.DataObject) -> None:
    """A batch planned together obeys the same invariants, and its own members are not 'changed'."""
    t = topo(name)
    ends = endpoints(t)
    r = Router(t)
    n = data.draw(st.integers(1, 6), label="batch")
    reqs = [(i, data.draw(st.sampled_from(ends)), data.draw(st.sampled_from(ends))) for i in range(n)]
    plans = r.plan_many(reqs)
    assert [p.transfer for p in plans] == list(range(n))
    assert r.changed() == []
    check(r, t)


def widest(t: Topology, src: str, dst: str, kinds: set[str]) -> float:
    """Max over simple paths using only ``kinds`` of links of the narrowest link (max-bottleneck search)."""
    best = {src: math.inf}
    frontier = [src]
    while frontier:  # Bellman-Ford style relaxation: tiny graphs
        nxt = []
        for x in frontier:
            for e in t.out_edges(x):
                if e.kind not in kinds or (e.dst != dst and t.device(e.dst).kind == "host"):
                    continue
                w = min(best[x], e.gbps)
                if w > best.get(e.dst, 0.0):
                    best[e.dst] = w
                    nxt.append(e.dst)
        frontier = nxt
    return best.get(dst, 0.0)


@settings(max_examples=60)
@given(st.sampled_from(("dgx-v100", "dgx-a100")), st.data())
def test_idle_plan_carries_at_least_the_widest_single_path(name: str, data: st.DataObject) -> None:
    """Idle machine: aggregate plan rate >= the best single path's bottleneck."""
    t = topo(name)
    a, b = data.draw(st.lists(st.sampled_from(endpoints(t)), min_size=2, max_size=2, unique=True))
    plan = Router(t).plan("x", a, b)
    kinds = {"pcie", "nvlink"} if "host" in (a, b) else {"nvlink"}
    single = widest(t, a, b, kinds)
    assert single > 0
    assert plan.total_gbps >= single - 1e-9
