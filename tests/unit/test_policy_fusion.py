"""gfaas.policy.fusion: which functions run in another's worker right after it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.policy.fusion import Stage, chains


def S(name: str, *sources: str, gated: bool = False, fusable: bool = True, group: str = "g") -> Stage:
    return Stage(name, sources, gated, fusable, group)


@pytest.mark.parametrize("stages, want", [
    ([S("gen"), S("red", "gen")], {"gen": ("red",)}),  # the tiny workflow
    ([S("a"), S("b", "a"), S("c", "b")], {"a": ("b", "c"), "b": ("c",)}),
    ([S("a"), S("b", "a"), S("c", "a")], {}),  # a has two readers: neither may wait for the other
    ([S("a"), S("b"), S("c", "a", "b")], {}),  # c reads two functions
    ([S("a"), S("b", "a", gated=True)], {}),  # a condition is the invoker's to decide
    ([S("a"), S("b", "a", fusable=False)], {}),
    ([S("a", fusable=False), S("b", "a")], {}),
    ([S("a", group="n0"), S("b", "a", group="n1")], {}),  # another node, device or reservation
    ([S("a"), S("b", "a"), S("c", "b", "a")], {}),  # a is read by b and c
    ([S("a"), S("b", "a"), S("c", "b"), S("d", "c", fusable=False)], {"a": ("b", "c"), "b": ("c",)}),
])
def test_chains(stages: list[Stage], want: dict[str, tuple[str, ...]]) -> None:
    assert chains(stages) == want


def test_an_unknown_source_is_an_error() -> None:
    with pytest.raises(ValueError, match="stage 'b' reads from unknown stage 'x'"):
        chains([S("a"), S("b", "x")])


@st.composite
def dags(draw: st.DrawFn) -> list[Stage]:
    n = draw(st.integers(1, 9))
    out = []
    for k in range(n):
        srcs = draw(st.sets(st.integers(0, k - 1), max_size=3)) if k else set()
        out.append(Stage(f"f{k}", tuple(f"f{j}" for j in sorted(srcs)), draw(st.booleans()), draw(st.booleans()),
                         draw(st.sampled_from("xy"))))
    return out


@settings(max_examples=300, deadline=None)
@given(dags())
def test_every_step_of_a_chain_is_the_only_way_on(stages: list[Stage]) -> None:
    """Each next function reads from the one before alone, is its only reader, ungated, fusable, in its
    group; each chain is the head's follower's chain with the follower in front; and every pair that
    qualifies is in one (checked against the definition, pair by pair)."""
    by = {s.name: s for s in stages}
    readers = {s.name: [r.name for r in stages if s.name in r.sources] for s in stages}

    def qualifies(a: str, b: str) -> bool:
        sa, sb = by[a], by[b]
        return (sb.sources == (a,) and not sb.gated and sa.fusable and sb.fusable and sa.group == sb.group
                and readers[a] == [b])

    got = chains(stages)
    pairs = {(a, b) for a in by for b in by if qualifies(a, b)}
    assert {(a, c[0]) for a, c in got.items()} == pairs
    for head, chain in got.items():
        assert all(qualifies(x, y) for x, y in zip((head, *chain), chain, strict=False))
        assert chain[1:] == got.get(chain[0], ())
