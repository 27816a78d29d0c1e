"""Maximum-flow path sets on random machines (Hypothesis), against an independent oracle.

Random single-node machines: 2-6 GPUs spread over 1-3 PCIe switches, random NVLink pairs and
an optional NVSwitch, every link with its own rate in each direction (``gbps_back``). For a random
pair of endpoints (two GPUs, or the host and a GPU either way):

* **feasible**: the router's idle plan and the flow decomposition never put more on a directed
  edge than its rate, summing all paths; every path follows real edges and is loop-free;
* **optimal**: the idle plan carries the maximum flow (the target is >= 95%; we check equality up
  to float noise), and never more.

The oracle is the *minimum cut*, found by trying every set of devices that holds the source and
not the destination (max-flow min-cut theorem): no augmenting paths, nothing shared with the
policy's code. It runs over the links a route of that kind may use, restated here from the
papers' route shapes: GPU to GPU, NVLink only; host to GPU, PCIe host -> switch -> GPU then
NVLink; GPU to host, the mirror image on the reverse rates. Concurrent plans on the same random
machines must also never oversubscribe an edge in either direction.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.policy import Router
from gfaas.policy.maxflow import max_flow
from gfaas.policy.paths import flow_paths
from gfaas.topology import Device, Link, Topology

rate = st.one_of(st.sampled_from([12.0, 24.0, 25.0, 48.0, 50.0]), st.floats(0.5, 100.0, allow_nan=False))


@st.composite
def machines(draw: st.DrawFn) -> Topology:
    n_gpu = draw(st.integers(2, 6), label="gpus")
    n_sw = draw(st.integers(1, 3), label="switches")
    devices = [Device("host", "host")] + [Device(f"pcie{s}", "pcie") for s in range(n_sw)]
    devices += [Device(f"gpu{i}", "gpu") for i in range(n_gpu)]
    links = [Link("host", f"pcie{s}", "pcie", draw(rate), draw(rate)) for s in range(n_sw)]
    for i in range(n_gpu):
        sw = draw(st.integers(0, n_sw - 1), label=f"switch of gpu{i}")
        links.append(Link(f"pcie{sw}", f"gpu{i}", "pcie", draw(rate), draw(rate)))
    for i, j in itertools.combinations(range(n_gpu), 2):
        if draw(st.booleans(), label=f"nvlink {i}-{j}"):
            links.append(Link(f"gpu{i}", f"gpu{j}", "nvlink", draw(rate), draw(rate)))
    if draw(st.booleans(), label="nvswitch"):
        devices.append(Device("nvswitch", "nvswitch"))
        for i in range(n_gpu):
            if draw(st.booleans(), label=f"gpu{i} on nvswitch"):
                links.append(Link(f"gpu{i}", "nvswitch", "nvlink", draw(rate), draw(rate)))
    return Topology("random", tuple(devices), tuple(links))


def allowed(t: Topology, src: str, dst: str) -> dict[tuple[str, str], float]:
    """Directed edges a route src -> dst may use, with their rates (see the module docstring)."""
    kind = {n: t.device(n).kind for n in (d.name for d in t.devices)}
    out: dict[tuple[str, str], float] = {}
    for e in t.edges():
        a, b = kind[e.src], kind[e.dst]
        if e.kind == "nvlink":
            ok = True
        elif kind[src] == "host":  # down: host -> switch -> GPU
            ok = (a, b) in (("host", "pcie"), ("pcie", "gpu"))
        elif kind[dst] == "host":  # up: GPU -> switch -> host
            ok = (a, b) in (("gpu", "pcie"), ("pcie", "host"))
        else:
            ok = False
        if ok:
            out[(e.src, e.dst)] = e.gbps
    return out


def min_cut(edges: dict[tuple[str, str], float], src: str, dst: str) -> float:
    """Smallest total rate of edges leaving a vertex set that holds src and not dst (brute force)."""
    others = sorted({v for e in edges for v in e} - {src, dst})
    best = math.inf
    for k in range(len(others) + 1):
        for extra in itertools.combinations(others, k):
            side = {src, *extra}
            best = min(best, sum(c for (a, b), c in edges.items() if a in side and b not in side))
    return 0.0 if best == math.inf else best


def pairs(t: Topology) -> list[tuple[str, str]]:
    ends = t.gpus + ["host"]
    return [(a, b) for a in ends for b in ends if a != b]


def assert_feasible(t: Topology, paths: list[tuple[tuple[str, ...], float]], src: str, dst: str) -> None:
    load: dict[tuple[str, str], float] = defaultdict(float)
    for hops, g in paths:
        assert g > 0 and hops[0] == src and hops[-1] == dst, (hops, g)
        assert len(set(hops)) == len(hops), hops  # loop-free
        for a, b in zip(hops, hops[1:], strict=False):
            assert t.edge(a, b) is not None, (a, b)
            load[(a, b)] += g
    for (a, b), used in load.items():
        cap = t.edge(a, b).gbps  # type: ignore[union-attr]
        assert used <= cap * (1 + 1e-9) + 1e-9, (a, b, used, cap)


def close(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=300, deadline=None)
@given(machines(), st.data())
def test_idle_plan_is_feasible_and_carries_the_max_flow(t: Topology, data: st.DataObject) -> None:
    src, dst = data.draw(st.sampled_from(pairs(t)), label="pair")
    oracle = min_cut(allowed(t, src, dst), src, dst)
    value, paths = flow_paths(t, src, dst)
    assert close(value, oracle), (value, oracle)
    assert close(sum(g for _, g in paths), value)
    assert_feasible(t, list(paths), src, dst)

    plan = Router(t).plan("x", src, dst)
    assert_feasible(t, [(p.hops, p.gbps) for p in plan.paths], src, dst)
    gpu_pair = "host" not in (src, dst)
    if gpu_pair and oracle == 0:  # no NVLink route at all: PCIe peer-to-peer, capped
        assert plan.total_gbps <= t.pcie_p2p_gbps + 1e-9
        return
    assert plan.total_gbps >= 0.95 * oracle  # the target ...
    assert close(plan.total_gbps, oracle), (plan.total_gbps, oracle)  # ... and what we get


@settings(max_examples=150, deadline=None)
@given(machines(), st.data())
def test_concurrent_plans_never_oversubscribe_a_direction(t: Topology, data: st.DataObject) -> None:
    """Several transfers at once (plans, releases, re-routes, balancing): per directed edge, the
    paths of all active plans add up to at most its rate, and residuals match exactly."""
    r = Router(t)
    live: list[int] = []
    for step in range(data.draw(st.integers(1, 12), label="steps")):
        if live and data.draw(st.booleans(), label="release?"):
            r.release(live.pop(data.draw(st.integers(0, len(live) - 1), label="which")))
        else:
            src, dst = data.draw(st.sampled_from(pairs(t)), label="pair")
            r.plan(step, src, dst)
            live.append(step)
        r.changed()
        load: dict[tuple[str, str], float] = defaultdict(float)
        for plan in r.active.values():
            for p in plan.paths:
                assert len(set(p.hops)) == len(p.hops), p
                for e in p.edges:
                    load[e] += p.gbps
        for e in t.edges():
            used = load.get((e.src, e.dst), 0.0)
            assert used <= e.gbps + 1e-6, (e, used)
            assert math.isclose(r.residual(e.src, e.dst), e.gbps - used, abs_tol=1e-6), (e, used)


def test_max_flow_keeps_first_routes_and_nets_opposite_flows() -> None:
    """A direct edge given first is kept whole; a 2-cycle a->b / b->a never both carry flow."""
    edges = [("s", "a", 10.0), ("a", "t", 5.0), ("s", "t", 7.0), ("a", "b", 10.0), ("b", "a", 10.0),
             ("b", "t", 10.0), ("s", "b", 1.0)]
    value, paths = max_flow(edges, "s", "t", first=(("s", "t"),))
    assert value == 18.0 and paths[0] == (("s", "t"), 7.0)
    load: dict[tuple[str, str], float] = defaultdict(float)
    for hops, g in paths:
        for e in zip(hops, hops[1:], strict=False):
            load[e] += g
    assert not (load[("a", "b")] > 0 and load[("b", "a")] > 0)
    assert max_flow(edges, "t", "s") == (0.0, [])


def test_every_preset_pair_gets_its_max_flow() -> None:
    """dgx-v100, dgx-a100, 4xa10, h100-x1: every same-node pair's idle plan equals the min cut
    (GPU pairs without NVLink, i.e. 4xa10, go over PCIe peer-to-peer instead: not a flow plan)."""
    from gfaas.topology import preset

    for name in ("dgx-v100", "dgx-a100", "4xa10", "h100-x1"):
        t = preset(name)
        for src, dst in pairs(t):
            oracle = min_cut(allowed(t, src, dst), src, dst)
            plan = Router(t).plan("x", src, dst)
            if oracle == 0:
                assert "host" not in (src, dst) and len(plan.paths) == 1, (name, src, dst)
                continue
            assert close(plan.total_gbps, oracle), (name, src, dst, plan.total_gbps, oracle)
