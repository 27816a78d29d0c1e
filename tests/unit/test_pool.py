"""The device segment pool: best fit, merging, arenas, reservation and cap (CPU, fake addresses)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import CapacityError, ConfigError
from gfaas.policy.pool import Block, MiB, SegmentPool


class Raw:
    """Fake raw allocator: hands out non-overlapping address ranges and records calls."""

    def __init__(self) -> None:
        self.next = 1 << 40
        self.live: dict[int, int] = {}
        self.calls: list[tuple[str, int]] = []

    def alloc(self, n: int) -> int:
        base, self.next = self.next, self.next + n + (1 << 30)
        self.live[base] = n
        self.calls.append(("alloc", n))
        return base

    def free(self, base: int) -> None:
        self.calls.append(("free", self.live.pop(base)))


def pool(raw: Raw, **kw: int) -> SegmentPool:
    kw.setdefault("cap_bytes", 256 * MiB)
    kw.setdefault("arena_bytes", 64 * MiB)
    return SegmentPool(raw.alloc, raw.free, **kw)


def test_blocks_come_from_one_arena_and_are_aligned() -> None:
    raw = Raw()
    p = pool(raw)
    a, b = p.alloc(1000), p.alloc(3000)
    assert raw.calls == [("alloc", 64 * MiB)]
    assert (a.offset, a.size, b.size) == (0, 1024, 3072)
    assert b.offset == 1024 and a.arena == b.arena and b.address == a.base + 1024


def test_free_merges_neighbours_so_the_whole_arena_is_reusable() -> None:
    raw = Raw()
    p = pool(raw, target_bytes=64 * MiB)
    blocks = [p.alloc(MiB) for _ in range(8)]
    for b in blocks[::2] + blocks[1::2]:
        p.free(b)
    big = p.alloc(64 * MiB)  # fits only if all eight merged back into one free block
    assert big.offset == 0 and raw.calls == [("alloc", 64 * MiB)]


def test_emptied_arena_goes_back_only_above_target() -> None:
    raw = Raw()
    p = pool(raw, target_bytes=64 * MiB)
    a = p.alloc(MiB)
    b = p.alloc(64 * MiB)  # needs a second arena
    assert p.stats().arenas == 2
    p.free(b)
    assert raw.calls[-1] == ("free", 64 * MiB) and p.stats().arenas == 1
    p.free(a)
    assert p.stats().arenas == 1  # within target: kept warm
    p.set_target(0)
    assert p.stats().arenas == 0 and p.held == 0


def test_prewarm_grows_to_the_target_in_whole_arenas() -> None:
    raw = Raw()
    p = pool(raw, target_bytes=150 * MiB)
    assert p.prewarm() == 128 * MiB and p.held == 128 * MiB
    p.alloc(10 * MiB)
    assert len(raw.calls) == 2


def test_large_object_gets_an_arena_rounded_to_2MiB() -> None:
    raw = Raw()
    p = pool(raw)
    b = p.alloc(100 * MiB + 1)
    assert raw.calls == [("alloc", 102 * MiB)] and b.size == 100 * MiB + 512


def test_cap_errors_name_the_numbers_and_empty_arenas_are_dropped_first() -> None:
    raw = Raw()
    p = pool(raw, cap_bytes=160 * MiB, target_bytes=160 * MiB)
    with pytest.raises(CapacityError, match="exceeds the pool's cap of 167772160"):
        p.alloc(161 * MiB)
    a = p.alloc(60 * MiB)
    b = p.alloc(60 * MiB)
    with pytest.raises(CapacityError, match="no room for .* in use"):
        p.alloc(60 * MiB)
    p.free(b)  # arena 2 empty, kept (within target)
    c = p.alloc(90 * MiB)  # needs a 90 MiB arena: the empty 64 MiB one is dropped to make room
    assert raw.calls[-2:] == [("free", 64 * MiB), ("alloc", 90 * MiB)] and c.size == 90 * MiB
    p.free(a)
    p.free(c)


def test_double_free_and_forged_blocks_are_refused_without_damage() -> None:
    raw = Raw()
    p = pool(raw, target_bytes=64 * MiB)
    a = p.alloc(4096)
    p.free(a)
    with pytest.raises(CapacityError, match="not live"):
        p.free(a)
    with pytest.raises(CapacityError, match="not from this pool"):
        p.free(Block(99, 0, 0, 4096))
    b = p.alloc(8192)
    with pytest.raises(CapacityError, match="not live"):
        p.free(Block(b.arena, b.base, b.offset, 4096))  # wrong size
    assert p.used == 8192


@pytest.mark.parametrize("kw", [{"arena_bytes": 3 * MiB}, {"align": 100}, {"cap_bytes": MiB}])
def test_bad_configuration(kw: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        pool(Raw(), **kw)


def test_arena_freed_callback_reports_serials() -> None:
    gone: list[int] = []
    raw = Raw()
    p = SegmentPool(raw.alloc, raw.free, cap_bytes=256 * MiB, on_arena_freed=gone.append)
    a = p.alloc(MiB)
    p.free(a)
    assert gone == [a.arena]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40 * MiB)), min_size=1, max_size=60))
def test_live_blocks_never_overlap_and_accounting_holds(script: list[tuple[bool, int]]) -> None:
    raw = Raw()
    p = pool(raw, cap_bytes=512 * MiB, target_bytes=64 * MiB)
    live: list[Block] = []
    for do_alloc, n in script:
        if do_alloc or not live:
            try:
                live.append(p.alloc(n))
            except CapacityError:
                assert p.used + n > 512 * MiB - 64 * MiB or p.held + n > 512 * MiB - 2 * MiB
        else:
            p.free(live.pop(n % len(live)))
        spans = sorted((b.address, b.address + b.size) for b in live)
        assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:], strict=False))
        assert p.used == sum(b.size for b in live)
        assert p.held == sum(raw.live.values()) <= p.cap
        for b in live:
            assert b.base in raw.live and b.offset + b.size <= raw.live[b.base]
    for b in live:
        p.free(b)
    assert p.used == 0 and p.held <= 64 * MiB


def test_an_arena_holds_one_owners_blocks_and_keeps_its_owner_until_it_goes_back() -> None:
    """Opening an arena's handle maps all of it, so two tenants never share one (issue 37, row 2): a
    second owner gets a prewarmed (unowned) arena or a new one, never room in the first owner's,
    even once that arena is empty again (its handle may still be open in the first owner's processes)."""
    raw = Raw()
    p = pool(raw, target_bytes=128 * MiB)
    assert p.prewarm() == 128 * MiB and len(raw.calls) == 2
    a1 = p.alloc(MiB, owner="wf-a")
    b1 = p.alloc(MiB, owner="wf-b")
    assert a1.arena != b1.arena and len(raw.calls) == 2  # each claimed a prewarmed arena: no raw alloc
    a2 = p.alloc(MiB, owner="wf-a")
    assert a2.arena == a1.arena  # its own arena still has room
    p.free(a1)
    p.free(a2)  # wf-a's arena is empty, kept (target), still wf-a's
    c1 = p.alloc(MiB, owner="wf-c")
    assert c1.arena not in (a1.arena, b1.arena) and raw.calls[-1] == ("alloc", 64 * MiB)
    assert p.alloc(MiB, owner="wf-a").arena == a1.arena


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "free"]), st.integers(1, 24 * MiB)), min_size=1,
                max_size=60))
def test_no_arena_ever_holds_two_owners_blocks(script: list[tuple[str, int]]) -> None:
    raw = Raw()
    p = pool(raw, cap_bytes=512 * MiB, target_bytes=128 * MiB)
    p.prewarm()
    live: list[tuple[str, Block]] = []
    owner_of: dict[int, str] = {}  # arena serial -> the owner of the blocks it has held since it came
    for op, n in script:
        if op == "free" and live:
            p.free(live.pop(n % len(live))[1])
        elif op != "free":
            try:
                b = p.alloc(n, owner=op)
            except CapacityError:
                continue
            assert owner_of.setdefault(b.arena, op) == op, (b.arena, owner_of[b.arena], op)
            live.append((op, b))
        owner_of = {s: o for s, o in owner_of.items() if s in p.arenas}  # a returned arena's serial never comes back
        spans = sorted((b.address, b.address + b.size) for _, b in live)
        assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:], strict=False))
        assert p.used == sum(b.size for _, b in live)
