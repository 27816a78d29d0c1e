"""SLO-aware rates, batched chunk issue and the pinned staging ring (seed 000 §6.1, seed 001 §4.3.2)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.policy import ChunkBatcher, Demand, MiB, PinnedRing, deadline_for, rate_least, slo_for, slo_rates

GB = 10**9


# ---- rate_least / slo_for -----------------------------------------------------------------------
def test_rate_least_is_bytes_over_time_left() -> None:
    """6 GB due in 2 s from now needs 3 GB/s; nothing left needs 0; a passed deadline needs inf."""
    assert rate_least(6 * GB, deadline=12.0, now=10.0) == 3.0
    assert rate_least(0, deadline=1.0, now=5.0) == 0.0
    assert rate_least(1, deadline=5.0, now=5.0) == math.inf
    assert rate_least(1, deadline=4.0, now=5.0) == math.inf
    with pytest.raises(ConfigError, match="remaining_bytes=-1"):
        rate_least(-1, 1.0, 0.0)


def test_slo_is_a_multiple_of_execution_time_and_deadline_leaves_room_for_inference() -> None:
    """SLO 1.5x by default (2x allowed); the data deadline is start + SLO - inference."""
    assert slo_for(0.2) == pytest.approx(0.3)
    assert slo_for(0.2, factor=2.0) == pytest.approx(0.4)
    assert deadline_for(start=10.0, slo_s=0.3, inference_s=0.2) == pytest.approx(10.1)
    with pytest.raises(ConfigError, match="factor=1.0"):
        slo_for(0.2, factor=1.0)
    with pytest.raises(ConfigError, match="exec_time_s=0"):
        slo_for(0)


# ---- slo_rates ----------------------------------------------------------------------------------
def test_idle_bandwidth_goes_to_the_tightest_deadline() -> None:
    """Capacity 12; a needs 2 GB/s, b needs 3 and is due first: a 2, b 3 + 7 = 10."""
    demands = [Demand("a", 4 * GB, deadline=2.0), Demand("b", 3 * GB, deadline=1.0)]
    assert slo_rates(demands, 12.0, now=0.0) == {"a": 2.0, "b": 10.0}


def test_overload_scales_least_rates_down_proportionally() -> None:
    """Needs 8 and 16 on a 12 GB/s link: both get half of their need, 4 and 8."""
    demands = [Demand("a", 8 * GB, deadline=1.0), Demand("b", 32 * GB, deadline=2.0)]
    rates = slo_rates(demands, 12.0, now=0.0)
    assert rates == pytest.approx({"a": 4.0, "b": 8.0})
    assert sum(rates.values()) == pytest.approx(12.0, abs=1e-12)


def test_late_transfers_share_everything_by_remaining_bytes() -> None:
    """Two transfers past their deadline split 12 GB/s 1:3 by bytes left; the on-time one waits."""
    demands = [Demand("late1", 1 * GB, 0.5), Demand("ok", 1 * GB, 9.0), Demand("late2", 3 * GB, 0.9)]
    assert slo_rates(demands, 12.0, now=1.0) == {"late1": 3.0, "ok": 0.0, "late2": 9.0}


def test_slo_rates_ties_edge_cases_and_errors() -> None:
    """Equal deadlines: the first listed is tightest; finished transfers get no idle share; errors."""
    same = [Demand("a", GB, 1.0), Demand("b", GB, 1.0)]
    assert slo_rates(same, 10.0, 0.0) == {"a": 9.0, "b": 1.0}
    done = [Demand("done", 0, 0.5), Demand("busy", GB, 2.0)]
    assert slo_rates(done, 10.0, 0.0) == {"done": 0.0, "busy": 10.0}
    assert slo_rates([], 10.0, 0.0) == {}
    with pytest.raises(ConfigError, match="capacity_gbps=0"):
        slo_rates(same, 0, 0.0)
    with pytest.raises(ConfigError, match="repeat"):
        slo_rates([Demand("a", 1, 1.0), Demand("a", 2, 2.0)], 1.0, 0.0)


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 10 * GB), st.floats(-2.0, 10.0)), min_size=1, max_size=8),
       st.floats(0.5, 400.0))
def test_slo_rates_are_work_conserving_and_nonnegative(specs: list[tuple[int, float]], cap: float) -> None:
    """Whatever the demands: every rate >= 0 and they add up to the capacity."""
    demands = [Demand(i, b, d) for i, (b, d) in enumerate(specs)]
    rates = slo_rates(demands, cap, now=0.0)
    assert set(rates) == set(range(len(specs)))
    assert all(r >= 0 for r in rates.values())
    assert sum(rates.values()) == pytest.approx(cap, rel=1e-9)


# ---- ChunkBatcher -------------------------------------------------------------------------------
def test_batches_follow_the_rate_ratio_within_one_chunk() -> None:
    """Rates 3:1 over 200 batches of 5: counts stay within one chunk of 3/4 and 1/4 all along."""
    b = ChunkBatcher()
    b.add("x", 10**12)
    b.add("y", 10**12)
    seen: Counter[str] = Counter()
    for k in range(1, 201):
        batch = b.next_batch({"x": 3.0, "y": 1.0})
        assert len(batch) == 5 and all(n == 2 * MiB for _, n in batch)
        seen.update(t for t, _ in batch)
        total = 5 * k
        assert abs(seen["x"] - total * 3 / 4) <= 1.0 + 1e-9, (k, seen)
        assert abs(seen["y"] - total / 4) <= 1.0 + 1e-9, (k, seen)


def test_newcomer_is_in_the_very_next_batch() -> None:
    """A transfer added between batches issues a chunk first in the next one, even at a small rate."""
    b = ChunkBatcher(chunk_bytes=MiB, batch_chunks=5)
    b.add("old", 100 * MiB)
    assert b.next_batch({"old": 10.0}) == [("old", MiB)] * 5
    b.add("new", 3 * MiB)
    batch = b.next_batch({"old": 10.0, "new": 0.5})
    assert batch[0] == ("new", MiB)
    assert len(batch) == 5


def test_last_chunk_is_short_and_paused_transfers_wait() -> None:
    """5 MiB in 2 MiB chunks: 2, 2, 1. Rate 0 pauses a transfer unless everyone is paused."""
    b = ChunkBatcher(batch_chunks=5)
    b.add("a", 5 * MiB)
    b.add("p", 4 * MiB)
    first = b.next_batch({"a": 1.0, "p": 0.0})
    assert first == [("a", 2 * MiB), ("a", 2 * MiB), ("a", MiB)]
    assert b.remaining("a") == 0 and b.remaining("p") == 4 * MiB
    assert b.next_batch({"a": 1.0, "p": 0.0}) == [("p", 2 * MiB), ("p", 2 * MiB)]  # nobody else: equal share
    assert b.next_batch({}) == []
    b.remove("a")
    with pytest.raises(ConfigError, match="'a' is not queued"):
        b.remove("a")
    with pytest.raises(ConfigError, match="already queued"):
        b.add("p", 1)
    with pytest.raises(ConfigError, match="must be >= 0"):
        b.next_batch({"p": -1.0})
    with pytest.raises(ConfigError, match="both must be > 0"):
        ChunkBatcher(batch_chunks=0)


# ---- PinnedRing ---------------------------------------------------------------------------------
def test_ring_wraps_and_reclaims_in_fifo_order() -> None:
    """10-byte ring: 4 + 4, then 4 must wait for the head; an out-of-order release waits its turn."""
    ring = PinnedRing(10)
    assert ring.acquire(4) == 0
    assert ring.acquire(4) == 4
    assert ring.acquire(4) is None  # 2 bytes at the end, and the head is at 0
    ring.release(4)  # the younger one: marked, not reclaimed yet
    assert ring.acquire(4) is None
    ring.release(0)  # now both go
    assert ring.used_bytes == 0
    assert ring.acquire(10) == 0
    with pytest.raises(ConfigError, match="release\\(3\\)"):
        ring.release(3)
    with pytest.raises(ConfigError, match="1..10"):
        ring.acquire(11)


def test_ring_wraps_to_the_start_when_the_end_is_too_small() -> None:
    """After the head moves on, a range that does not fit at the end starts at offset 0."""
    ring = PinnedRing(10)
    a, b = ring.acquire(4), ring.acquire(4)
    ring.release(a)  # type: ignore[arg-type]
    assert ring.acquire(3) == 0  # end has 2 bytes: wrap; [0, 3) is free since the head is at 4
    assert ring.acquire(2) is None  # wrapped: free space is [3, 4)
    assert ring.acquire(1) == 3
    ring.release(b)  # type: ignore[arg-type]
    assert ring.live() == [(0, 3), (3, 1)]


@settings(max_examples=200)
@given(st.integers(1, 64), st.lists(st.tuples(st.booleans(), st.integers(1, 64), st.integers(0, 1000)),
                                     max_size=60))
def test_ring_never_hands_out_overlapping_live_ranges(cap: int, ops: list[tuple[bool, int, int]]) -> None:
    """Random acquire/release: live ranges stay inside the ring, disjoint; empty ring serves its capacity."""
    ring = PinnedRing(cap)
    live: list[tuple[int, int]] = []
    for acquire, size, pick in ops:
        if acquire or not live:
            if size > cap:
                continue
            off = ring.acquire(size)
            if off is not None:
                assert off >= 0 and off + size <= cap
                for o, s in live:
                    assert off + size <= o or o + s <= off, (off, size, live)
                live.append((off, size))
        else:
            off, _ = live.pop(pick % len(live))
            ring.release(off)
        assert sorted(ring.live()) == sorted(live)
    for off, _ in live:
        ring.release(off)
    assert ring.used_bytes == 0
    assert ring.acquire(cap) == 0
