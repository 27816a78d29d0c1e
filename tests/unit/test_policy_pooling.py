"""Pool models of the elastic-storage comparison: elastic, caching, periodic reclaim, chunked, none."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import CapacityError
from gfaas.policy import PoolModel, storage_policy

MiB = 2**20
GiB = 2**30


def test_caching_pool_keeps_everything_and_fragments() -> None:
    p = PoolModel(storage_policy("caching"), 8 * GiB)
    a = p.alloc(100 * MiB, 0.0)
    b = p.alloc(100 * MiB, 0.0)
    assert (a.raw_calls, b.raw_calls) == (1, 1)
    p.free(a.handle, 1.0)
    p.free(b.handle, 1.0)
    assert (p.reserved_bytes, p.live_bytes) == (200 * MiB, 0)  # nothing goes back
    c = p.alloc(120 * MiB, 2.0)  # two free 100 MiB blocks of separate allocations: still a miss
    assert c.raw_calls == 1
    assert p.reserved_bytes == 320 * MiB
    d = p.alloc(90 * MiB, 3.0)  # fits a cached block: no driver call
    assert d.raw_calls == 0 and p.reserved_bytes == 320 * MiB


def test_periodic_reclaim_returns_free_blocks_on_schedule() -> None:
    p = PoolModel(storage_policy("reclaim-1min"), 8 * GiB)
    a = p.alloc(100 * MiB, 0.0)
    live = p.alloc(50 * MiB, 0.0)
    p.free(a.handle, 10.0)
    assert p.reserved_bytes == 150 * MiB
    assert p.tick(59.0) == 0
    assert p.tick(60.0) == 100 * MiB  # the empty block goes, the live one stays
    assert p.reserved_bytes == 50 * MiB
    assert p.alloc(100 * MiB, 61.0).raw_calls == 1  # and the next request pays for it again
    assert p.live_bytes == 150 * MiB
    p.free(live.handle, 62.0)


def test_chunked_pool_never_fragments_and_never_returns() -> None:
    p = PoolModel(storage_policy("gmlake"), 8 * GiB)
    a = p.alloc(100 * MiB, 0.0)
    b = p.alloc(100 * MiB, 0.0)
    assert (a.raw_calls, a.share_units) == (50, 50)
    p.free(a.handle, 1.0)
    p.free(b.handle, 1.0)
    c = p.alloc(120 * MiB, 2.0)  # stitched from 60 free chunks: no new memory
    assert (c.raw_calls, c.share_units, p.reserved_bytes) == (0, 60, 200 * MiB)
    p.free(c.handle, 3.0)
    assert p.reserved_bytes == 200 * MiB and p.live_bytes == 0


def test_elastic_pool_follows_the_target() -> None:
    p = PoolModel(storage_policy("gfaas"), 8 * GiB)
    assert p.reserved_bytes == 0  # nothing until the first tick pre-warms
    p.tick(0.0, 256 * MiB)
    assert p.reserved_bytes == 256 * MiB  # 64 MiB arenas: no object size known yet
    assert p.alloc(100 * MiB, 1.0).raw_calls == 1  # bigger than any arena: a miss
    q = PoolModel(storage_policy("gfaas"), 8 * GiB)
    q.tick(0.0, 256 * MiB, object_bytes=100 * MiB)  # told the forecast object size
    assert q.reserved_bytes == 200 * MiB
    g = q.alloc(100 * MiB, 1.0)
    assert g.raw_calls == 0  # served from a pre-warmed arena
    q.free(g.handle, 2.0)
    assert q.tick(3.0, 100 * MiB) == 100 * MiB
    assert q.reserved_bytes == 100 * MiB


def test_no_pool_pays_every_time_and_keeps_nothing() -> None:
    p = PoolModel(storage_policy("no-pool"), GiB)
    g = p.alloc(3 * MiB, 0.0)
    assert (g.raw_calls, g.nbytes, p.reserved_bytes) == (1, 4 * MiB, 4 * MiB)
    p.free(g.handle, 1.0)
    assert p.reserved_bytes == 0
    assert p.alloc(3 * MiB, 2.0).raw_calls == 1


@pytest.mark.parametrize("name", ["gfaas", "caching", "gmlake", "no-pool", "reclaim-1min"])
def test_cap_and_forged_handles(name: str) -> None:
    p = PoolModel(storage_policy(name), 64 * MiB)
    p.alloc(40 * MiB, 0.0)
    with pytest.raises(CapacityError):
        p.alloc(40 * MiB, 0.0)
    with pytest.raises(CapacityError, match="handle 999"):
        p.free(999, 0.0)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["gfaas", "caching", "gmlake", "no-pool", "reclaim-1min"]), st.integers(0, 2**31))
def test_reserved_covers_live_under_random_traffic(name: str, seed: int) -> None:
    rng = random.Random(seed)
    p = PoolModel(storage_policy(name), 4 * GiB)
    live: dict[int, int] = {}
    now = 0.0
    for _ in range(150):
        now += rng.expovariate(0.2)
        if live and rng.random() < 0.45:
            h = rng.choice(sorted(live))
            p.free(h, now)
            del live[h]
        else:
            try:
                g = p.alloc(rng.randint(1, 300) * MiB, now)
            except CapacityError:
                continue
            live[g.handle] = g.nbytes
        if name == "gfaas":
            p.tick(now, rng.randint(0, 2 * GiB))
        assert p.live_bytes == sum(live.values())
        assert p.live_bytes <= p.reserved_bytes <= 4 * GiB
