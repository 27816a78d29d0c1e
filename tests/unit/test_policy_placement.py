"""Workflow placement on GPUs (MAPA-like) and across nodes (FaaSFlow-like grouping)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.policy import group_nodes, pair_gbps, place_replicas, place_workflow, placement_cost
from gfaas.topology import Topology, preset

MB = 10**6
V100 = preset("dgx-v100")


def brute_force(t: Topology, fns: list[str], edges: list[tuple[str, str, int]], free: list[str]) -> float:
    """Cheapest cost over every mapping with at most ceil(F/G) functions per GPU."""
    per = -(-len(fns) // len(free))
    best = float("inf")
    for combo in itertools.product(free, repeat=len(fns)):
        if max(combo.count(x) for x in set(combo)) > per:
            continue
        best = min(best, placement_cost(t, dict(zip(fns, combo, strict=True)), edges))
    return best


def test_pair_bandwidth_rules() -> None:
    """Same GPU is free (inf), NVLink pairs use their rate, others the PCIe P2P rate."""
    assert pair_gbps(V100, "gpu0", "gpu0") == float("inf")
    assert pair_gbps(V100, "gpu0", "gpu3") == 48.0
    assert pair_gbps(V100, "gpu0", "gpu1") == 24.0
    assert pair_gbps(V100, "gpu0", "gpu5") == 7.9


def test_a_chain_lands_on_double_brick_links() -> None:
    """a->b->c with heavy edges on free GPUs {0, 1, 3, 5}: 0-3 is the only 48 GB/s pair among them."""
    fns = ["a", "b", "c"]
    edges = [("a", "b", 900 * MB), ("b", "c", 100 * MB)]
    m = place_workflow(V100, fns, edges, ["gpu0", "gpu1", "gpu3", "gpu5"])
    assert {m["a"], m["b"]} == {"gpu0", "gpu3"}
    assert pair_gbps(V100, m["b"], m["c"]) == 24.0  # the best the third GPU can do next to b
    assert placement_cost(V100, m, edges) == pytest.approx(brute_force(V100, fns, edges, ["gpu0", "gpu1", "gpu3", "gpu5"]))


def test_more_functions_than_gpus_time_share_evenly() -> None:
    """5 functions on 2 GPUs: at most 3 per GPU; the heaviest edges stay inside one GPU."""
    fns = ["a", "b", "c", "d", "e"]
    edges = [("a", "b", 500 * MB), ("b", "c", 400 * MB), ("c", "d", 10 * MB), ("d", "e", 300 * MB)]
    m = place_workflow(V100, fns, edges, ["gpu0", "gpu5"])
    counts = [list(m.values()).count(x) for x in ("gpu0", "gpu5")]
    assert sorted(counts) == [2, 3]
    assert m["a"] == m["b"] == m["c"] and m["d"] == m["e"] != m["a"]


def test_topology_oblivious_placement_is_seeded() -> None:
    """topology_aware=False: a seeded shuffle dealt round-robin; same seed, same mapping."""
    fns = ["a", "b", "c"]
    edges = [("a", "b", MB), ("b", "c", MB)]
    free = ["gpu0", "gpu1", "gpu2", "gpu3"]
    one = place_workflow(V100, fns, edges, free, topology_aware=False, seed=7)
    order = free[:]
    random.Random(7).shuffle(order)
    assert one == {"a": order[0], "b": order[1], "c": order[2]}
    assert place_workflow(V100, fns, edges, free, topology_aware=False, seed=7) == one


def test_placement_errors() -> None:
    """Unknown functions, cycles-free checks, bad GPU lists raise ConfigError naming the value."""
    with pytest.raises(ConfigError, match="unknown function 'z'"):
        place_workflow(V100, ["a"], [("a", "z", 1)], ["gpu0"])
    with pytest.raises(ConfigError, match="no free GPU"):
        place_workflow(V100, ["a"], [], [])
    with pytest.raises(ConfigError, match="'pcie0' is a pcie"):
        place_workflow(V100, ["a"], [], ["pcie0"])
    with pytest.raises(ConfigError, match="span nodes"):
        place_workflow(preset("dgx-v100*2"), ["a"], [], ["n0.gpu0", "n1.gpu0"])
    assert place_workflow(V100, [], [], ["gpu0"]) == {}


workflows = st.integers(1, 5).flatmap(
    lambda n: st.tuples(
        st.just([f"f{i}" for i in range(n)]),
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.integers(0, 2000)), max_size=8),
    )
)


@settings(max_examples=80, deadline=None)
@given(workflows, st.lists(st.sampled_from(V100.gpus), min_size=1, max_size=5, unique=True), st.integers(0, 99))
def test_placement_is_optimal_deterministic_and_uses_free_gpus(
        wf: tuple[list[str], list[tuple[int, int, int]]], free: list[str], seed: int) -> None:
    """Only free GPUs; same input, same output; cost equals brute force and beats any random mapping."""
    fns, raw = wf
    edges = [(fns[a], fns[b], nbytes * MB) for a, b, nbytes in raw]
    m = place_workflow(V100, fns, edges, free)
    assert set(m) == set(fns) and set(m.values()) <= set(free)
    assert place_workflow(V100, fns, edges, free) == m
    cost = placement_cost(V100, m, edges)
    assert cost == pytest.approx(brute_force(V100, fns, edges, free), rel=1e-9, abs=1e-15)
    rnd = place_workflow(V100, fns, edges, free, topology_aware=False, seed=seed)
    assert set(rnd.values()) <= set(free)
    assert cost <= placement_cost(V100, rnd, edges) + 1e-15


def test_eight_functions_on_eight_gpus_is_fast_and_sound() -> None:
    """A full node: branch-and-bound finishes and beats a hundred seeded random mappings."""
    fns = [f"f{i}" for i in range(8)]
    edges = [(fns[i], fns[i + 1], (i + 1) * 100 * MB) for i in range(7)] + [("f0", "f7", 50 * MB)]
    m = place_workflow(V100, fns, edges, V100.gpus)
    assert sorted(m.values()) == sorted(V100.gpus)
    cost = placement_cost(V100, m, edges)
    for seed in range(100):
        assert cost <= placement_cost(V100, place_workflow(V100, fns, edges, V100.gpus,
                                                           topology_aware=False, seed=seed), edges)


# ---- group_nodes --------------------------------------------------------------------------------
def test_a_workflow_that_fits_stays_on_one_node() -> None:
    """4 functions, node 1 has 4 slots: all on node 1 (most slots first), no edge crosses."""
    fns = ["a", "b", "c", "d"]
    edges = [("a", "b", 1), ("b", "c", 1), ("c", "d", 1)]
    assert group_nodes(fns, edges, {0: 2, 1: 4}) == dict.fromkeys(fns, 1)


def test_a_chain_is_cut_once() -> None:
    """A 6-chain over nodes of 4 and 3 slots: one cut, at the lightest edge the slots allow."""
    fns = [f"f{i}" for i in range(6)]
    edges = [(fns[i], fns[i + 1], b) for i, b in enumerate([50, 40, 5, 30, 60])]
    m = group_nodes(fns, edges, {0: 3, 1: 4})
    crossing = [(u, v) for u, v, _ in edges if m[u] != m[v]]
    assert crossing == [("f2", "f3")]  # the 5-byte edge; f0..f2 on one node, f3..f5 on the other
    assert {m["f0"], m["f3"]} == {0, 1}


def test_fan_out_crosses_as_little_as_possible() -> None:
    """src fans out to 3 sinks, 2 slots per node: the cut puts one whole branch aside."""
    fns = ["s", "x", "y", "z"]
    edges = [("s", "x", 10), ("s", "y", 10), ("s", "z", 10)]
    m = group_nodes(fns, edges, {0: 2, 1: 2, 2: 2})
    assert sum(m[u] != m[v] for u, v, _ in edges) == 2  # 3 sinks cannot all sit beside s


def test_group_nodes_errors() -> None:
    """Too few slots and cycles are configuration errors."""
    with pytest.raises(ConfigError, match="need 3 slots but the nodes have 2"):
        group_nodes(["a", "b", "c"], [], {0: 1, 1: 1})
    with pytest.raises(ConfigError, match="cycle"):
        group_nodes(["a", "b"], [("a", "b", 1), ("b", "a", 1)], {0: 2})
    with pytest.raises(ConfigError, match="slots must be >= 0"):
        group_nodes(["a"], [], {0: -1, 1: 2})


# ---- place_replicas -----------------------------------------------------------------------------
CHAIN = (["a", "b", "c"], [("a", "b", 10), ("b", "c", 10)])


def test_replicas_go_to_the_least_loaded_node_first_ties_lowest_id() -> None:
    """3-function replicas on four 8-slot nodes, node 0 half full (load 4/8): nodes 1, 2, 3 (load
    0), then 1 and 2 again (3/8 < 4/8) -- each replica whole on one node."""
    fns, edges = CHAIN
    plan = place_replicas(fns, edges, 5, {0: 8, 1: 8, 2: 8, 3: 8}, used={0: 4})
    assert [set(p.values()) for p in plan] == [{1}, {2}, {3}, {1}, {2}]


def test_a_full_cluster_shares_gpus_on_the_least_loaded_node() -> None:
    """Two 4-slot nodes with 3 used each: no node has 3 free slots, yet a replica that fits a node
    is still not split across the network."""
    fns, edges = CHAIN
    plan = place_replicas(fns, edges, 2, {0: 4, 1: 4}, used={0: 3, 1: 3})
    assert [set(p.values()) for p in plan] == [{0}, {1}]


def test_a_replica_larger_than_any_node_is_cut_once() -> None:
    """5-chain over 4-slot nodes: one cut, the rest kept together."""
    fns = ["a", "b", "c", "d", "e"]
    edges = [(fns[i], fns[i + 1], 1) for i in range(4)]
    (p,) = place_replicas(fns, edges, 1, {0: 4, 1: 4})
    assert sum(p[u] != p[v] for u, v, _ in edges) == 1


def test_spread_layout_is_group_nodes_over_even_shares() -> None:
    """The inter-node experiments' layout: every replica the same cut over all given nodes, the nodes
    turned by one place per replica."""
    fns = ["a", "b", "c", "d"]
    edges = [(fns[i], fns[i + 1], 1) for i in range(3)]
    plan = place_replicas(fns, edges, 3, {0: 8, 1: 8}, used={0: 8}, layout="spread")
    one = group_nodes(fns, edges, {0: 2, 1: 2})
    assert one == {"a": 0, "b": 0, "c": 1, "d": 1}
    assert plan == [one, {"a": 1, "b": 1, "c": 0, "d": 0}, one]
    # One function over two nodes: its replicas alternate, so both nodes' GPUs serve it.
    single = place_replicas(["seg"], [], 4, {0: 8, 1: 8}, layout="spread")
    seg = [p["seg"] for p in single]
    assert sorted(seg) == [0, 0, 1, 1] and all(a != b for a, b in zip(seg, seg[1:], strict=False))
    three = place_replicas(["x"], [], 3, {2: 4, 5: 4, 9: 4}, layout="spread")
    assert sorted(p["x"] for p in three) == [2, 5, 9]


def test_replica_input_errors_name_the_value() -> None:
    fns, edges = CHAIN
    with pytest.raises(ConfigError, match="replicas=-1"):
        place_replicas(fns, edges, -1, {0: 8})
    with pytest.raises(ConfigError, match="layout='round'"):
        place_replicas(fns, edges, 1, {0: 8}, layout="round")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="node 0 has -1 slots"):
        place_replicas(fns, edges, 1, {0: -1})
    with pytest.raises(ConfigError, match="used names node 7"):
        place_replicas(fns, edges, 1, {0: 8}, used={7: 1})
    with pytest.raises(ConfigError, match="no node has a slot"):
        place_replicas(fns, edges, 1, {0: 0})
    assert place_replicas([], [], 2, {0: 8}) == [{}, {}]


@settings(max_examples=150, deadline=None)
@given(workflows, st.integers(0, 12), st.lists(st.integers(0, 8), min_size=1, max_size=6),
       st.lists(st.integers(0, 8), max_size=6))
def test_every_replica_placed_no_node_overfull_and_fitting_replicas_whole(
        wf: tuple[list[str], list[tuple[int, int, int]]], replicas: int, sizes: list[int], taken: list[int]) -> None:
    """Every function of every replica on a node with slots; no node given more functions than it
    has free slots while the cluster has room; a replica that fits some node's free slots is not
    split; the least-loaded fitting node is taken."""
    fns, raw = wf
    edges = [(fns[a], fns[b], nbytes) for a, b, nbytes in raw if a < b]  # a DAG
    slots = dict(enumerate(sizes))
    used = {n: min(t, slots[n]) for n, t in enumerate(taken) if n in slots}
    if not any(sizes):
        with pytest.raises(ConfigError):
            place_replicas(fns, edges, max(replicas, 1), slots, used=used)
        return
    plan = place_replicas(fns, edges, replicas, slots, used=used)
    assert len(plan) == replicas
    load = {n: used.get(n, 0) for n in slots}
    for p in plan:
        assert set(p) == set(fns) and all(slots[n] > 0 for n in p.values())
        free = {n: slots[n] - load[n] for n in slots}
        fitting = [n for n in slots if free[n] >= len(fns)]
        if fitting:
            (node,) = set(p.values())
            assert node == min(fitting, key=lambda n: (load[n] / slots[n], n))
        elif sum(max(f, 0) for f in free.values()) >= len(fns) and len(fns) > max(sizes):
            for n in set(p.values()):  # cut over the free slots only: nobody over capacity
                assert list(p.values()).count(n) <= free[n]
        elif len(fns) <= max(sizes):
            assert len(set(p.values())) == 1
        for n in p.values():
            load[n] += 1
    assert place_replicas(fns, edges, replicas, slots, used=used) == plan  # deterministic
