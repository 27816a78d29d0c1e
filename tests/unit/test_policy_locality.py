"""Data locality across nodes (gfaas.policy.locality): where a worker starts and which queued call it takes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas.policy.locality import LOOKAHEAD, choose_node, pick_call

NODES = ["m1", "m2", "m3"]


def test_choose_node_prefers_the_inputs_then_the_least_loaded_then_the_first() -> None:
    """Most input bytes wins; equal bytes go to fewer workers; then candidate order."""
    assert choose_node(NODES, {"m2": 10, "m3": 5}) == "m2"
    assert choose_node(NODES, {"gateway": 100, "m3": 1}) == "m3"  # the holder is no candidate: next best
    assert choose_node(NODES, {}, {"m1": 2, "m2": 1, "m3": 1}) == "m2"
    assert choose_node(NODES, {"m1": 4, "m2": 4}, {"m1": 3}) == "m2"
    assert choose_node(NODES, {}) == "m1"
    with pytest.raises(ValueError):
        choose_node([], {"m1": 1})


@given(st.dictionaries(st.sampled_from(NODES + ["gateway"]), st.integers(0, 1 << 30)),
       st.dictionaries(st.sampled_from(NODES), st.integers(0, 8)))
def test_choose_node_never_leaves_more_bytes_behind(held: dict[str, int], load: dict[str, int]) -> None:
    """No candidate holds more of the inputs than the chosen one, and the choice is a candidate."""
    got = choose_node(NODES, held, load)
    assert got in NODES
    assert all(held.get(n, 0) <= held.get(got, 0) for n in NODES)


def test_pick_call_takes_its_own_first_and_leaves_calls_to_free_workers_elsewhere() -> None:
    """A worker on m1 takes the oldest call for m1; else the oldest no free worker will take; else waits."""
    assert pick_call("m1", ["m2", "m1", None]) == 1
    assert pick_call("m1", ["m2", None], idle={"m2"}) == 1
    assert pick_call("m1", ["m2", "m3"], idle={"m2"}) == 1
    assert pick_call("m1", ["m2", "m2"], idle={"m2"}) is None
    assert pick_call("m1", ["m2", "m2"], idle=set()) == 0  # m2 has no free worker: do not let it wait
    calls = ["m2"] * LOOKAHEAD + ["m1"]
    assert pick_call("m1", calls, idle={"m2"}) is None  # beyond the look-ahead: not seen


@given(st.lists(st.sampled_from(NODES + [None]), min_size=1, max_size=40), st.sampled_from(NODES),
       st.sets(st.sampled_from(NODES)))
def test_pick_call_is_work_conserving(prefs: list[str | None], node: str, idle: set[str]) -> None:
    """A free worker waits only when every call in view prefers another node that has a free worker."""
    idle = idle - {node}
    k = pick_call(node, prefs, idle)
    view = prefs[:LOOKAHEAD]
    if k is None:
        assert all(p is not None and p != node and p in idle for p in view)
    else:
        assert 0 <= k < len(view)
        if node in view:
            assert k == view.index(node)
