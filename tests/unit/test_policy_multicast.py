"""Multicast schedules (seed 002 §4.2): the single-port rules, completeness and the step counts.

Every schedule is replayed by :func:`replay`, a checker written here from the rules (it shares
nothing with ``Schedule.violations``): per step each node sends at most one block and receives at
most one, a sender holds what it sends at the start of the step, nobody sends to a source, no
block reaches a node twice, and at the end every node holds every block.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.policy import Schedule, Transfer, plan_multicast
from gfaas.policy.multicast import SCHEMES, _hypercube, _twin_roles, block_orders, split_groups, step_bound


def replay(s: Schedule) -> list[set[int]]:
    """Holdings after the schedule; asserts every rule on the way."""
    held = [set(range(s.blocks)) if n < s.sources else set() for n in range(s.nodes)]
    for t, step in enumerate(s.steps):
        srcs = [tr.src for tr in step]
        dsts = [tr.dst for tr in step]
        assert len(srcs) == len(set(srcs)), f"step {t}: a node sends twice"
        assert len(dsts) == len(set(dsts)), f"step {t}: a node receives twice"
        for tr in step:
            assert tr.dst >= s.sources, f"step {t}: {tr} sends to a source"
            assert tr.block in held[tr.src], f"step {t}: {tr}: sender lacks the block"
            assert tr.block not in held[tr.dst], f"step {t}: {tr}: duplicate delivery"
        for tr in step:
            held[tr.dst].add(tr.block)
    assert all(h == set(range(s.blocks)) for h in held), "a node ends without every block"
    return held


def expected_steps(scheme: str, n: int, b: int) -> int:
    """Closed forms restated from the papers (group of n nodes, its source included)."""
    if n == 1:
        return 0
    if scheme == "binomial":
        return b + math.ceil(math.log2(n)) - 1  # = B + log2 N - 1 for N = 2^l, B + floor(log2 N) otherwise
    if scheme == "chain":
        return b + n - 2
    if scheme == "sequential":
        return b * (n - 1)
    return 2 * b + 2 * math.floor(math.log2(n))  # tree: an upper bound


def fmt(s: Schedule) -> list[set[str]]:
    return [{f"{tr.src}->{tr.dst}:{tr.block}" for tr in step} for step in s.steps]


def parse(vector: str) -> list[set[str]]:
    return [{x.strip() for x in step.split(",")} for step in vector.split("|")]


def test_binomial_n4_b3_matches_the_anchor_vector() -> None:
    """N=4, B=3: the 4 steps of the anchors' test vector, transfer for transfer."""
    s = plan_multicast(4, 3)
    assert fmt(s) == parse("0->1:0 | 0->2:1, 1->3:0 | 0->1:2, 2->3:1, 3->2:0 | 0->2:2, 1->3:2, 3->1:1")
    assert s.num_steps == 4


def test_binomial_n8_b4_matches_the_anchor_vector() -> None:
    """N=8, B=4: the 6 steps of the anchors' test vector, transfer for transfer."""
    s = plan_multicast(8, 4)
    assert fmt(s) == parse(
        "0->1:0 | 0->2:1, 1->3:0 | 0->4:2, 1->5:0, 2->6:1, 3->7:0 |"
        " 0->1:3, 2->3:1, 3->2:0, 4->5:2, 5->4:0, 6->7:1, 7->6:0 |"
        " 0->2:3, 1->3:3, 3->1:1, 4->6:2, 5->7:2, 6->4:1, 7->5:1 |"
        " 0->4:3, 1->5:3, 2->6:3, 3->7:3, 5->1:2, 6->2:2, 7->3:2"
    )


def test_every_scheme_small_grid_exhaustively() -> None:
    """Every scheme, N 1..20, B 1..6, k 1..4: valid, complete, (N-k)*B transfers, exact step counts."""
    for scheme in SCHEMES:
        for n in range(1, 21):
            for b in range(1, 7):
                for k in range(1, min(4, n) + 1):
                    s = plan_multicast(n, b, k, scheme)
                    replay(s)
                    assert s.num_transfers == (n - k) * b
                    want = max(expected_steps(scheme, len(g), b) for g in s.groups)
                    if scheme == "tree":
                        assert s.num_steps <= want, (n, b, k)
                    else:
                        assert s.num_steps == want, (scheme, n, b, k)


def test_binomial_every_group_size_up_to_64_exhaustively() -> None:
    """Binomial, one source, N 2..64 and B 1..16: valid and exactly B + ceil(log2 N) - 1 steps."""
    for n in range(2, 65):
        for b in range(1, 17):
            s = plan_multicast(n, b)
            replay(s)
            assert s.num_steps == b + math.ceil(math.log2(n)) - 1, (n, b)


@settings(max_examples=120, deadline=None)
@given(n=st.integers(2, 64), b=st.integers(1, 16), k=st.integers(1, 4), scheme=st.sampled_from(SCHEMES))
def test_random_plans_follow_the_rules(n: int, b: int, k: int, scheme: str) -> None:
    """Any N 2..64, B 1..16, k 1..4, scheme: rules hold, step count as stated, one transfer per (node, block)."""
    k = min(k, n)
    s = plan_multicast(n, b, k, scheme)
    replay(s)
    assert s.num_transfers == (n - k) * b
    sizes = [len(g) for g in s.groups]
    assert sorted(sizes) == sorted(n // k + (1 if i < n % k else 0) for i in range(k))
    want = max(expected_steps(scheme, m, b) for m in sizes)
    assert s.num_steps <= want if scheme == "tree" else s.num_steps == want
    assert s.num_steps == max(step_bound(scheme, m, b) for m in sizes) or scheme == "tree"
    # queries by (node, step) agree with the step lists
    for t, step in enumerate(s.steps):
        for tr in step:
            assert s.sends(tr.src, t) == tr and s.receives(tr.dst, t) == tr
    assert s.violations() == []


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 64), b=st.integers(1, 16), k=st.integers(1, 4), scheme=st.sampled_from(SCHEMES))
def test_transfers_stay_inside_their_group(n: int, b: int, k: int, scheme: str) -> None:
    """k-way: each group is led by one source and no block crosses between groups."""
    k = min(k, n)
    s = plan_multicast(n, b, k, scheme)
    group_of = {node: i for i, g in enumerate(s.groups) for node in g}
    assert sorted(group_of) == list(range(n))
    assert [g[0] for g in s.groups] == list(range(k))
    for step in s.steps:
        for tr in step:
            assert group_of[tr.src] == group_of[tr.dst]


def test_block_orders_rotate_chunks_per_group() -> None:
    """Algorithm 1: B=8, k=2 -> chunks [0..3], [4..7]; group 1 feeds the second chunk first."""
    assert block_orders(8, 2) == [[0, 1, 2, 3, 4, 5, 6, 7], [4, 5, 6, 7, 0, 1, 2, 3]]
    assert block_orders(5, 3) == [[0, 1, 2, 3, 4], [2, 3, 4, 0, 1], [4, 0, 1, 2, 3]]
    assert block_orders(2, 4) == [[0, 1], [1, 0], [0, 1], [0, 1]]  # chunks [0], [1], [], []


def test_k_way_sources_feed_complementary_blocks_first() -> None:
    """2 -> 8 binomial, B=4: group 0 starts with blocks 0,1 and group 1 with 2,3, so after B/k = 2
    steps the destinations hold the whole model between them (one source alone: only 0 and 1)."""
    s = plan_multicast(8, 4, 2)
    assert s.groups == ((0, 2, 3, 4), (1, 5, 6, 7))
    assert [tr.block for tr in s.steps[0]] == [0, 2]
    assert [(tr.src, tr.block) for tr in s.steps[1] if tr.src < 2] == [(0, 1), (1, 3)]

    def after_two(sched: Schedule) -> set[int]:
        return {tr.block for step in sched.steps[:2] for tr in step}

    assert after_two(s) == {0, 1, 2, 3}
    assert after_two(plan_multicast(8, 4, 1)) == {0, 1}


def test_split_groups_are_contiguous_and_balanced() -> None:
    """10 nodes, 4 sources: sizes 3,3,2,2, destinations dealt in contiguous runs."""
    assert split_groups(10, 4) == [[0, 4, 5], [1, 6, 7], [2, 8], [3, 9]]


def test_sequential_and_chain_shapes() -> None:
    """Sequential: the source serves destinations one after another; chain: node i feeds i+1."""
    s = plan_multicast(3, 2, scheme="sequential")
    assert fmt(s) == parse("0->1:0 | 0->1:1 | 0->2:0 | 0->2:1")
    c = plan_multicast(4, 2, scheme="chain")
    assert fmt(c) == parse("0->1:0 | 0->1:1, 1->2:0 | 1->2:1, 2->3:0 | 2->3:1")


def test_tree_forwards_left_then_right() -> None:
    """Tree of 3, B=2: the root alternates children; blocks reach both children in order."""
    s = plan_multicast(3, 2, scheme="tree")
    assert fmt(s) == parse("0->1:0 | 0->2:0 | 0->1:1 | 0->2:1")


def test_twin_construction_three_nodes() -> None:
    """N=3 (one twin pair), B=3: 4 steps = B + floor(log2 3), every node one port each way."""
    s = plan_multicast(3, 3)
    replay(s)
    assert s.num_steps == 4


@pytest.mark.parametrize("n", [65, 127, 129, 200, 255, 257, 383, 511])
def test_binomial_twins_beyond_64(n: int) -> None:
    """Past the exhaustive grid: B + floor(log2 N) steps and a valid plan for B = 1, 3, 17."""
    for b in (1, 3, 17):
        s = plan_multicast(n, b)
        replay(s)
        assert s.num_steps == b + math.floor(math.log2(n))


@pytest.mark.slow
def test_every_twin_corner_up_to_1023_nodes_and_64_blocks() -> None:
    """The twin greedy completes for every corner of every cube up to 2^9 corners and every
    B <= 64; twin pairs are planned independently of each other and of N, so this covers the
    binomial plan of every N < 1024 with B <= 64 (~10 s)."""
    for dims in range(1, 10):
        for b in range(1, 65):
            inn, out = _hypercube(dims, b)
            for v in range(1, 1 << dims):
                roles = _twin_roles(inn[v], out[v], b)  # raises if stuck or incomplete
                assert len(roles) == b + dims


def test_one_node_needs_no_step() -> None:
    """N=1 or N=k: nothing to send, zero steps."""
    assert plan_multicast(1, 5).num_steps == 0
    assert plan_multicast(3, 5, 3).num_steps == 0


def test_a_thousand_nodes_plan_in_linear_size() -> None:
    """N=1000, B=64: exactly (N-1)*B transfers in B + 9 steps, and the plan is valid."""
    s = plan_multicast(1000, 64)
    assert s.num_transfers == 999 * 64
    assert s.num_steps == 64 + 9
    assert s.violations() == []


def test_json_shape() -> None:
    """to_json: num_steps and steps of {src, dst, block}."""
    assert plan_multicast(2, 2).to_json() == {
        "num_steps": 2,
        "steps": [[{"src": 0, "dst": 1, "block": 0}], [{"src": 0, "dst": 1, "block": 1}]],
    }


def test_violations_name_each_broken_rule() -> None:
    """A hand-made bad schedule: double send, missing block, send to source, early send."""
    bad = Schedule(nodes=3, blocks=2, sources=1, scheme="custom",
                   steps=((Transfer(0, 1, 0), Transfer(0, 2, 1)), (Transfer(2, 0, 1), Transfer(1, 2, 1))),
                   groups=((0, 1, 2),), orders=((0, 1),))
    v = bad.violations()
    assert "step 0: node 0 sends twice" in v
    assert any("sends to source 0" in x for x in v)
    assert any("node 1 sends block 1 it does not hold yet" in x for x in v)
    assert any("node 1 ends without blocks [1]" in x for x in v)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"nodes": 0, "blocks": 4}, "nodes=0"),
        ({"nodes": 4, "blocks": 0}, "blocks=0"),
        ({"nodes": 4, "blocks": 4, "sources": 0}, "sources=0 with nodes=4"),
        ({"nodes": 4, "blocks": 4, "sources": 5}, "sources=5 with nodes=4"),
        ({"nodes": 4, "blocks": 4, "scheme": "ring"}, "scheme='ring' is unknown"),
        ({"nodes": 4.0, "blocks": 4}, "nodes=4.0 is not an integer"),
        ({"nodes": True, "blocks": 4}, "nodes=True is not an integer"),
    ],
)
def test_bad_inputs_are_config_errors(kwargs: dict[str, object], needle: str) -> None:
    """Bad N, B, k or scheme: ConfigError naming the value and the fix."""
    with pytest.raises(ConfigError) as exc:
        plan_multicast(**kwargs)  # type: ignore[arg-type]
    assert needle in str(exc.value)
