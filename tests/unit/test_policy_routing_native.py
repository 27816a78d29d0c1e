"""The native router (gfaas_native's RouterCore behind ``NativeRouter``) against the reference ``Router``:
the same random operations, plans, batches, releases, re-routes reported by ``changed()``, ``active``,
under every option, on every kind of machine, must give the same plans and residuals, as floats. The
router tests proper run on both (test_policy_routing*.py); this checks that they are one policy."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.policy import Router, RoutingOptions
from gfaas.policy.routing_native import NativeRouter, native_router_available
from gfaas.sim.systems import SYSTEMS
from gfaas.topology import Topology, preset

pytestmark = pytest.mark.skipif(not native_router_available(),
                                reason="gfaas_native is not built here (make setup builds it; needs cargo)")

TOPOS = ("dgx-v100", "dgx-a100", "dgx-v100*2", "dgx-a100*2", "4xa10", "h800x4")


@cache
def topo(name: str) -> Topology:
    return preset(name)


options = st.builds(
    RoutingOptions, multipath=st.booleans(), topology_aware=st.booleans(), route_gpus=st.booleans(),
    nic_harvest=st.booleans(), max_hops=st.integers(1, 4), reroute_direct=st.booleans(),
    balance_busy=st.booleans(), max_flow=st.booleans(), min_cost=st.booleans())


def _same(ref: Router, nat: Router, t: Topology) -> None:
    assert nat.changed() == ref.changed()
    assert dict(nat.active) == dict(ref.active)
    assert list(nat.active) == list(ref.active)
    for e in t.edges():
        assert nat.residual(e.src, e.dst) == ref.residual(e.src, e.dst), e


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(TOPOS), options, st.data())
def test_the_native_router_plans_what_the_reference_plans(name: str, opts: RoutingOptions,
                                                          data: st.DataObject) -> None:
    t = topo(name)
    ends = t.gpus + t.of_kind("host")
    ref, nat = Router(t, opts), NativeRouter(t, opts)
    live: list[tuple[object, ...]] = []
    for step in range(data.draw(st.integers(1, 30), label="steps")):
        op = data.draw(st.sampled_from(["plan", "plan", "plan", "release", "batch"]), label="op")
        if op == "release" and live:
            tid = live.pop(data.draw(st.integers(0, len(live) - 1), label="which"))
            ref.release(tid)
            nat.release(tid)
        elif op == "batch":
            reqs = [(("b", step, k), data.draw(st.sampled_from(ends)), data.draw(st.sampled_from(ends)))
                    for k in range(data.draw(st.integers(1, 4), label="batch size"))]
            assert nat.plan_many(reqs) == ref.plan_many(reqs)
            live += [r[0] for r in reqs]
        else:
            src, dst = data.draw(st.sampled_from(ends), label="src"), data.draw(st.sampled_from(ends), label="dst")
            assert nat.plan(("p", step), src, dst) == ref.plan(("p", step), src, dst)
            live.append(("p", step))
        _same(ref, nat, t)
    for tid in live:
        ref.release(tid)
        nat.release(tid)
    _same(ref, nat, t)
    assert len(nat.active) == 0


def test_seeded_sequences_reach_every_phase_and_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The random sequences above are not all easy ones: seeded ones like them reach evictions, yielded
    detours, fair sharing and both kinds of busy-path balancing (counted on the reference, where each
    phase is a method), and the native router plans the same through all of them."""
    import random
    from collections import Counter

    reached: Counter[str] = Counter()
    for name in ("_compensate", "_share", "_evict", "_yield_detours", "_take_fair"):
        orig = getattr(Router, name)

        def counted(self: Router, *a: object, _orig: object = orig, _name: str = name) -> object:
            out = _orig(self, *a)  # type: ignore[operator]
            if out or _name == "_take_fair":  # a phase that did something (a move, a victim)
                reached[_name] += 1
            return out

        monkeypatch.setattr(Router, name, counted)
    rng = random.Random(1)
    for name in ("dgx-v100", "dgx-v100*2", "4xa10", "h800x4"):
        t = topo(name)
        ends = t.gpus + t.of_kind("host")
        for _ in range(12):
            opts = RoutingOptions(multipath=rng.random() < .8, topology_aware=rng.random() < .8,
                                  reroute_direct=rng.random() < .8, balance_busy=rng.random() < .8)
            ref, nat = Router(t, opts), NativeRouter(t, opts)
            live: list[int] = []
            for step in range(40):
                if live and rng.random() < .3:
                    tid = live.pop(rng.randrange(len(live)))
                    ref.release(tid)
                    nat.release(tid)
                else:
                    s, d = rng.choice(ends), rng.choice(ends)
                    assert nat.plan(step, s, d) == ref.plan(step, s, d)
                    live.append(step)
                assert nat.changed() == ref.changed()
    assert set(reached) == {"_compensate", "_share", "_evict", "_yield_detours", "_take_fair"}, reached


def test_a_cluster_router_compiles_pairs_on_first_use_and_agrees() -> None:
    """The simulator's routers on a cluster (precompute=False): route sets of twin nodes, renamed."""
    t = preset("dgx-a100*4")
    ref, nat = Router(t, precompute=False), NativeRouter(t, precompute=False)
    pairs = [("n0.gpu0", "n0.gpu5"), ("n2.gpu1", "n2.host"), ("n3.host", "n3.gpu7"), ("n1.gpu2", "n3.gpu4")]
    for k, (a, b) in enumerate(pairs * 3):
        assert nat.plan(k, a, b) == ref.plan(k, a, b)
        _same(ref, nat, t)


@pytest.mark.parametrize("name", ["dgx-a100*3", "dgx-v100*3", "4xa10*3"])
def test_copied_route_sets_of_twin_nodes_plan_what_the_reference_plans(name: str) -> None:
    """On a cluster the native router copies a twin node's compiled route set (``RouterCore.copy_cset``:
    edges and groups translated) where the reference renames the routes and compiles them again.
    Seeded sequences that mix the copied node's pairs, its twin's and cross-node ones, under every
    system's options and more, must plan the same, hold the same residuals and name the twin's devices."""
    import random

    from gfaas.policy.routing import _twin_nodes

    t = topo(name)
    assert set(_twin_nodes(t)) == {2}
    rng = random.Random(7)
    ends = [d for n in (1, 2) for d in t.of_kind("gpu", n) + t.of_kind("host", n)[:1]]
    copied = 0
    for opts in sorted({s.routing for s in SYSTEMS.values()} | {
            RoutingOptions(topology_aware=False), RoutingOptions(load_paths="all"), RoutingOptions(max_hops=2),
            RoutingOptions(multipath=False), RoutingOptions(max_flow=False)}, key=repr):
        ref, nat = Router(t, opts, precompute=False), NativeRouter(t, opts, precompute=False)
        live: list[int] = []
        for step in range(60):
            if live and rng.random() < .3:
                tid = live.pop(rng.randrange(len(live)))
                ref.release(tid)
                nat.release(tid)
                continue
            s, d = rng.choice(ends), rng.choice(ends)
            plan = nat.plan(step, s, d)
            assert plan == ref.plan(step, s, d)
            if s != d and s[:3] == d[:3] == "n2.":
                copied += 1
                assert all(h.startswith("n2.") or not h.startswith("n1.") for p in plan.paths for h in p.hops)
            live.append(step)
            assert nat.changed() == ref.changed()
        _same(ref, nat, t)
    assert copied > 50


def test_errors_are_the_references() -> None:
    t = topo("dgx-v100")
    for r in (Router(t), NativeRouter(t)):
        r.plan("x", "gpu0", "gpu1")
        with pytest.raises(ConfigError, match="already has a plan"):
            r.plan("x", "gpu0", "gpu2")
        with pytest.raises(ConfigError, match="duplicate transfer ids"):
            r.plan_many([("y", "gpu0", "gpu1"), ("y", "gpu1", "gpu2")])
        with pytest.raises(ConfigError, match="already has a plan"):
            r.plan_many([("z", "gpu0", "gpu1"), ("x", "gpu1", "gpu2")])
        assert "z" not in r.active  # validated before anything was reserved
        r.release("x")
        with pytest.raises(ConfigError, match="has no plan to release"):
            r.release("x")
        with pytest.raises(ConfigError):
            r.plan("w", "gpu0", "nowhere")
        assert dict(r.active) == {}


@pytest.mark.serial  # a ratio of two timings: the serial phase, alone on the machine
def test_the_native_router_decides_faster_than_the_reference() -> None:
    """Generous bound on a ratio inside one run, same samples (measured 4-5x here; docs/benchmarks.md)."""
    from gfaas.bench.policy import run

    ref, nat = run(n=1500, router=Router), run(n=1500, router=NativeRouter)
    assert nat["router"] == "NativeRouter"
    for kind in ("gpu->gpu", "cross-node"):
        r, n = ref["dgx-v100"][kind]["median_us"], nat["dgx-v100"][kind]["median_us"]
        assert r >= 2 * n, (kind, r, n)
