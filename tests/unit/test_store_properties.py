"""Random operation sequences against the store, checked against an independent model.

Invariants after every step: reserved == sum of live segment sizes <= capacity; every object lies in
a live segment and inside it; segment live counts match; space in a segment is never handed out twice;
the backend holds exactly the live segments; and every call's outcome (value or error class) is the
one the model predicts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gfaas import (
    AccessDenied,
    AuthenticationError,
    CapacityError,
    DataDeleted,
    ManualClock,
    NodeConfig,
    ObjectStateError,
)
from gfaas.config import KiB
from gfaas.dataplane.backends import NullBackend
from gfaas.dataplane.store import SEALED, WRITING, Session, Store

FNS = ("a", "b", "c")
SLAB = 64 * KiB
CAP = 512 * KiB
SMALL = SLAB // 4

consumer_lists = st.one_of(st.none(), st.lists(st.sampled_from(FNS), max_size=3, unique=True))


@dataclass
class Obj:
    inv: str
    producer: str
    consumers: frozenset[str] | None
    pending: set[str] | None
    state: str
    segment: int
    writer: int | None


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cfg = NodeConfig(node_id="n0", socket_path="/tmp/unused.sock", state_dir="/tmp/unused",
                              backend="null", capacity_bytes=CAP, slab_bytes=SLAB, ids_per_lease=2,
                              tombstones_per_invocation=10_000,
                              quota_reserved_bytes=4 * CAP)  # the model knows the pool, not quotas
        self.backend = NullBackend()
        self.clock = ManualClock()
        self.retired: list[int] = []
        self.store = Store(self.cfg, self.backend, self.clock, on_retire=self.retired.append)
        self.invs: dict[str, dict[str, str]] = {}  # open invocations: id -> tokens
        self.ended: list[str] = []
        self.sessions: list[Session] = []
        self.objs: dict[bytes, Obj] = {}
        self.tombs: dict[str, set[bytes]] = {}
        self.known: list[bytes] = []  # every ID ever published or allocated
        self.ranges: dict[int, list[tuple[int, int]]] = {}  # segment -> every range handed out in it
        self.freed_segments: set[int] = set()

    # ---- helpers --------------------------------------------------------------------------
    def _live(self, s: Session) -> bool:
        return s.invocation in self.invs

    def _readable(self, o: Obj, s: Session) -> bool:
        if o.inv != s.invocation:
            return False
        return o.consumers is None or s.function == o.producer or s.function in o.consumers

    def _free(self, oid: bytes, tomb: bool) -> None:
        o = self.objs.pop(oid)
        if tomb:
            self.tombs.setdefault(o.inv, set()).add(oid)

    def _claim(self, seg: int, off: int, n: int) -> None:
        """Record a range handed out in a segment and check it overlaps nothing handed out before."""
        if n == 0:
            return
        for a, m in self.ranges.get(seg, []):
            assert off + n <= a or a + m <= off, f"segment {seg}: [{off},{off + n}) overlaps [{a},{a + m})"
        self.ranges.setdefault(seg, []).append((off, n))

    def _pick(self, items: list, i: int):  # type: ignore[no-untyped-def,type-arg]
        return items[i % len(items)]

    def _expect_lookup_error(self, s: Session, oid: bytes) -> type[Exception] | None:
        o = self.objs.get(oid)
        if o is None or not self._readable(o, s):
            if o is None and oid in self.tombs.get(s.invocation, set()):
                return DataDeleted
            return AccessDenied
        if o.state != SEALED:
            return ObjectStateError
        return None

    # ---- rules ----------------------------------------------------------------------------
    @precondition(lambda self: len(self.invs) < 3)
    @rule()
    def open_invocation(self) -> None:
        inv = self.store.open_invocation("wf", list(FNS))
        self.invs[inv.id] = dict(inv.tokens)

    @precondition(lambda self: self.invs)
    @rule(i=st.integers(0, 99))
    def end_invocation(self, i: int) -> None:
        inv = self._pick(list(self.invs), i)  # insertion order: IDs are random
        expect = sum(1 for o in self.objs.values() if o.inv == inv)
        assert self.store.end_invocation(inv) == expect
        for oid in [k for k, o in self.objs.items() if o.inv == inv]:
            self._free(oid, tomb=False)
        self.tombs.pop(inv, None)
        del self.invs[inv]
        self.ended.append(inv)

    @precondition(lambda self: self.ended)
    @rule(i=st.integers(0, 99))
    def end_twice_is_an_error(self, i: int) -> None:
        with pytest.raises(AuthenticationError):
            self.store.end_invocation(self._pick(self.ended, i))

    @precondition(lambda self: self.invs and len(self.sessions) < 8)
    @rule(i=st.integers(0, 99), fn=st.sampled_from(FNS))
    def connect(self, i: int, fn: str) -> None:
        inv = self._pick(list(self.invs), i)  # insertion order: IDs are random
        s = self.store.connect(self.invs[inv][fn])
        assert (s.invocation, s.function) == (inv, fn)
        self.sessions.append(s)

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99))
    def disconnect(self, i: int) -> None:
        s = self.sessions.pop(i % len(self.sessions))
        self.store.disconnect(s)
        for oid in [k for k, o in self.objs.items() if o.writer == s.id and o.state == WRITING]:
            self._free(oid, tomb=False)

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), n=st.integers(0, SMALL), cons=consumer_lists)
    def put_small(self, i: int, n: int, cons: list[str] | None) -> None:
        """The client's asynchronous put: lease when the slab is full, then seal at the bump pointer."""
        s = self._pick(self.sessions, i)
        if not self._live(s):
            with pytest.raises(AuthenticationError):
                self.store.lease(s, n)
            return
        off = (s.arena_next + 63) // 64 * 64
        if s.arena is None or off + n > s.arena.size:
            old = s.arena
            empty_old = old is not None and not any(o.segment == old.id for o in self.objs.values())
            room = CAP - self.store.reserved + (old.size if empty_old else 0) + self._evictable()
            try:
                seg, _ = self.store.lease(s, n)
            except CapacityError:
                assert room < SLAB
                assert s.arena is None  # the old slab is closed either way
                return
            assert room >= SLAB
            off = 0
        if not s.issued:
            self.store.more_ids(s, 1)
        oid = next(iter(s.issued))
        self.store.seal_small(s, oid, off, n, "raw", [n], cons)
        assert s.arena is not None
        self._claim(s.arena.id, off, n)
        c = frozenset(cons) if cons is not None else None
        self.objs[oid] = Obj(s.invocation, s.function, c, set(c) if c else None, SEALED, s.arena.id, None)
        self.known.append(oid)

    def _evictable(self) -> int:
        """Bytes of warm (pooled) and parked segments, which the store retires before failing."""
        return sum(g.size for g in self.store.segments.values() if g.pooled or (not g.live and not g.open))

    def _warm_fit(self, inv: str, n: int) -> bool:
        """A warm segment of the workflow fits (every invocation here is of workflow 'wf')."""
        return any(n <= g.size <= 2 * n + 4096 for g in self.store._pool.get("wf", []))

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), n=st.one_of(st.integers(0, 2 * SMALL), st.integers(SLAB, CAP + 1)),
          cons=consumer_lists)
    def allocate(self, i: int, n: int, cons: list[str] | None) -> None:
        s = self._pick(self.sessions, i)
        if not self._live(s):
            with pytest.raises(AuthenticationError):
                self.store.allocate(s, n, "raw", [n], cons)
            return
        off = (s.arena_next + 63) // 64 * 64
        in_slab = n <= SMALL and s.arena is not None and off + n <= s.arena.size
        need = 0 if in_slab else max(n, 1)
        warm = not in_slab and self._warm_fit(s.invocation, need)
        if not warm and self.store.reserved + need - self._evictable() > CAP:
            with pytest.raises(CapacityError, match=f"allocation of {need} bytes"):
                self.store.allocate(s, n, "raw", [n], cons)
            return
        rec, seg = self.store.allocate(s, n, "raw", [n], cons)
        if in_slab:
            assert seg is s.arena and rec.offset == off
        elif warm:  # a warm segment of this workflow that fits without wasting over half
            assert need <= seg.size <= 2 * need + 4096 and rec.offset == 0
            # Reuse is allowed only because every object it held is gone (and nothing pins it).
            assert not any(o.segment == seg.id for o in self.objs.values()) and seg.pins == 0
            self.ranges[seg.id] = []
        else:
            assert seg.size == need and rec.offset == 0
        self._claim(seg.id, rec.offset, n)
        c = frozenset(cons) if cons is not None else None
        self.objs[rec.id] = Obj(s.invocation, s.function, c, set(c) if c else None, WRITING, seg.id, s.id)
        self.known.append(rec.id)

    @precondition(lambda self: self.sessions and self.known)
    @rule(i=st.integers(0, 99), k=st.integers(0, 10_000))
    def seal(self, i: int, k: int) -> None:
        s = self._pick(self.sessions, i)
        oid = self._pick(self.known, k)
        o = self.objs.get(oid)
        if o is not None and o.state == SEALED and (o.inv, o.producer) == (s.invocation, s.function):
            with pytest.raises(ObjectStateError):
                self.store.seal(s, oid)
        elif o is None or o.writer != s.id or o.inv != s.invocation:
            with pytest.raises(AccessDenied):
                self.store.seal(s, oid)
        else:
            self.store.seal(s, oid)
            o.state, o.writer = SEALED, None

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), k=st.integers(0, 10_000), random_id=st.booleans())
    def get(self, i: int, k: int, random_id: bool) -> None:
        s = self._pick(self.sessions, i)
        oid = os.urandom(16) if random_id or not self.known else self._pick(self.known, k)
        if not self._live(s):
            with pytest.raises(AuthenticationError):
                self.store.get(s, oid)
            return
        err = self._expect_lookup_error(s, oid)
        if err is not None:
            with pytest.raises(err):
                self.store.get(s, oid)
            return
        rec = self.store.get(s, oid)
        assert rec.id == oid
        o = self.objs[oid]
        if o.pending is not None and s.function in o.pending:
            o.pending.discard(s.function)
            if not o.pending:
                self._free(oid, tomb=True)

    @precondition(lambda self: self.sessions)
    @rule(i=st.integers(0, 99), k=st.integers(0, 10_000))
    def delete(self, i: int, k: int) -> None:
        s = self._pick(self.sessions, i)
        if not self.known:
            return
        oid = self._pick(self.known, k)
        if not self._live(s):
            with pytest.raises(AuthenticationError):
                self.store.delete(s, oid)
            return
        o = self.objs.get(oid)
        if o is not None and o.inv == s.invocation and o.producer == s.function:
            self.store.delete(s, oid)
            self._free(oid, tomb=True)
            return
        if o is not None and self._readable(o, s):
            with pytest.raises(AccessDenied, match="only the producer"):
                self.store.delete(s, oid)
            return
        with pytest.raises(self._expect_lookup_error(s, oid) or AccessDenied):
            self.store.delete(s, oid)

    @rule(dt=st.floats(0, 10))
    def tick(self, dt: float) -> None:
        self.clock.advance(dt)

    # ---- invariants -----------------------------------------------------------------------
    @invariant()
    def accounting(self) -> None:
        st_ = self.store
        assert st_.reserved == sum(seg.size for seg in st_.segments.values())
        assert 0 <= st_.reserved <= CAP
        assert {seg.handle.id for seg in st_.segments.values()} == set(self.backend.live)
        stats = st_.stats()
        assert stats["objects"] + stats["writing"] == len(st_.objects)
        assert stats["bytes_reserved"] == st_.reserved and stats["segments"] == len(st_.segments)

    @invariant()
    def objects_live_in_live_segments(self) -> None:
        st_ = self.store
        assert set(st_.objects) == set(self.objs)
        counts: dict[int, int] = {}
        for oid, rec in st_.objects.items():
            assert rec.segment in st_.segments, f"object {oid.hex()} is in retired segment {rec.segment}"
            seg = st_.segments[rec.segment]
            assert rec.offset >= 0 and rec.offset + rec.nbytes <= seg.size
            assert rec.state == self.objs[oid].state
            counts[rec.segment] = counts.get(rec.segment, 0) + 1
        for sid, seg in st_.segments.items():
            assert seg.live == counts.get(sid, 0)
            # A closed empty segment is retired, unless it is a warm one kept for reuse.
            assert seg.open or seg.live > 0 or seg.pooled, f"closed empty segment {sid} was not retired"
            assert seg.pooled == (seg in st_._pool.get(seg.workflow, []))
        assert st_.pooled_bytes == sum(g.size for g in st_.segments.values() if g.pooled)
        assert st_.pooled_bytes <= st_.config.warm_pool_bytes

    @invariant()
    def each_segment_is_indexed_under_its_invocation(self) -> None:
        st_ = self.store
        assert {(inv, i) for inv, ids in st_._inv_segs.items() for i in ids} == \
            {(g.invocation, g.id) for g in st_.segments.values()}

    @invariant()
    def retired_segments_stay_retired(self) -> None:
        assert len(self.retired) == len(set(self.retired))
        assert not set(self.retired) & set(self.store.segments)
        freed = {t.segment for t in self.backend.log if t.kind == "free"}
        assert freed == set(self.retired)


StoreMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestStoreRandomOperations = StoreMachine.TestCase
TestStoreRandomOperations.__doc__ = "Random op sequences keep the store's accounting and the model's outcomes."
