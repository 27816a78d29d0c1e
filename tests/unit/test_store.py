"""The object store driven in-process: NullBackend + ManualClock, no sockets, exact sequences."""

from __future__ import annotations

import os

import pytest

from gfaas import (
    AccessDenied,
    AuthenticationError,
    CapacityError,
    ConfigError,
    DataDeleted,
    DataLost,
    InvalidDataRef,
    ManualClock,
    NodeConfig,
    ObjectStateError,
    ProtocolError,
)
from gfaas.config import KiB
from gfaas.dataplane.backends import NullBackend, Transfer
from gfaas.dataplane.journal import Journal
from gfaas.dataplane.store import SEALED, WRITING, Session, Store

SLAB = 64 * KiB
CAP = 256 * KiB
DENIED = "access denied: no object with this ID is readable by this function of this invocation"


class Env:
    """A store on the null backend with one invocation (p, c1, c2, x) and a session per function."""

    def __init__(self, tmp: str | None = None, **cfg: object) -> None:
        kw: dict[str, object] = {"node_id": "n0", "socket_path": "/tmp/unused.sock", "state_dir": "/tmp/unused",
                                 "backend": "null", "capacity_bytes": CAP, "slab_bytes": SLAB, "ids_per_lease": 4,
                                 "quota_reserved_bytes": 4 * CAP}  # the pool binds, not the quota
        kw.update(cfg)
        self.config = NodeConfig(**kw)  # type: ignore[arg-type]
        self.backend = NullBackend()
        self.clock = ManualClock(100.0)
        self.retired: list[int] = []
        self.journal = Journal(os.path.join(tmp, "objects.journal")) if tmp else None
        self.store = Store(self.config, self.backend, self.clock, journal=self.journal,
                           on_retire=self.retired.append)
        self.inv = self.store.open_invocation("wf", ["p", "c1", "c2", "x"])
        self.s = {fn: self.store.connect(t) for fn, t in self.inv.tokens.items()}

    def put(self, s: Session, nbytes: int = 40, consumers: list[str] | None = None, dtype: str = "raw") -> bytes:
        """What the client's put does for a small object: lease if needed, seal at the next aligned offset."""
        off = (s.arena_next + 63) // 64 * 64
        if s.arena is None or off + nbytes > s.arena.size:
            self.store.lease(s, nbytes)
            off = 0
        if not s.issued:
            self.store.more_ids(s, 4)
        oid = next(iter(s.issued))
        shape = [nbytes] if dtype == "raw" else [nbytes // int(dtype[2:])]
        self.store.seal_small(s, oid, off, nbytes, dtype, shape, consumers)
        return oid

    def kinds(self) -> list[tuple[str, int, int]]:
        return [(t.kind, t.segment, t.nbytes) for t in self.backend.log]


@pytest.fixture
def env() -> Env:
    return Env()


def test_consumers_free_the_object_after_all_have_read(env: Env) -> None:
    """An object is freed exactly when the last declared consumer reads it; late reads get DataDeleted."""
    st, s = env.store, env.s
    env.clock.set(105.0)
    oid = env.put(s["p"], 40, ["c1", "c2"], dtype="<f4")
    rec = st.objects[oid]
    assert (rec.state, rec.created, rec.producer, rec.nbytes, rec.shape, rec.offset) == (SEALED, 105.0, "p", 40, (10,), 0)
    assert env.kinds() == [("alloc", 1, SLAB)]
    assert st.get(s["c1"], oid) is rec
    assert st.get(s["c1"], oid) is rec  # a second read by the same consumer does not count twice
    assert rec.pending == {"c2"} and oid in st.objects
    assert st.get(s["p"], oid) is rec  # the producer may read; it is not a consumer
    assert rec.pending == {"c2"}
    assert st.get(s["c2"], oid) is rec
    assert oid not in st.objects
    for fn in ("c1", "c2", "p"):
        with pytest.raises(DataDeleted, match=f"object {oid.hex()} was freed \\(read by all of its consumers\\)"):
            st.get(s[fn], oid)
    with pytest.raises(DataDeleted):
        st.delete(s["p"], oid)
    # The slab stays until its owner's connection closes it, then it is freed, exactly once.
    assert env.kinds() == [("alloc", 1, SLAB)]
    st.disconnect(s["p"])
    assert env.kinds() == [("alloc", 1, SLAB), ("free", 1, SLAB)]
    assert env.retired == [1] and st.reserved == 0


def test_export_runs_before_the_last_read_frees_the_object(env: Env) -> None:
    """get() calls export(record, segment) while the object and its segment are still live."""
    oid = env.put(env.s["p"], 64, ["c1"])
    seen = []

    def export(rec, seg):  # type: ignore[no-untyped-def]
        seen.append((rec.id in env.store.objects, seg.id in env.store.segments, seg.live))
        return "exported"

    assert env.store.get(env.s["c1"], oid, export) == "exported"
    assert seen == [(True, True, 1)]
    assert oid not in env.store.objects


def test_no_consumer_list_keeps_the_object_until_delete(env: Env) -> None:
    """With consumers=None every function of the invocation may read, any number of times, until delete."""
    st, s = env.store, env.s
    oid = env.put(s["p"], 10, None)
    for _ in range(3):
        for fn in ("p", "c1", "c2", "x"):
            st.get(s[fn], oid)
    assert oid in st.objects
    st.delete(s["p"], oid)
    with pytest.raises(DataDeleted, match="deleted by its producer"):
        st.get(s["c1"], oid)


def test_empty_consumer_list_means_producer_only_and_never_consumed(env: Env) -> None:
    """consumers=[]: only the producer may read; reads never free it."""
    st, s = env.store, env.s
    oid = env.put(s["p"], 10, [])
    st.get(s["p"], oid)
    st.get(s["p"], oid)
    assert oid in st.objects
    with pytest.raises(AccessDenied, match=DENIED):
        st.get(s["c1"], oid)


def test_function_not_in_consumers_is_denied(env: Env) -> None:
    """A function of the same invocation that is not a declared consumer gets AccessDenied."""
    oid = env.put(env.s["p"], 10, ["c1"])
    with pytest.raises(AccessDenied) as ei:
        env.store.get(env.s["x"], oid)
    assert str(ei.value) == DENIED
    assert oid in env.store.objects


def test_denials_for_foreign_and_random_ids_are_identical(env: Env) -> None:
    """Another invocation's ID and a random ID give AccessDenied with the identical message."""
    st = env.store
    other = st.open_invocation("wf", ["p", "c1"])
    op = st.connect(other.tokens["p"])
    foreign = env.put(op, 10, None)
    msgs = []
    for oid in (foreign, os.urandom(16)):
        for call in (st.get, st.delete):
            with pytest.raises(AccessDenied) as ei:
                call(env.s["p"], oid)
            msgs.append(str(ei.value))
    assert msgs == [DENIED] * 4
    assert foreign in st.objects


def test_freed_ids_of_another_invocation_are_denied_not_deleted(env: Env) -> None:
    """A tombstone is visible only to its own invocation; others get AccessDenied."""
    st = env.store
    other = st.open_invocation("wf", ["p"])
    op = st.connect(other.tokens["p"])
    oid = env.put(op, 10, None)
    st.delete(op, oid)
    with pytest.raises(DataDeleted):
        st.get(op, oid)
    with pytest.raises(AccessDenied, match=DENIED):
        st.get(env.s["p"], oid)


def test_only_the_producer_may_delete(env: Env) -> None:
    """A reader that is not the producer gets AccessDenied naming the producer; the object stays."""
    st, s = env.store, env.s
    oid = env.put(s["p"], 10, ["c1"])
    with pytest.raises(AccessDenied, match=f"only the producer 'p' may delete object {oid.hex()}"):
        st.delete(s["c1"], oid)
    with pytest.raises(AccessDenied) as ei:
        st.delete(s["x"], oid)  # may not even read it: the generic denial
    assert str(ei.value) == DENIED
    assert oid in st.objects
    # Another connection of the same function is the producer too.
    p2 = st.connect(env.inv.tokens["p"])
    st.delete(p2, oid)
    assert oid not in st.objects


@pytest.mark.parametrize("bad", [b"", b"x" * 15, "0" * 16, None, 7])
def test_malformed_ids_on_get(env: Env, bad: object) -> None:
    """get() of something that is not a 16-byte ID raises InvalidDataRef; delete() AccessDenied or InvalidDataRef."""
    with pytest.raises(InvalidDataRef, match="16 bytes"):
        env.store.get(env.s["p"], bad)
    with pytest.raises((InvalidDataRef, AccessDenied)):
        env.store.delete(env.s["p"], bad)


def test_allocate_seal_lifecycle(env: Env) -> None:
    """allocate -> writing (invisible to readers) -> seal -> readable; a second seal is ObjectStateError."""
    st, s = env.store, env.s
    rec, seg = st.allocate(s["p"], 100 * KiB, "<f8", [100 * KiB // 8], ["c1"])
    assert rec.state == WRITING and rec.writer == s["p"].id and seg.size == 100 * KiB and rec.offset == 0
    assert env.kinds() == [("alloc", 1, 100 * KiB)]
    assert st.stats()["writing"] == 1 and st.stats()["objects"] == 0
    with pytest.raises(ObjectStateError, match="still being written"):
        st.get(s["c1"], rec.id)
    other = st.connect(env.inv.tokens["p"])  # same function, other connection: not the writer
    with pytest.raises(AccessDenied, match="seal refused"):
        st.seal(other, rec.id)
    st.seal(s["p"], rec.id)
    assert rec.state == SEALED and rec.writer is None
    with pytest.raises(ObjectStateError, match=f"object {rec.id.hex()} is already sealed"):
        st.seal(s["p"], rec.id)
    with pytest.raises(AccessDenied, match="seal refused"):
        st.seal(s["p"], os.urandom(16))
    st.get(s["c1"], rec.id)
    # The object is freed; its segment of its own stays warm for the workflow's next large object.
    assert env.kinds() == [("alloc", 1, 100 * KiB)]
    assert st.stats()["objects"] == 0 and st.pooled_bytes == st.reserved == 100 * KiB


def test_small_allocations_share_the_slab(env: Env) -> None:
    """Small allocations go into the session's slab at the next 64-byte aligned offset."""
    st, s = env.store, env.s["p"]
    env.put(s, 10)  # lease; object at 0
    r1, seg1 = st.allocate(s, 100, "raw", [100], None)
    r2, seg2 = st.allocate(s, 0, "<f4", [0], None)
    r3, seg3 = st.allocate(s, 1, "raw", [1], None)
    assert seg1 is seg2 is seg3 is s.arena
    assert (r1.offset, r2.offset, r3.offset) == (64, 192, 192)
    assert env.kinds() == [("alloc", 1, SLAB)]


def test_zero_byte_allocation_without_slab_gets_a_minimal_segment(env: Env) -> None:
    """A 0-byte allocation with no slab reserves a 1-byte segment (backends cannot allocate 0)."""
    rec, seg = env.store.allocate(env.s["p"], 0, "<f4", [0, 3], None)
    assert seg.size == 1 and rec.shape == (0, 3)
    assert env.kinds() == [("alloc", 1, 1)]


def test_seal_small_validation(env: Env) -> None:
    """seal_small rejects unissued IDs, offsets outside the free part of the slab, and bad metadata."""
    st, s = env.store, env.s["p"]
    with pytest.raises(InvalidDataRef, match="not issued"):
        st.seal_small(s, os.urandom(16), 0, 8, "raw", [8], None)
    seg, ids = st.lease(s, 8)
    assert len(ids) == 4 and set(ids) == s.issued
    with pytest.raises(ProtocolError, match=r"seal at offset 32 \(\+8\)"):
        st.seal_small(s, ids[0], 32, 8, "raw", [8], None)  # not 64-aligned
    with pytest.raises(ProtocolError, match=f"seal at offset {SLAB - 64}"):
        st.seal_small(s, ids[0], SLAB - 64, 65, "raw", [65], None)  # past the end
    with pytest.raises(ProtocolError, match="holds 4 bytes, but the object has 8"):
        st.seal_small(s, ids[0], 0, 8, "<f4", [1], None)
    with pytest.raises(ConfigError, match=r"consumers \['nobody'\]"):
        st.seal_small(s, ids[0], 0, 8, "raw", [8], ["nobody"])
    assert ids[0] in s.issued and st.stats()["objects"] == 0  # failed seals consume nothing
    st.seal_small(s, ids[0], 128, 8, "raw", [8], None)
    with pytest.raises(InvalidDataRef, match="not issued"):
        st.seal_small(s, ids[0], 192, 8, "raw", [8], None)  # an ID is used once
    with pytest.raises(ProtocolError, match="seal at offset 64"):
        st.seal_small(s, ids[1], 64, 8, "raw", [8], None)  # below the bump pointer: space is never reused
    with pytest.raises(ProtocolError, match="seal at offset -64"):
        st.seal_small(s, ids[1], -64, 8, "raw", [8], None)


def test_seal_small_without_a_slab_is_rejected(env: Env) -> None:
    """IDs from more_ids() cannot be sealed before a slab was leased."""
    ids = env.store.more_ids(env.s["p"], 2)
    with pytest.raises(ProtocolError, match="outside the free part"):
        env.store.seal_small(env.s["p"], ids[0], 0, 8, "raw", [8], None)


@pytest.mark.parametrize("n", [0, -1, 1025])
def test_more_ids_bounds(env: Env, n: int) -> None:
    """more_ids accepts 1-1024 IDs per request."""
    with pytest.raises(ProtocolError, match=f"asked for {n} IDs; ask for 1-1024"):
        env.store.more_ids(env.s["p"], n)
    assert len(env.store.more_ids(env.s["p"], 1024)) == 1024


def test_lease_tops_up_ids_and_closes_the_old_slab(env: Env) -> None:
    """A new lease closes the previous slab (freed at once if empty) and tops IDs up to ids_per_lease."""
    st, s = env.store, env.s["p"]
    _, ids1 = st.lease(s, 0)
    _, ids2 = st.lease(s, 0)
    assert len(ids1) == 4 and ids2 == [] and len(s.issued) == 4
    assert env.kinds() == [("alloc", 1, SLAB), ("free", 1, SLAB), ("alloc", 2, SLAB)]
    assert env.retired == [1]


def test_capacity_errors_name_the_numbers(env: Env) -> None:
    """Capacity errors give the request, pool, used and free bytes; nothing is reserved by a failure."""
    st, s = env.store, env.s["p"]
    big, _ = st.allocate(s, 200 * KiB, "raw", [200 * KiB], None)
    with pytest.raises(CapacityError) as ei:
        st.allocate(s, 100 * KiB, "raw", [100 * KiB], None)
    assert str(ei.value).startswith(
        "allocation of 102400 bytes failed on n0/null: pool 262144, in use 204800, free 57344;")
    with pytest.raises(CapacityError) as ei:
        st.allocate(s, CAP + 1, "raw", [CAP + 1], None)
    assert str(ei.value).startswith("allocation of 262145 bytes on n0/null exceeds the whole pool of 262144 bytes")
    assert st.reserved == 200 * KiB and set(st.objects) == {big.id}


def test_capacity_errors_for_leases(env: Env) -> None:
    """A slab lease that does not fit names 'slab lease' and the numbers; oversize lease requests are refused."""
    st, s = env.store, env.s["p"]
    st.allocate(s, 200 * KiB, "raw", [200 * KiB], None)
    with pytest.raises(CapacityError) as ei:
        st.lease(s, 8)
    assert str(ei.value).startswith(
        "slab lease of 65536 bytes failed on n0/null: pool 262144, in use 204800, free 57344;")
    with pytest.raises(CapacityError, match=f"up to {SLAB // 4} bytes, asked for {SLAB // 4 + 1}"):
        st.lease(s, SLAB // 4 + 1)
    assert st.reserved == 200 * KiB and len(st.segments) == 1


def test_freeing_makes_room_again(env: Env) -> None:
    """After deleting, the same allocation that failed succeeds."""
    st, s = env.store, env.s["p"]
    a, _ = st.allocate(s, 200 * KiB, "raw", [200 * KiB], None)
    st.seal(s, a.id)
    with pytest.raises(CapacityError):
        st.allocate(s, 100 * KiB, "raw", [100 * KiB], None)
    st.delete(s, a.id)
    # The freed 200 KiB segment is warm and fits 100 KiB without wasting over half: it is reused.
    b, _ = st.allocate(s, 100 * KiB, "raw", [100 * KiB], None)
    assert st.reserved == 200 * KiB and b.segment == 1
    assert env.kinds() == [("alloc", 1, 200 * KiB)]
    st.seal(s, b.id)
    st.delete(s, b.id)
    # A size it would waste over half on gets a fresh segment, after the warm one is evicted for room.
    c, _ = st.allocate(s, 60 * KiB, "raw", [60 * KiB], None)
    assert st.reserved == 60 * KiB and c.segment == 2
    assert env.kinds() == [("alloc", 1, 200 * KiB), ("free", 1, 200 * KiB), ("alloc", 2, 60 * KiB)]


def test_end_invocation_frees_everything() -> None:
    """end_invocation frees sealed and writing objects and slabs, returns the count, revokes sessions."""
    env = Env(capacity_bytes=512 * KiB)
    st, s = env.store, env.s
    other = st.open_invocation("wf", ["p"])
    op = st.connect(other.tokens["p"])
    keep = env.put(op, 10, None)
    env.put(s["p"], 10, ["c1"])
    env.put(s["c1"], 20, None)
    st.allocate(s["p"], 100 * KiB, "raw", [100 * KiB], None)  # still writing
    assert st.stats()["objects"] == 3 and st.stats()["writing"] == 1
    assert st.end_invocation(env.inv.id) == 3  # two sealed, one writing
    assert set(st.objects) == {keep}
    assert st.reserved == SLAB and len(st.segments) == 1  # only the other invocation's slab
    frees = [k for k in env.kinds() if k[0] == "free"]
    assert sorted(n for _, _, n in frees) == [SLAB, SLAB, 100 * KiB]
    for fn in ("p", "c1"):
        with pytest.raises(AuthenticationError, match=f"invocation {env.inv.id} has ended"):
            st.get(s[fn], keep)
        with pytest.raises(AuthenticationError):
            st.allocate(s[fn], 8, "raw", [8], None)
        with pytest.raises(AuthenticationError):
            st.lease(s[fn], 8)
    with pytest.raises(AuthenticationError):
        st.connect(env.inv.tokens["p"])
    with pytest.raises(AuthenticationError):
        st.end_invocation(env.inv.id)
    st.end_invocation(other.id)
    assert st.reserved == 0 and st.segments == {} and st.objects == {}
    stats = st.stats()
    assert (stats["objects"], stats["writing"], stats["bytes_reserved"], stats["segments"], stats["invocations"]) \
        == (0, 0, 0, 0, 0)


def test_ending_an_invocation_looks_at_its_own_segments_only() -> None:
    """end_invocation finds the invocation's slabs and segments through an index, not by a pass over
    every segment of every open invocation (O(open invocations) per end); the index follows a warm
    segment to the invocation that takes it."""

    class Watched(dict):  # type: ignore[type-arg]
        passes = 0

        def values(self):  # type: ignore[no-untyped-def]
            Watched.passes += 1
            return super().values()

        def __iter__(self):  # type: ignore[no-untyped-def]
            Watched.passes += 1
            return super().__iter__()

    env = Env(capacity_bytes=64 * SLAB)
    st = env.store
    others = [st.open_invocation("wf", ["p"]) for _ in range(20)]
    for inv in others:
        env.put(st.connect(inv.tokens["p"]), 10, None)
    env.put(env.s["p"], 10, ["c1"])
    st.segments = Watched(st.segments)
    assert st.end_invocation(env.inv.id) == 1
    assert Watched.passes == 0
    assert len(st.segments) == 20 and sorted(st._inv_segs) == sorted(i.id for i in others)
    for inv in others:
        st.end_invocation(inv.id)
    assert st.segments == {} and st._inv_segs == {}


def _alloc_free(st: Store, s: Session, n: int) -> int:
    rec, seg = st.allocate(s, n, "raw", [n], None)
    st.seal(s, rec.id)
    st.delete(s, rec.id)
    return seg.id


def test_warm_segments_outlive_the_invocation_for_its_workflow_only() -> None:
    """Freed large-object segments stay warm when their invocation ends: the workflow's next
    invocation reuses them (no new allocation), another workflow's never does."""
    env = Env(capacity_bytes=1024 * KiB, warm_pool_bytes=512 * KiB)
    st, s = env.store, env.s
    first = [_alloc_free(st, s["p"], n) for n in (100 * KiB, 200 * KiB)]
    st.end_invocation(env.inv.id)
    assert st.objects == {} and st.pooled_bytes == st.reserved == 300 * KiB
    other = st.open_invocation("other-wf", ["p"])
    o = st.connect(other.tokens["p"])
    fresh = _alloc_free(st, o, 100 * KiB)
    assert fresh not in first and env.kinds()[-1] == ("alloc", fresh, 100 * KiB)
    again = st.open_invocation("wf", ["p"])
    a = st.connect(again.tokens["p"])
    rec, seg = st.allocate(a, 90 * KiB, "raw", [90 * KiB], None)
    assert seg.id == first[0] and seg.invocation == again.id and len(env.backend.live) == 3
    st.seal(a, rec.id)
    assert st.get(a, rec.id).invocation == again.id


def test_warm_pool_off_returns_reserved_to_zero_at_the_end() -> None:
    """With warm_pool_bytes=0 nothing is kept: ending the invocation leaves no segment at all."""
    env = Env(capacity_bytes=1024 * KiB, warm_pool_bytes=0)
    st, s = env.store, env.s
    for n in (100 * KiB, 200 * KiB):
        _alloc_free(st, s["p"], n)
    st.end_invocation(env.inv.id)
    assert st.reserved == 0 and st.segments == {} and env.backend.live == {}
    assert st.stats()["bytes_reserved"] == 0 and st.stats()["segments"] == 0


def test_warm_segments_of_ended_invocations_give_way_under_pressure() -> None:
    """A warm segment left by an ended invocation is retired when a new object needs the room."""
    env = Env(capacity_bytes=1024 * KiB, warm_pool_bytes=1024 * KiB)
    st, s = env.store, env.s
    _alloc_free(st, s["p"], 600 * KiB)
    st.end_invocation(env.inv.id)
    other = st.open_invocation("other-wf", ["p"])
    o = st.connect(other.tokens["p"])
    rec, seg = st.allocate(o, 800 * KiB, "raw", [800 * KiB], None)
    assert st.reserved == 800 * KiB and st.pooled_bytes == 0 and list(st.segments) == [seg.id]


def test_disconnect_drops_writing_objects_only(env: Env) -> None:
    """Closing a connection frees what it was still writing; its sealed objects stay readable."""
    st, s = env.store, env.s
    sealed = env.put(s["p"], 10, ["c1"])
    w_small, _ = st.allocate(s["p"], 100, "raw", [100], None)
    w_big, seg_big = st.allocate(s["p"], 100 * KiB, "raw", [100 * KiB], None)
    st.disconnect(s["p"])
    assert set(st.objects) == {sealed}
    assert env.kinds() == [("alloc", 1, SLAB), ("alloc", 2, 100 * KiB), ("free", 2, 100 * KiB)]
    for oid in (w_small.id, w_big.id):
        with pytest.raises(AccessDenied):  # never published: nothing to tell apart
            st.get(s["c1"], oid)
    st.get(s["c1"], sealed)  # the slab (closed) is retired with its last object
    assert env.kinds()[-1] == ("free", 1, SLAB)
    assert env.retired == [2, 1] and st.reserved == 0 and st.stats()["connections"] == 3


def test_tombstones_are_bounded(env: Env) -> None:
    """Only the newest tombstones_per_invocation freed IDs answer DataDeleted; older ones AccessDenied."""
    e = Env(tombstones_per_invocation=2)
    ids = [e.put(e.s["p"], 8, None) for _ in range(3)]
    for oid in ids:
        e.store.delete(e.s["p"], oid)
    with pytest.raises(AccessDenied, match=DENIED):
        e.store.get(e.s["p"], ids[0])
    for oid in ids[1:]:
        with pytest.raises(DataDeleted):
            e.store.get(e.s["p"], oid)


def test_lost_objects_raise_data_lost_for_their_invocation_only() -> None:
    """IDs journalled before a restart raise DataLost to their invocation, AccessDenied to others."""
    env = Env()
    lost = os.urandom(16)
    gone = os.urandom(16)
    reg = env.store.registry
    other = env.store.open_invocation("wf", ["p"])
    st = Store(env.config, NullBackend(), env.clock, registry=reg,
               lost={lost: env.inv.id, gone: "e" * 32})  # "e"*32 is not open: dropped
    sp = st.connect(env.inv.tokens["p"])
    so = st.connect(other.tokens["p"])
    assert st.stats()["lost"] == 1
    with pytest.raises(DataLost, match=f"object {lost.hex()} was lost when node n0 restarted"):
        st.get(sp, lost)
    with pytest.raises(AccessDenied, match=DENIED):
        st.get(so, lost)
    with pytest.raises(AccessDenied, match=DENIED):
        st.get(sp, gone)
    with pytest.raises(DataLost):
        st.delete(sp, lost)
    st.end_invocation(env.inv.id)
    assert st.stats()["lost"] == 0


def test_journal_records_every_id_as_it_is_issued(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The journal gets one 32-byte record per ID handed out (lease batch, allocate), in order;
    seals add nothing, so an asynchronous seal lost in a crash still reads as DataLost."""
    env = Env(str(tmp_path))
    st, s = env.store, env.s["p"]
    assert env.journal is not None
    seg, leased = st.lease(s, 8)  # ids_per_lease = 4
    assert env.journal.load() == {i: env.inv.id for i in leased}
    st.seal_small(s, leased[0], 0, 8, "raw", [8], None)
    w, _ = st.allocate(s, 100 * KiB, "raw", [100 * KiB], None)
    st.seal(s, w.id)
    with open(env.journal.path, "rb") as f:
        data = f.read()
    inv = bytes.fromhex(env.inv.id)
    # Five 32-byte records in issue order, then the zero bytes of the pre-grown file (an all-zero
    # record ends the journal).
    assert data[:160] == b"".join(i + inv for i in [*leased, w.id])
    assert not any(data[160:])
    env.journal.close()


def test_journal_ignores_a_torn_record_and_rewrites_atomically(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """load() drops a partial last record; rewrite() replaces the file (mode 0600) and appends continue."""
    j = Journal(str(tmp_path / "j"))
    assert j.load() == {}
    a, b = os.urandom(16), os.urandom(16)
    j.append(a, "a" * 32)
    j.close()
    with open(j.path, "ab") as f:
        f.write(b + b"\x01\x02")  # torn
    assert j.load() == {a: "a" * 32}
    j.rewrite({b: "b" * 32})
    assert j.load() == {b: "b" * 32}
    assert os.stat(j.path).st_mode & 0o777 == 0o600
    j.append(a, "c" * 32)
    assert j.load() == {b: "b" * 32, a: "c" * 32}
    j.close()


def test_place_for_pulls(env: Env) -> None:
    """place() reserves a segment for an incoming object with the given pending consumers; duplicates refused."""
    st = env.store
    oid = os.urandom(16)
    rec, seg = st.place(env.inv.id, "p", frozenset({"c1"}), {"c1"}, oid, 1000, "raw", (1000,))
    assert rec.state == WRITING and seg.size == 1000
    with pytest.raises(ObjectStateError, match="already on node n0"):
        st.place(env.inv.id, "p", None, None, oid, 1000, "raw", (1000,))
    st.seal(None, oid)
    st.get(env.s["c1"], oid)
    assert st.stats()["objects"] == 0 and st.reserved == st.pooled_bytes == 1000


def test_a_pull_lands_in_a_warm_segment_of_its_workflow_only(env: Env) -> None:
    """After a pulled copy was read and freed, the next pull of an invocation of the same workflow reuses
    its segment (no new allocation: fresh memory is what bounded pulls); one of another workflow, or one
    too large for it, gets a new segment."""
    st = env.store

    def pull(inv: str, reader: str, nbytes: int) -> tuple[int, int]:
        oid = os.urandom(16)
        rec, seg = st.place(inv, "p", frozenset({reader}), {reader}, oid, nbytes, "raw", (nbytes,))
        st.seal(None, oid)
        return seg.id, len([k for k in env.kinds() if k[0] == "alloc"])

    first, allocs = pull(env.inv.id, "c1", 4000)
    st.get(env.s["c1"], list(st.objects)[0])  # read once by its one reader: freed, its segment goes warm
    assert st.pooled_bytes == 4000
    inv2 = st.open_invocation("wf", ["p", "c1"])
    again, allocs2 = pull(inv2.id, "c1", 3000)
    assert again == first and allocs2 == allocs and st.pooled_bytes == 0
    other = st.open_invocation("other-wf", ["p", "c1"])
    st.get(st.connect(inv2.tokens["c1"]), next(o for o, r in st.objects.items() if r.invocation == inv2.id))
    assert st.pooled_bytes == 4000  # back in wf's pool
    fresh, allocs3 = pull(other.id, "c1", 3000)
    assert fresh != first and allocs3 == allocs + 1
    big, allocs4 = pull(inv2.id, "c1", 9000)  # more than the warm segment holds
    assert big != first and allocs4 == allocs + 2


def test_stats_exact(env: Env) -> None:
    """stats() counts sealed and writing objects, reserved and live bytes, segments, sessions."""
    env.put(env.s["p"], 40, None)
    env.store.allocate(env.s["c1"], 100 * KiB, "raw", [100 * KiB], None)
    assert env.store.stats() == {
        "objects": 1, "writing": 1, "bytes_reserved": SLAB + 100 * KiB, "bytes_live": 40 + 100 * KiB,
        "capacity_bytes": CAP, "segments": 2, "invocations": 1, "connections": 4, "lost": 0,
        "bytes_pooled": 0,
        "segments_pooled": 0,
        "device_bytes_held": 0,
        "device_bytes_used": 0,
        "evictions": 0, "restores": 0, "released_unread": 0, "migrations": 0, "bytes_spilled": 0,
        "bytes_restored": 0, "queue_hints": 0, "spills": 0, "objects_on_disk": 0, "bytes_on_disk": 0,
        "pool_target": env.config.warm_pool_bytes, "device_pool_target": 0,
        "device_objects": 0, "deliveries_to_device": 0, "deliveries_to_host": 0, "bytes_delivered": 0, "staged_for_transfer": 0, "prefetched": 0,
        "bytes_host_direct": 0, "bytes_host_ring": 0,
    }


def test_null_backend_log_records_sizes_and_model_durations() -> None:
    """NullBackend logs alloc/free/copy_in/copy_out/transfer with byte counts and latency+bytes/bandwidth."""
    from gfaas.dataplane.backends import LinkModel

    b = NullBackend(LinkModel(latency_s=1.0, bandwidth_bps=100.0))
    h1 = b.alloc(1000)
    h2 = b.alloc(500)
    b.copy_in(h1, 10, memoryview(b"x" * 200))
    b.copy_out(h1, 0, 100, memoryview(bytearray(100)))
    b.transfer(h1, 0, h2, 100, 400)
    b.free(h1)
    assert b.log == [
        Transfer("alloc", 1, 1000, 0.0),
        Transfer("alloc", 2, 500, 0.0),
        Transfer("copy_in", 1, 200, 3.0),
        Transfer("copy_out", 1, 100, 2.0),
        Transfer("transfer", 2, 400, 5.0),
        Transfer("free", 1, 1000, 0.0),
    ]
    assert set(b.live) == {2}


@pytest.mark.parametrize(("offset", "n"), [(-1, 1), (0, 1001), (1000, 1), (999, 2)])
def test_backend_range_checks(offset: int, n: int) -> None:
    """Copies outside a segment raise CapacityError naming the range; nothing is logged."""
    b = NullBackend()
    h = b.alloc(1000)
    with pytest.raises(CapacityError, match=rf"range \[{offset}, {offset + n}\) is outside a 1000-byte null segment"):
        b.copy_out(h, offset, n, memoryview(bytearray(max(n, 0))))
    assert [t.kind for t in b.log] == ["alloc"]


@pytest.mark.parametrize("n", [0, -5])
def test_backend_refuses_empty_segments(n: int) -> None:
    """alloc(0) and negative sizes raise CapacityError."""
    with pytest.raises(CapacityError, match=f"segment of {n} bytes"):
        NullBackend().alloc(n)


def test_derive_publishes_a_slice_of_a_held_object_without_a_segment() -> None:
    """derive: only inside an object of its own segment that the session got and still pins;
    the new object keeps the segment live after its parent is freed; release or a slab refuses."""
    env = Env(capacity_bytes=1024 * KiB)
    st, s = env.store, env.s
    rec, seg = st.allocate(s["p"], 200 * KiB, "raw", [200 * KiB], ["c1"])
    st.seal(s["p"], rec.id)
    with pytest.raises(AccessDenied, match="holds no view"):
        st.derive(s["c1"], seg.id, 0, 10, "raw", [10], None)  # not got yet
    got = st.get(s["c1"], rec.id)
    assert got.id not in st.objects  # its only consumer read it: freed, the segment is parked...
    st.pin(s["c1"], seg, read=(0, 200 * KiB))  # ... as the daemon pins it for the view it hands out
    assert seg.id in st.segments
    with pytest.raises(AccessDenied, match="outside the object"):
        st.derive(s["c1"], seg.id, 100 * KiB, 100 * KiB + 1, "raw", [100 * KiB + 1], None)
    with pytest.raises(AccessDenied, match="holds no view"):
        st.derive(s["c2"], seg.id, 0, 10, "raw", [10], None)  # another session holds no pin
    part = st.derive(s["c1"], seg.id, 64 * KiB, 1024, "<f8", [128], ["c2"])
    assert (part.segment, part.offset, part.state, part.producer) == (seg.id, 64 * KiB, SEALED, "c1")
    assert len(env.backend.live) == 1 and seg.live == 1
    st.release(s["c1"], [seg.id])
    with pytest.raises(AccessDenied, match="holds no view"):
        st.derive(s["c1"], seg.id, 0, 10, "raw", [10], None)
    assert st.get(s["c2"], part.id).nbytes == 1024
    assert seg.live == 0 and seg.pooled  # the last object is gone and nobody pins it: warm again
    slab_obj = env.put(s["p"], 10, ["c1"])
    slab = st.segments[st.objects[slab_obj].segment]
    st.get(s["c1"], slab_obj)
    assert not st.pin(s["c1"], slab, read=(0, 10))  # slabs are never pinned, so never derived from
    with pytest.raises(AccessDenied, match="holds no view"):
        st.derive(s["c1"], slab.id, 0, 10, "raw", [10], None)


def test_derive_is_bounded_by_the_object_read_not_the_segment() -> None:
    """A function that got one chunk of a segment cannot derive its sibling chunk's bytes, which
    were published for another consumer."""
    env = Env(capacity_bytes=1024 * KiB)
    st, s = env.store, env.s
    rec, seg = st.allocate(s["p"], 200 * KiB, "raw", [200 * KiB], ["c1"])
    st.seal(s["p"], rec.id)
    st.get(s["c1"], rec.id)
    st.pin(s["c1"], seg, read=(0, 200 * KiB))
    halves = [st.derive(s["c1"], seg.id, off, 100 * KiB, "raw", [100 * KiB], [fn])
              for off, fn in ((0, "c2"), (100 * KiB, "x"))]
    st.get(s["c2"], halves[0].id)
    st.pin(s["c2"], seg, read=(halves[0].offset, halves[0].nbytes))
    assert st.derive(s["c2"], seg.id, 10 * KiB, KiB, "raw", [KiB], None).offset == 10 * KiB
    with pytest.raises(AccessDenied, match="outside the object read"):
        st.derive(s["c2"], seg.id, 100 * KiB, KiB, "raw", [KiB], None)  # x's half, never read by c2
