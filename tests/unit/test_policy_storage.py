"""The elastic-storage policy: histograms, reservations, pool target, eviction, restore, migration."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.policy import (
    STORAGE_POLICIES,
    DemandTracker,
    Peer,
    QueueBook,
    Resident,
    SlidingQuantile,
    StorageOptions,
    eviction_order,
    migration_target,
    plan_eviction,
    plan_restore,
    pool_target,
    positions_by_consumer,
    storage_policy,
    unneeded,
)

MB = 10**6


# ---- histograms --------------------------------------------------------------------------------
def test_quantile_is_nearest_rank_over_the_window() -> None:
    h = SlidingQuantile(window_s=10.0, max_samples=1000)
    for i in range(1, 101):
        h.add(0.0, float(i))
    assert h.quantile(0.99, 0.0) == 99.0
    assert h.quantile(0.5, 0.0) == 50.0
    assert h.quantile(1.0, 0.0) == 100.0
    assert h.quantile(0.99, 10.0) == 99.0  # a sample exactly window_s old still counts
    assert h.quantile(0.99, 10.01) is None  # then all expire


def test_quantile_keeps_the_newest_samples() -> None:
    h = SlidingQuantile(window_s=1e9, max_samples=3)
    for v in (100.0, 1.0, 2.0, 3.0):
        h.add(0.0, v)
    assert len(h) == 3
    assert h.quantile(1.0, 0.0) == 3.0


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200), st.floats(0.01, 1.0))
def test_quantile_matches_sorted_oracle(values: list[float], q: float) -> None:
    h = SlidingQuantile(window_s=1.0, max_samples=1000)
    for v in values:
        h.add(0.0, v)
    s = sorted(values)
    assert h.quantile(q, 0.0) == s[max(1, math.ceil(q * len(s))) - 1]


@given(st.lists(st.tuples(st.floats(0, 5), st.integers(0, 20)), min_size=1, max_size=150),
       st.integers(1, 40), st.floats(0.01, 1.0))
def test_sliding_quantile_matches_a_resorting_oracle_as_samples_come_and_go(
        steps: list[tuple[float, int]], max_samples: int, q: float) -> None:
    """Kept sorted incrementally, the quantile equals sorting the samples still in the window (the
    newest ``max_samples``, none older than ``window_s``) after every add, and next_expiry is when
    the oldest leaves."""
    h = SlidingQuantile(window_s=3.0, max_samples=max_samples)
    now, kept = 0.0, []
    for dt, v in steps:
        now += dt
        h.add(now, float(v))
        kept = [(t, x) for t, x in [*kept, (now, float(v))] if t >= now - 3.0][-max_samples:]
        s = sorted(x for _, x in kept)
        assert h.quantile(q, now) == s[max(1, math.ceil(q * len(s))) - 1]
        assert h.next_expiry() == kept[0][0] + 3.0
    assert h.quantile(q, now + 3.01) is None and h.next_expiry() is None


def test_plan_is_target_largest_object_and_next_change_in_one_pass() -> None:
    """DemandTracker.plan answers as target, largest_object and next_change do, plus the first sample
    expiry; each reported event moves ``version``."""
    t = DemandTracker(StorageOptions(floor_bytes=MB))
    v0 = t.version
    for k in range(4):
        t.request("f", 2.0 * k)
        t.stored("f", (k + 1) * 10 * MB, 2.0 * k + 0.5)
    t.request("g", 1.0)
    t.stored("g", 3 * MB, 1.5)
    t.released("f", 7.0)
    assert t.version == v0 + 11
    for now, free in ((7.0, None), (7.0, 50 * MB), (8.5, None), (70.0, None)):
        p = t.plan(now, free)
        assert (p.target, p.largest_object, p.next_change) == (t.target(now, free), t.largest_object(now),
                                                                t.next_change(now))
    assert t.plan(7.0).next_expiry == 0.5 + 600.0  # f's first size sample (a first request has no gap)


# ---- reservations ------------------------------------------------------------------------------
def test_reservation_is_size_times_accumulation_while_active() -> None:
    t = DemandTracker(StorageOptions(floor_bytes=0))
    # Requests every 2 s; each stores 10 MB; three executions' data pile up before any is read.
    for k in range(3):
        t.request("f", 2.0 * k)
        t.stored("f", 10 * MB, 2.0 * k + 0.5)
    r = t.reservation("f", 4.5)
    assert (r.r_window_s, r.r_size, r.r_con, r.active) == (2.0, 10 * MB, 3, True)
    assert r.nbytes == 30 * MB
    assert t.demand(6.0) == 30 * MB  # 2 s after the last request: still inside R_window
    assert t.next_change(6.0) == 6.0
    assert t.demand(6.001) == 0  # reclaimed once no request came within R_window
    assert not t.reservation("f", 6.001).active


def test_released_data_lowers_later_accumulation() -> None:
    t = DemandTracker(StorageOptions(floor_bytes=0))
    for k in range(200):
        t.request("g", float(k))
        t.stored("g", MB, k + 0.1)
        t.released("g", k + 0.2)  # read at once: never more than one live
    assert t.reservation("g", 199.5).r_con == 1


def test_first_request_uses_the_default_window() -> None:
    t = DemandTracker(StorageOptions(floor_bytes=0, default_window_s=5.0))
    t.request("h", 100.0)
    t.stored("h", 7 * MB, 100.1)
    r = t.reservation("h", 104.0)
    assert (r.r_window_s, r.nbytes, r.active) == (5.0, 7 * MB, True)
    assert t.demand(105.5) == 0


def test_long_gaps_are_capped_by_max_window() -> None:
    t = DemandTracker(StorageOptions(floor_bytes=0, max_window_s=30.0, window_s=1e6))
    t.request("f", 0.0)
    t.request("f", 3600.0)
    t.stored("f", MB, 3600.0)
    assert t.reservation("f", 3600.0).r_window_s == 30.0


def test_unknown_function_reserves_nothing() -> None:
    t = DemandTracker()
    assert t.reservation("nobody", 0.0).nbytes == 0
    assert t.next_change(0.0) is None
    assert t.target(0.0) == 300 * MB  # the floor


def test_target_adds_active_functions_only() -> None:
    t = DemandTracker(StorageOptions(floor_bytes=0, default_window_s=10.0))
    t.request("a", 0.0)
    t.stored("a", 100 * MB, 0.0)
    t.request("b", 5.0)
    t.stored("b", 50 * MB, 5.0)
    assert t.target(6.0) == 150 * MB
    assert t.target(12.0) == 50 * MB  # a expired at 10 s
    assert t.target(16.0) == 0
    assert t.largest_object(6.0) == 100 * MB
    assert t.largest_object(12.0) == 50 * MB


def test_pool_target_floor_and_cap() -> None:
    o = StorageOptions(floor_bytes=300 * MB, cap_fraction=0.5)
    assert pool_target(0, None, o) == 300 * MB
    assert pool_target(1000 * MB, None, o) == 1000 * MB
    assert pool_target(1000 * MB, 1200 * MB, o) == 600 * MB
    assert pool_target(0, 200 * MB, o) == 100 * MB  # scarce memory: the cap beats the floor
    with pytest.raises(ConfigError, match="free_bytes=-1"):
        pool_target(0, -1, o)
    with pytest.raises(ConfigError, match="demand=-5"):
        pool_target(-5, None, o)


def test_stored_rejects_negative_sizes() -> None:
    with pytest.raises(ConfigError, match="-3 bytes for 'f'"):
        DemandTracker().stored("f", -3, 0.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 50), st.integers(0, 10**9),
                          st.booleans()), max_size=60),
       st.floats(0, 200), st.integers(0, 10**11))
def test_target_is_clamped_demand(events: list[tuple[str, float, int, bool]], now: float, free: int) -> None:
    o = StorageOptions(floor_bytes=300 * MB)
    t = DemandTracker(o)
    for fn, at, size, release in sorted(events, key=lambda e: e[1]):
        t.request(fn, at)
        t.stored(fn, size, at)
        if release:
            t.released(fn, at)
    d = t.demand(now)
    assert d == sum(r.nbytes for r in t.reservations(now) if r.active)
    assert t.target(now, free) == min(max(d, 300 * MB), free // 2)
    for r in t.reservations(now):
        assert r.r_con >= 1 and r.r_size >= 0


# ---- eviction ------------------------------------------------------------------------------------
def _r(key: str, nbytes: int, at: float, pos: int | None, readers: int = 1, pinned: bool = False) -> Resident:
    return Resident(key, nbytes, at, pos, readers, pinned)


def test_queue_aware_evicts_the_furthest_back_consumer_first() -> None:
    # 001 Fig. 11b: a1's output was stored first but b1 runs next; a2's output waits longest.
    res = [_r("a1-out", 10, 1.0, 0), _r("a2-out", 10, 2.0, 3), _r("a3-out", 10, 3.0, 1)]
    order = [r.key for r in eviction_order(res, StorageOptions())]
    assert order == ["a2-out", "a3-out", "a1-out"]
    lru = [r.key for r in eviction_order(res, StorageOptions(eviction="lru"))]
    assert lru == ["a1-out", "a2-out", "a3-out"]


def test_no_consumer_queued_counts_as_furthest_and_newest_goes_first_among_equals() -> None:
    res = [_r("x", 1, 5.0, 2), _r("old", 1, 1.0, None), _r("new", 1, 9.0, None), _r("y", 1, 7.0, 2)]
    assert [r.key for r in eviction_order(res, StorageOptions())] == ["new", "old", "y", "x"]


def test_pinned_objects_never_move() -> None:
    res = [_r("p", 100, 0.0, None, pinned=True), _r("q", 10, 0.0, 0)]
    assert [r.key for r in plan_eviction(res, 50, StorageOptions())] == ["q"]
    assert plan_restore([_r("p", 1, 0.0, 0, pinned=True)], 100, StorageOptions()) == []


def test_plan_eviction_frees_enough_unread_first() -> None:
    res = [_r("soon", 40, 1.0, 0), _r("late", 40, 2.0, 5), _r("dead", 30, 3.0, 0, readers=0), _r("mid", 40, 4.0, 2)]
    o = StorageOptions()
    assert unneeded(res, o) == ["dead"]
    assert [r.key for r in plan_eviction(res, 30, o)] == ["dead"]
    assert [r.key for r in plan_eviction(res, 31, o)] == ["dead", "late"]
    assert [r.key for r in plan_eviction(res, 1000, o)] == ["dead", "late", "mid", "soon"]
    assert plan_eviction(res, 0, o) == []
    keep = StorageOptions(release_unread=False)
    assert unneeded(res, keep) == []
    assert [r.key for r in plan_eviction(res, 31, keep)][0] == "late"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 100), st.floats(0, 10), st.one_of(st.none(), st.integers(0, 20)),
                          st.integers(0, 2), st.booleans()), max_size=30),
       st.integers(0, 3000), st.sampled_from(["queue", "lru"]))
def test_plan_eviction_properties(objs: list[tuple[int, float, int | None, int, bool]], need: int, ev: str) -> None:
    res = [Resident(f"o{i}", n, at, pos, rd, pin) for i, (n, at, pos, rd, pin) in enumerate(objs)]
    o = StorageOptions(eviction=ev)  # type: ignore[arg-type]
    plan = plan_eviction(res, need, o)
    movable = sum(r.nbytes for r in res if not r.pinned)
    freed = sum(r.nbytes for r in plan)
    assert not any(r.pinned for r in plan)
    assert len({r.key for r in plan}) == len(plan)
    if need <= 0:
        assert plan == []
    elif movable >= need:
        assert freed >= need
        assert freed - plan[-1].nbytes < need  # minimal prefix: the last victim was needed
    else:
        assert freed == movable
    if ev == "queue":  # among victims that someone will read, positions never increase
        keyed = [math.inf if r.position is None else r.position for r in plan if r.readers_left > 0]
        assert keyed == sorted(keyed, reverse=True)


def test_restore_soonest_first_and_skips_what_does_not_fit() -> None:
    spilled = [_r("late", 10, 0.0, 9), _r("big-soon", 100, 0.0, 0), _r("soon", 30, 0.0, 1),
               _r("dead", 5, 0.0, 0, readers=0), _r("unknown", 5, 0.0, None)]
    got = [r.key for r in plan_restore(spilled, 50, StorageOptions())]
    assert got == ["soon", "late", "unknown"]
    assert plan_restore(spilled, 50, StorageOptions(restore=False)) == []
    assert plan_restore(spilled, 0, StorageOptions()) == []


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 100), st.one_of(st.none(), st.integers(0, 9))), max_size=25),
       st.integers(0, 500))
def test_restore_never_exceeds_the_budget(objs: list[tuple[int, int | None]], free: int) -> None:
    spilled = [Resident(i, n, 0.0, pos) for i, (n, pos) in enumerate(objs)]
    plan = plan_restore(spilled, free, StorageOptions())
    assert sum(r.nbytes for r in plan) <= free
    chosen = {r.key for r in plan}
    # Greedy: anything left out did not fit in what remained when its turn came.
    left = free
    for r in sorted(spilled, key=lambda r: (math.inf if r.position is None else r.position, str(r.key))):
        if r.key in chosen:
            left -= r.nbytes
        else:
            assert r.nbytes > left


# ---- migration -----------------------------------------------------------------------------------
def test_migration_prefers_a_fast_peer_with_room() -> None:
    o = StorageOptions()
    peers = [Peer("gpu1", 500 * MB, 50.0), Peer("gpu2", 5000 * MB, 25.0), Peer("gpu3", 10 * MB, 100.0)]
    assert migration_target(100 * MB, peers, 12.0, o) == "gpu1"
    assert migration_target(600 * MB, peers, 12.0, o) == "gpu2"
    assert migration_target(600 * MB, peers, 30.0, o) is None  # gpu2's link is slower than the host's
    assert migration_target(100 * MB, peers, 12.0, StorageOptions(migrate_peers=False)) is None
    assert migration_target(1, [Peer("b", 10, 50.0), Peer("a", 10, 50.0)], 1.0, o) == "a"


def test_positions_by_consumer_takes_the_earliest() -> None:
    assert positions_by_consumer({"b": 4, "c": 1}, ["b", "c", "z"]) == 1
    assert positions_by_consumer({"b": 4}, ["z"]) is None


# ---- configurations --------------------------------------------------------------------------------
def test_named_policies_are_the_baselines_of_the_papers() -> None:
    assert set(STORAGE_POLICIES) >= {"gfaas", "lru", "queue-no-restore", "caching", "reclaim-1h", "reclaim-10min",
                                     "reclaim-1min", "gmlake"}
    g = storage_policy("gfaas")
    assert (g.pooling, g.eviction, g.restore, g.floor_bytes, g.quantile) == ("elastic", "queue", True, 300 * MB, 0.99)
    assert storage_policy("lru").eviction == "lru" and not storage_policy("lru").restore
    assert not storage_policy("queue-no-restore").restore
    assert storage_policy("reclaim-10min").reclaim_interval_s == 600.0
    assert storage_policy("gfaas", cap_fraction=0.1).cap_fraction == 0.1


@pytest.mark.parametrize(("kw", "match"), [
    ({"pooling": "magic"}, "pooling='magic'"),
    ({"eviction": "fifo"}, "eviction='fifo'"),
    ({"cap_fraction": 0.0}, "cap_fraction=0.0"),
    ({"quantile": 1.5}, "quantile=1.5"),
    ({"window_s": 0}, "window_s=0"),
    ({"floor_bytes": -1}, "floor_bytes=-1"),
    ({"pooling": "periodic"}, "reclaim_interval_s"),
    ({"max_samples": 0}, "max_samples=0"),
])
def test_bad_options_name_the_value(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        StorageOptions(**kw)  # type: ignore[arg-type]


def test_unknown_policy_and_field() -> None:
    with pytest.raises(ConfigError, match="unknown storage policy 'fast'.*gfaas"):
        storage_policy("fast")
    with pytest.raises(ConfigError, match="storage policy 'gfaas'"):
        storage_policy("gfaas", colour="red")


def test_queue_book_positions_are_ticket_minus_head_and_heads_only_advance() -> None:
    """Tickets count from their queue's head (0 while it is unknown); a head never moves back; an
    explicit position stands beside tickets; forget drops the invocation."""
    book = QueueBook()
    book.hint("i", {"r": 0}, ["d"], {"f": ("q", 7), "g": ("p", 2)})
    assert book.positions("i") == {"r": 0, "f": 7, "g": 2} and book.done("i") == {"d"}
    book.advance({"q": 5, "p": 9})
    assert book.positions("i") == {"r": 0, "f": 2, "g": 0}
    book.advance({"q": 1})
    assert book.positions("i")["f"] == 2
    book.hint("i", {"f": 3})  # replaces the hint: no tickets now
    assert book.positions("i") == {"f": 3} and book.done("i") == frozenset()
    assert book.positions("j") is None and "i" in book and len(book) == 1
    book.forget("i")
    assert "i" not in book and book.positions("i") is None


def test_queue_book_keeps_the_most_recently_advanced_heads() -> None:
    book = QueueBook(max_queues=2)
    book.advance({"a": 1, "b": 2})
    book.advance({"a": 3, "c": 1})  # b is the least recently advanced
    book.hint("i", {}, (), {"f": ("a", 4), "g": ("b", 4)})
    assert book.positions("i") == {"f": 1, "g": 4}
