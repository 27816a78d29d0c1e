"""Execution pipelines over partly loaded nodes (seed 002 Algorithm 2), checked against the
multicast schedules that drive them and against a brute-force oracle for the stage assignment."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.policy import PipelinePlanner, Stage, assign_stages, pipeline_changes, plan_multicast
from gfaas.policy.multicast import SCHEMES


def mask(blocks: set[int] | list[int]) -> int:
    return sum(1 << b for b in set(blocks))


def oracle(holdings: dict[int, int], blocks: int) -> tuple[int, int] | None:
    """(fewest stages, smallest largest stage) over every ordered choice of distinct nodes and
    every way to cut 0..blocks-1 into that many consecutive non-empty ranges."""
    nodes = list(holdings)
    for m in range(1, min(len(nodes), blocks) + 1):
        best = None
        for cut in itertools.combinations(range(1, blocks), m - 1):
            bounds = [0, *cut, blocks]
            ranges = [mask(list(range(bounds[j], bounds[j + 1]))) for j in range(m)]
            for perm in itertools.permutations(nodes, m):
                if all(holdings[n] & r == r for n, r in zip(perm, ranges, strict=True)):
                    size = max(bounds[j + 1] - bounds[j] for j in range(m))
                    best = size if best is None else min(best, size)
                    break
        if best is not None:
            return m, best
    return None


def check_stages(stages: tuple[Stage, ...], holdings: dict[int, int], blocks: int) -> None:
    assert stages[0].start == 0 and stages[-1].stop == blocks
    for a, b in itertools.pairwise(stages):
        assert a.stop == b.start, "stages must cover the blocks in order, each once"
    assert len({s.node for s in stages}) == len(stages), "a node serves two stages"
    for s in stages:
        assert s.start < s.stop
        want = mask(list(range(s.start, s.stop)))
        assert holdings[s.node] & want == want, f"{s} lacks blocks it must run"


@settings(max_examples=200, deadline=None)
@given(
    blocks=st.integers(1, 7),
    data=st.data(),
)
def test_assign_stages_matches_the_brute_force_oracle(blocks: int, data: st.DataObject) -> None:
    """Random holdings of 1-4 nodes: fewest stages and the most balanced cut, as brute force finds."""
    n = data.draw(st.integers(1, 4))
    holdings = {10 + i: data.draw(st.integers(0, (1 << blocks) - 1)) for i in range(n)}
    got = assign_stages(list(holdings), holdings, blocks)
    want = oracle(holdings, blocks)
    if want is None:
        assert got is None
        return
    assert got is not None
    check_stages(got, holdings, blocks)
    assert (len(got), max(s.stop - s.start for s in got)) == want


def test_assign_stages_needs_the_search_when_greedy_blocks_itself() -> None:
    """Node 1 reaches furthest from block 0 but is also the only holder of block 3: taking it
    first leaves block 3 uncovered; the search covers 0 | 1-2 | 3 with nodes 2, 3, 1."""
    holdings = {1: mask([0, 1, 3]), 2: mask([0]), 3: mask([1, 2])}
    assert assign_stages([1, 2, 3], holdings, 4) == (Stage(2, 0, 1), Stage(3, 1, 3), Stage(1, 3, 4))


def test_two_way_scaling_to_eight_exact_log() -> None:
    """2 -> 8 binomial, B=4 (seed 002 Fig. 5): pipelines pair one node of each sub-group as soon
    as they hold complementary halves, then every node goes local after the last step."""
    log = [(c.step, c.kind, c.pipeline and [(s.node, s.start, s.stop) for s in c.pipeline.stages], c.node)
           for c in pipeline_changes(plan_multicast(8, 4, 2))]
    assert log == [
        (3, "formed", [(3, 0, 2), (6, 2, 4)], None),
        (3, "formed", [(4, 0, 2), (7, 2, 4)], None),
        (4, "formed", [(2, 0, 2), (5, 2, 4)], None),
        (5, "retired", [(2, 0, 2), (5, 2, 4)], None),
        (5, "local", None, 2),
        (5, "retired", [(3, 0, 2), (6, 2, 4)], None),
        (5, "local", None, 3),
        (5, "retired", [(4, 0, 2), (7, 2, 4)], None),
        (5, "local", None, 4),
        (5, "local", None, 5),
        (5, "local", None, 6),
        (5, "local", None, 7),
    ]


@settings(max_examples=80, deadline=None)
@given(n=st.integers(2, 64), b=st.integers(1, 16), k=st.integers(1, 4), scheme=st.sampled_from(SCHEMES))
def test_pipelines_follow_the_rules_during_any_multicast(n: int, b: int, k: int, scheme: str) -> None:
    """Replaying any schedule: stages cover 0..B-1 once and in order on nodes that hold them at
    formation, no node is in two pipelines or both local and in one, pipelines retire exactly when
    a member completes, and every destination ends local with nothing active."""
    k = min(k, n)
    s = plan_multicast(n, b, k, scheme)
    held = {node: 0 for node in range(n)}
    group_of = {node: i for i, g in enumerate(s.groups) for node in g}
    planner = PipelinePlanner.for_schedule(s)
    active: dict[int, tuple[int, ...]] = {}
    local: set[int] = set()
    full = (1 << b) - 1
    for t, step in enumerate(s.steps):
        arrived: dict[int, list[int]] = {}
        for tr in step:
            held[tr.dst] |= 1 << tr.block
            arrived.setdefault(tr.dst, []).append(tr.block)
        completed = {d for d in arrived if held[d] == full}
        for c in planner.on_blocks(t + 1, arrived):
            assert c.step == t + 1
            if c.kind == "local":
                assert c.node in completed and c.node not in local
                local.add(c.node)  # type: ignore[arg-type]
            elif c.kind == "retired":
                assert c.pipeline is not None and c.pipeline.id in active
                assert completed & set(c.pipeline.nodes), "retired without a member completing"
                del active[c.pipeline.id]
            else:
                assert c.pipeline is not None
                check_stages(c.pipeline.stages, held, b)
                nodes = set(c.pipeline.nodes)
                busy = {x for p in active.values() for x in p}
                assert not nodes & busy, "node in two pipelines"
                assert not nodes & local, "a local node joined a pipeline"
                assert not nodes & set(range(k)), "a source joined a pipeline"
                groups = [group_of[x] for x in c.pipeline.nodes]
                assert len(set(groups)) == len(groups) or len(set(groups)) == 1, "Algorithm 2 mixes or stays in one group"
                active[c.pipeline.id] = c.pipeline.nodes
        # no active pipeline keeps a complete member
        assert all(held[x] != full for p in active.values() for x in p)
        assert {p.id for p in planner.active} == set(active)
    assert not active and not planner.active
    assert local == set(range(k, n)) == set(planner.local)


def test_k_way_forms_pipelines_earlier_than_one_source() -> None:
    """4 -> 32 binomial, B=16: the first pipeline forms earlier than with one source (1 -> 32)."""

    def first(k: int) -> int:
        return min(c.step for c in pipeline_changes(plan_multicast(32, 16, k)) if c.kind == "formed")

    assert first(4) < first(1)


def test_bad_planner_inputs() -> None:
    """Unknown nodes, out-of-range blocks, repeated nodes and B < 1 are ConfigErrors naming them."""
    with pytest.raises(ConfigError, match="blocks=0"):
        PipelinePlanner([[1]], 0)
    with pytest.raises(ConfigError, match="node 2 is listed in two sub-groups"):
        PipelinePlanner([[1, 2], [2]], 4)
    p = PipelinePlanner([[1, 2]], 4)
    with pytest.raises(ConfigError, match="node 9 is in no sub-group"):
        p.on_blocks(1, {9: [0]})
    with pytest.raises(ConfigError, match="block 4 at node 1 is out of range 0..3"):
        p.on_blocks(1, {1: [4]})
