"""The node's object store: directory, slabs, lifetimes and access checks, without any I/O.

The daemon wraps a :class:`Store` with sockets; tests and the simulator drive it directly (with the
``null`` backend and a manual clock). All decisions about who may read what, where an object is
placed, and when it is freed are made here.

Placement: each producing connection packs its small objects into a slab of its own (bump
allocation, 64-byte aligned); objects larger than ``small_object_max`` get a segment of their own.
Space inside a slab is never handed out twice: a reader that still holds a zero-copy view of a freed
object keeps seeing the bytes it read, never somebody else's. A slab is retired (and its memory
returned to the pool) once it is closed for new objects and its last object is freed.

Lifetimes: an object is freed when every declared consumer has read it, when its producer deletes
it, or when its invocation ends. Freed IDs are remembered per invocation (tombstones) so that a late
reader gets ``DataDeleted`` rather than a generic ``AccessDenied``.

Tiers (issue 6): eviction to a peer GPU, host memory or disk, restore and pool targets live in
:mod:`gfaas.dataplane.tiers` (:class:`~gfaas.dataplane.tiers.Tiers`, ``store.tiers``, a component
that sees the store through :class:`~gfaas.dataplane.tiers.StoreCore`); the core paths above call
into it, and the store re-exposes what the daemon uses (settle, queue hints, the spill runner).
"""

from __future__ import annotations

import errno
import logging
import resource
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..clock import Clock, WallClock
from ..config import NodeConfig
from ..errors import (
    AccessDenied,
    AuthenticationError,
    CapacityError,
    ConfigError,
    DataDeleted,
    DataLost,
    DataPlaneError,
    GfaasError,
    InvalidDataRef,
    ObjectStateError,
    ProtocolError,
)
from .auth import Invocation, Registry, may_read
from .backends import Backend, DeviceBackend
from .ids import ID_BYTES, new_id
from .journal import Journal
from .meta import align, check_consumers, check_meta
from .quota import IDS, RESERVED, SEGMENTS, SPILL, UNSEALED, Limits, Quotas
from .records import SEALED as SEALED
from .records import WRITING as WRITING
from .records import ObjectRecord as ObjectRecord
from .records import Segment as Segment
from .records import Session as Session
from .slabindex import DIR, DIR_ENTRY, DIR_MAX_NDIM, DTYPES, SlabIndex, committed, directory_bytes, slots_for
from .spill import SpillDir
from .tierbook import DISK, TierBook
from .tiers import RETARGET_S as RETARGET_S  # re-exported: importable from here as before
from .tiers import Spilled as Spilled
from .tiers import SpillJob, Tiers

log = logging.getLogger("gfaas.dataplane")

MAX_IDS_PER_REQUEST = 1024
# A tombstone's reason for an ID whose seal was refused after its producer could hear of it (the
# credentials it was put under ended first, see Daemon._end_binding): readers get DataLost with it.
REFUSED_SEAL = "its producer's seal was refused: "
DENIED_MESSAGE = "access denied: no object with this ID is readable by this function of this invocation"


class Store:
    def __init__(
        self,
        config: NodeConfig,
        backend: Backend,
        clock: Clock | None = None,
        registry: Registry | None = None,
        journal: Journal | None = None,
        lost: dict[bytes, str] | None = None,
        on_retire: Callable[[int], None] | None = None,
        devices: dict[int, DeviceBackend] | None = None,
        spill: SpillDir | None = None,
        local_reads: bool = False,
    ) -> None:
        self.config = config
        # Slabs get an index and a directory, so consumers read small objects without a round trip
        # (the daemon turns this on for the host backend; see slabindex.py).
        self.local_reads = local_reads
        self.backend = backend
        self.devices: dict[int, DeviceBackend] = dict(devices or {})
        self.clock = clock or WallClock()
        self.registry = registry or Registry()
        self.journal = journal
        self.on_retire = on_retire
        self.objects: dict[bytes, ObjectRecord] = {}
        self.segments: dict[int, Segment] = {}
        self._inv_segs: dict[str, set[int]] = {}  # invocation -> its segments (Segment.invocation), for end_invocation
        self.sessions: dict[int, Session] = {}
        self.reserved = 0
        self._by_inv: dict[str, set[bytes]] = {}
        self._tombs: dict[str, OrderedDict[bytes, str]] = {}
        self._lost: dict[bytes, str] = {k: v for k, v in (lost or {}).items() if v in self.registry}
        self._next_seg = 0
        self._next_session = 0
        self._pool: dict[str, list[Segment]] = {}  # workflow -> free warm segments
        self.pooled_bytes = 0
        # Objects written into a GPU pool, and copies between tiers for a reader on the other one.
        self.device_counters = {"device_objects": 0, "deliveries_to_device": 0, "deliveries_to_host": 0,
                                "bytes_delivered": 0, "staged_for_transfer": 0, "prefetched": 0}
        # What the stats stream reads without a pass over the objects (nodestats.py): live bytes and
        # objects per tier, objects being written, and bytes moved over the network by cross-node pulls.
        self.book = TierBook()
        self.writing_count = 0
        self.net_bytes = {"net-in": 0, "net-out": 0}
        self.tiers = Tiers(self, config, spill)
        assert config.quota_reserved_bytes is not None  # set by NodeConfig.__post_init__
        # Each host segment is a descriptor of the daemon's (its memfd): one invocation may hold a
        # quarter of the descriptor limit, and the warm pool an eighth, so neither a function nor what
        # it left warm can lock the other tenants out (issue 37, row 4).
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = 1 << 20 if soft == resource.RLIM_INFINITY else soft
        self.max_warm_segments = max(8, soft // 8)
        self.pooled_count = 0
        self.quotas = Quotas(Limits(config.quota_reserved_bytes, config.quota_unsealed_objects,
                                    config.quota_issued_ids, config.quota_spill_bytes or 0,
                                    config.quota_segments or max(16, soft // 4)))
        self.tiers.quotas = self.quotas

    # ---- invocations and sessions ----------------------------------------------------------
    def open_invocation(
        self,
        workflow: str,
        functions: list[str],
        invocation_id: str | None = None,
        tokens: dict[str, str] | None = None,
    ) -> Invocation:
        inv = self.registry.open(workflow, functions, invocation_id, tokens)
        now = self.clock.now()
        for fn in inv.functions:
            for tracker in self.tiers.demand.values():
                tracker.request(f"{inv.workflow}/{fn}", now)
        log.debug("open invocation %s of %s with %d functions", inv.id, workflow, len(inv.functions))
        return inv

    def end_invocation(self, invocation_id: str) -> int:
        """Free every object of the invocation and revoke its tokens; returns objects freed."""
        self.registry.end(invocation_id)
        segs = [self.segments[i] for i in sorted(self._inv_segs.get(invocation_id, ()))]  # its own only: O(1) in the others
        for g in segs:
            if g.index is not None:
                g.index.invalidate()  # no local read after the end: its readers ask the daemon
        ids = self._by_inv.pop(invocation_id, set())
        for oid in list(ids):
            rec = self.objects.get(oid)
            if rec is not None:
                if rec.state == WRITING and (seg := self.segments.get(rec.segment)) is not None:
                    seg.recyclable = False  # never sealed: give the memory back, as on a disconnect
                self._free(rec, None)
        self._tombs.pop(invocation_id, None)
        self.tiers.forget(invocation_id)
        self._lost = {k: v for k, v in self._lost.items() if v != invocation_id}
        gone: set[int] = set()
        for s in self.sessions.values():
            if s.invocation == invocation_id:
                self._close_arena(s)
                s.issued.clear()
                s.slots.clear()
                gone.add(s.id)
        self.quotas.forget(invocation_id)
        # Warm segments only its connections could write (their writes are sealed): none can now.
        for seg in [g for pool in self._pool.values() for g in pool
                    if g.mapper in gone and self.backend_of(g).writes_sealed(g.handle)]:
            self._retire(seg)
        for seg in [self.segments[i] for i in sorted(self._inv_segs.get(invocation_id, ())) if i in self.segments]:
            if not seg.pooled and not seg.live and not seg.open and not seg.holds:
                self._retire(seg)  # parked (a client still holds a view): not worth keeping
        # Pooled segments stay warm for the workflow's next invocations (see _maybe_retire).
        log.debug("end invocation %s: freed %d objects", invocation_id, len(ids))
        return len(ids)

    def connect(self, token: str) -> Session:
        inv, fn = self.registry.authenticate(token)
        self._next_session += 1
        s = Session(self._next_session, inv.id, fn, inv.functions)
        self.sessions[s.id] = s
        return s

    def disconnect(self, s: Session) -> None:
        """Forget a connection: objects it was still writing vanish, its slab closes."""
        self.sessions.pop(s.id, None)
        for rec in [self.objects[oid] for oid in s.writing if oid in self.objects]:
            seg = self.segments.get(rec.segment)
            if seg is not None:
                seg.recyclable = False  # half-written: give the memory back rather than keep it
            self._free(rec, None)
        self._close_arena(s)
        self.quotas.add(s.invocation, IDS, -len(s.issued))
        s.issued.clear()
        s.slots.clear()
        self.release_all(s)
        # Warm segments only it can write (their writes are sealed, it held the one writable
        # mapping): no client can reuse them now, so their memory goes back at once.
        for seg in [g for pool in self._pool.values() for g in pool
                    if g.mapper == s.id and self.backend_of(g).writes_sealed(g.handle)]:
            self._retire(seg)

    def check_live(self, s: Session) -> None:
        """Raise AuthenticationError if the session's invocation has ended."""
        self.check_open(s.invocation)

    def check_open(self, invocation: str) -> None:
        """Raise AuthenticationError if ``invocation`` has ended."""
        if invocation not in self.registry:
            raise AuthenticationError(
                f"invocation {invocation} has ended; its credentials are revoked. Connect with new ones"
            )

    # ---- placement ---------------------------------------------------------------------------
    def _reserve(self, nbytes: int, what: str, force: bool = False) -> None:
        """Make room for ``nbytes`` under the cap: warm segments go first (no copy), then victims
        of :func:`plan_eviction` go to disk. ``force`` (a restore on the get path) skips the
        eviction and may overshoot the cap by this one segment; :meth:`settle` evicts after the
        reply, so the get waits for its own copy only."""
        cap = self.config.capacity_bytes
        if nbytes > cap:
            raise CapacityError(
                f"{what} of {nbytes} bytes on {self.config.node_id}/{self.backend.name} exceeds the whole pool"
                f" of {cap} bytes; raise capacity_bytes or split the object"
            )
        if self.reserved + nbytes > cap:
            self._evict_warm(nbytes)
        if force:
            self.tiers._unsettled = self.tiers._unsettled or self.reserved + nbytes > cap
            return
        # Segments being written to disk by the worker are as good as gone (see Tiers._spill).
        if self.reserved - self.tiers.spilling_bytes + nbytes > cap:
            self.tiers._make_host_room(self.reserved - self.tiers.spilling_bytes + nbytes - cap)
        if self.reserved - self.tiers.spilling_bytes + nbytes > cap:
            raise CapacityError(
                f"{what} of {nbytes} bytes failed on {self.config.node_id}/{self.backend.name}: pool {cap},"
                f" in use {self.reserved}, free {cap - self.reserved}; {self.tiers._why_full()}; free objects"
                " (delete, end invocations) or raise capacity_bytes"
            )

    def backend_of(self, seg: Segment) -> Backend:
        return self.backend if seg.device < 0 else self.devices[seg.device]

    def check_device(self, device: int) -> None:
        if device >= 0 and device not in self.devices:
            have = sorted(self.devices) or "none"
            raise ConfigError(
                f"GPU {device} has no memory pool on node {self.config.node_id} (its GPUs: {have});"
                " start the node with devices='cuda' or pick one of its GPUs"
            )

    def _new_segment(self, invocation: str, owner: int | None, nbytes: int, what: str, device: int = -1,
                     force: bool = False) -> Segment:
        if device >= 0:
            # A GPU pool enforces its own cap; its memory is reused by the pool, not the warm list.
            self.check_device(device)
            tenant = self.registry.get(invocation).workflow if invocation in self.registry else ""
            handle = self.tiers._device_alloc(device, nbytes, tenant)  # its own arenas (policy.pool)
            size = self.devices[device].size_of(handle)
        else:
            charged = invocation in self.registry
            if charged:
                self.quotas.check(invocation, SEGMENTS, 1)
            self._reserve(nbytes, what, force)
            try:
                handle = self.backend.alloc(nbytes)
            except (OSError, CapacityError) as exc:
                # Out of descriptors: the warm segments hold some that nobody uses; give them back.
                cause = exc if isinstance(exc, OSError) else exc.__cause__
                if getattr(cause, "errno", None) not in (errno.EMFILE, errno.ENFILE) or not self._retire_idle():
                    raise
                handle = self.backend.alloc(nbytes)
            size = self.backend.size_of(handle)
            self.reserved += size
            seg = self._add_segment(invocation, owner, handle, size, device)
            if charged:
                self.quotas.hold(("seg", seg.id), invocation, SEGMENTS, 1, check=False)
            return seg
        return self._add_segment(invocation, owner, handle, size, device)

    def _add_segment(self, invocation: str, owner: int | None, handle: Any, size: int, device: int) -> Segment:
        self._next_seg += 1
        workflow = self.registry.get(invocation).workflow if invocation in self.registry else ""
        seg = Segment(self._next_seg, invocation, owner, size, handle, open=owner is not None, workflow=workflow,
                      device=device, recyclable=device < 0, home=device)
        self.segments[seg.id] = seg
        self._inv_segs.setdefault(invocation, set()).add(seg.id)
        return seg

    def _unindex(self, seg: Segment) -> None:
        ids = self._inv_segs.get(seg.invocation)
        if ids is not None:
            ids.discard(seg.id)
            if not ids:
                del self._inv_segs[seg.invocation]

    def _close_arena(self, s: Session) -> None:
        seg, s.arena = s.arena, None
        if seg is not None:
            seg.open = False
            self.quotas.drop(("slab", seg.id))
            self._maybe_retire(seg)

    def _maybe_retire(self, seg: Segment) -> None:
        """Retire a segment nobody stores into any more, or keep a large-object segment warm.

        A segment of its own (one large object) whose object is gone is kept for the next large
        object of an invocation of the same workflow: its pages are already allocated (faulting
        in fresh shared memory costs several times the copy itself), so the next put runs at
        memory speed. The scope is the workflow, never wider: a producer that reuses a segment
        can see bytes an earlier invocation of its own workflow left there, the trade-off a
        caching GPU allocator makes too (``warm_pool_bytes=0`` turns reuse off). A segment is
        reused only once every view a client took of it is gone (``pins`` back to 0); until then
        it is *parked*. Pooled and parked segments are retired first when the pool runs short.
        """
        if seg.live or seg.open or seg.pooled or seg.holds or seg.id not in self.segments:
            return
        if seg.device >= 0 and seg.pins:
            return  # a GPU pool reuses the block at once: wait until no process has a view of it
        if seg.owner is None and seg.recyclable and seg.workflow:
            if seg.pins:
                return  # parked
            if seg.mapper and seg.mapper not in self.sessions and self.backend_of(seg).writes_sealed(seg.handle):
                self._retire(seg)  # writable only by a connection that is gone: of no use warm
                return
            if self.pooled_bytes + seg.size <= self.tiers.warm_limit(freeing=seg.size) \
                    and self.pooled_count < self.max_warm_segments:
                seg.pooled = True
                self.pooled_bytes += seg.size
                self.pooled_count += 1
                self._pool.setdefault(seg.workflow, []).append(seg)
                self.quotas.drop(("seg", seg.id))  # the workflow's now, not the invocation's
                return
        self._retire(seg)

    def _retire(self, seg: Segment) -> None:
        if seg.pooled:
            seg.pooled = False
            self.pooled_bytes -= seg.size
            self.pooled_count -= 1
            self._pool[seg.workflow].remove(seg)
        self.quotas.drop(("seg", seg.id))
        del self.segments[seg.id]
        self._unindex(seg)
        if seg.index is not None:
            seg.index.close()
            seg.index = None
        seg.directory = None
        self.tiers._away.discard(seg.id)
        self.tiers._unsettled = True  # memory came back: something evicted may return (settle)
        if seg.device < 0:
            self.reserved -= seg.size
        self.backend_of(seg).free(seg.handle)
        if self.on_retire is not None:
            self.on_retire(seg.id)

    def _idle_segments(self) -> list[Segment]:
        idle = [g for g in self.segments.values() if g.pooled]
        idle += [g for g in self.segments.values()
                 if not g.pooled and not g.live and not g.open and not g.holds and g.device < 0]
        return idle

    def _evict_warm(self, need: int) -> None:
        """Retire pooled, then parked, segments (oldest first) until ``need`` more bytes fit."""
        cap = self.config.capacity_bytes
        for seg in self._idle_segments():
            if self.reserved + need <= cap:
                return
            self._retire(seg)

    def _retire_idle(self) -> int:
        """Retire every pooled and parked segment (the node is out of descriptors); how many."""
        idle = self._idle_segments()
        for seg in idle:
            self._retire(seg)
        if idle:
            log.warning("node %s out of file descriptors: %d warm segments given back", self.config.node_id,
                        len(idle))
        return len(idle)

    def _take_warm(self, invocation: str, nbytes: int, writer: int | None = None) -> Segment | None:
        """A pooled segment of this invocation's workflow that fits ``nbytes`` without wasting over half.

        ``writer``: the session that will write it (None: the daemon, a restore). A segment whose
        writes are sealed (every one that held an object) can be written only through a mapping
        made before the seal: it goes only to the session that holds one (``mapper``), or to the
        daemon (which has one of every segment) once no live session does. So no process ever
        keeps a writable mapping of a segment that holds somebody else's sealed object."""
        if invocation not in self.registry:
            return None
        self.quotas.check(invocation, SEGMENTS, 1)
        workflow = self.registry.get(invocation).workflow
        best = None
        for seg in self._pool.get(workflow, ()):
            if nbytes <= seg.size <= 2 * nbytes + 4096 and (best is None or seg.size < best.size):
                mapper = seg.mapper if seg.mapper in self.sessions else 0
                if mapper == (writer or 0) or not self.backend_of(seg).writes_sealed(seg.handle):
                    best = seg
        if best is not None:
            self._pool[workflow].remove(best)
            best.pooled = False
            self._unindex(best)
            best.invocation = invocation
            self._inv_segs.setdefault(invocation, set()).add(best.id)
            self.pooled_bytes -= best.size
            self.pooled_count -= 1
            self.quotas.hold(("seg", best.id), invocation, SEGMENTS, 1, check=False)
        return best

    def pin(self, s: Session, seg: Segment, read: tuple[int, int] | None = None) -> bool:
        """Record that the session took a view of a reusable segment; it must release it.
        ``read``: the (offset, nbytes) of the sealed object it got (what :meth:`derive` may slice)."""
        if seg.owner is not None:
            return False  # slab space is never handed out twice: nothing to pin
        seg.pins += 1
        s.pins[seg.id] = s.pins.get(seg.id, 0) + 1
        if read is not None:
            s.read.setdefault(seg.id, []).append(read)
        return True

    def release_all(self, s: Session) -> None:
        """Release every pin the session holds (it disconnected, or a transfer finished)."""
        self.release(s, [sid for sid, n in s.pins.items() for _ in range(n)])

    def release(self, s: Session, segments: list[int]) -> None:
        """The session's views of these segments are gone (unknown entries are ignored)."""
        for sid in segments:
            held = s.pins.get(sid, 0)
            if held <= 0:
                continue
            if held == 1:
                del s.pins[sid]
                s.read.pop(sid, None)  # no view left: nothing of it may be derived any more
            else:
                s.pins[sid] = held - 1
            seg = self.segments.get(sid)
            if seg is not None:
                seg.pins -= 1
                self._maybe_retire(seg)

    def _issue(self, s: Session, n: int) -> list[bytes]:
        """``n`` fresh IDs for the session, in consecutive slots of its slab's index if it has room."""
        self.quotas.check(s.invocation, IDS, n)
        ids = [self._new_journalled_id(s.invocation) for _ in range(n)]
        s.issued.update(ids)
        self.quotas.add(s.invocation, IDS, n)
        self._index_ids(s, ids)
        return ids

    def _check_reserved(self, invocation: str, nbytes: int) -> None:
        if nbytes <= self.config.capacity_bytes:  # larger: _reserve says it exceeds the whole pool
            self.quotas.check(invocation, RESERVED, max(nbytes, 1))

    def _check_spill_quota(self, invocation: str) -> None:
        """No new memory for an invocation whose objects on disk are at its quota already (the
        evictions that put them there are never refused: they run for whoever needs memory)."""
        limit = self.config.quota_spill_bytes
        if limit is None:  # half the disk tier, whatever it is now
            spill = self.tiers.spill
            if spill is None or spill.capacity_bytes is None:
                return
            limit = spill.capacity_bytes // 2
        self.quotas.check(invocation, SPILL, 0, limit)

    def _index_ids(self, s: Session, ids: list[bytes]) -> int:
        seg = s.arena
        idx = seg.index if seg is not None else None
        if not ids or seg is None or idx is None or idx.entries - idx.next < len(ids):
            return -1
        first = idx.next
        for oid in ids:
            s.slots[oid] = (seg.id, idx.add(oid))
        return first

    def _new_journalled_id(self, invocation: str) -> bytes:
        """A fresh ID, recorded in the journal as it is handed out.

        Recording at issue time rather than at seal time covers a put whose asynchronous seal is
        still queued when the daemon dies: after a restart its readers get ``DataLost``. An issued
        ID that was never used is known only to the client it was issued to, so answering
        ``DataLost`` for it (to its own invocation only) reveals nothing. Copies pulled from other
        nodes are not recorded: after a restart they are pulled again from their owner.
        """
        oid = new_id()
        if self.journal is not None:
            self.journal.append(oid, invocation)
        return oid

    def lease(self, s: Session, min_bytes: int, ids: int | None = None) -> tuple[Segment, list[bytes]]:
        """Give the session a fresh slab to pack small objects into, and a batch of IDs: enough for it to
        hold ``ids`` (at most, and by default, ``ids_per_lease``)."""
        self.check_live(s)
        if not 0 <= min_bytes <= self.config.small_object_max:
            raise CapacityError(
                f"a slab lease is for objects up to {self.config.small_object_max} bytes, asked for"
                f" {min_bytes}; allocate larger objects individually"
            )
        want = self.config.ids_per_lease if ids is None else max(1, min(ids, self.config.ids_per_lease))
        need = max(0, want - len(s.issued))
        self.quotas.check(s.invocation, IDS, need)
        self._check_spill_quota(s.invocation)
        self._close_arena(s)
        self.quotas.check(s.invocation, RESERVED, self.config.slab_bytes)
        seg = self._new_segment(s.invocation, s.id, self.config.slab_bytes, "slab lease")
        self.quotas.hold(("slab", seg.id), s.invocation, RESERVED, seg.size, check=False)
        s.arena, s.arena_next = seg, 0
        seg.limit = seg.size
        if self.local_reads and seg.device < 0:
            slots = slots_for(seg.size)
            seg.limit = seg.size - directory_bytes(seg.size)
            seg.index = SlabIndex(slots)
            seg.directory = self.backend.host_view(seg.handle)
        return seg, self._lease_ids(s, need)

    def _lease_ids(self, s: Session, need: int) -> list[bytes]:
        """After a lease: ``need`` fresh IDs; with the ones left over from the previous slab, they all
        go into the new slab's index (the old slots are marked gone), see :meth:`held_ids`."""
        old = list(s.issued)
        fresh = [self._new_journalled_id(s.invocation) for _ in range(need)]
        s.issued.update(fresh)
        self.quotas.add(s.invocation, IDS, need)
        for sid, slot in s.slots.values():
            prev = self.segments.get(sid)
            if prev is not None and prev.index is not None:
                prev.index.gone(slot)
        s.slots.clear()
        self._index_ids(s, old + fresh)
        return fresh

    def more_ids(self, s: Session, n: int) -> list[bytes]:
        self.check_live(s)
        if not 1 <= n <= MAX_IDS_PER_REQUEST:
            raise ProtocolError(f"asked for {n} IDs; ask for 1-{MAX_IDS_PER_REQUEST}")
        return self._issue(s, n)

    @staticmethod
    def held_ids(s: Session) -> list[bytes]:
        """Every ID the session holds that is in its slab's index, in slot order."""
        return list(s.slots)

    @staticmethod
    def first_slot(s: Session, ids: list[bytes]) -> int:
        """The index slot of ``ids[0]`` (the rest follow it), or -1 when they are in no index."""
        where = s.slots.get(ids[0]) if ids else None
        return where[1] if where is not None and s.arena is not None and where[0] == s.arena.id else -1

    def _record(
        self, oid: bytes, s_inv: str, producer: str, consumers: frozenset[str] | None, seg: Segment,
        offset: int, nbytes: int, dtype: str, shape: tuple[int, ...], state: str, writer: int | None,
    ) -> ObjectRecord:
        rec = ObjectRecord(
            oid, s_inv, producer, consumers, set(consumers) if consumers else None, seg.id, offset,
            nbytes, dtype, shape, state, self.clock.now(), writer,
        )
        rec.accessed = rec.created
        self.objects[oid] = rec
        self._by_inv.setdefault(s_inv, set()).add(oid)
        self.tiers._seg_objs.setdefault(seg.id, set()).add(oid)
        seg.live += 1
        self.book.add(seg.device, nbytes)
        if state == WRITING:
            self.writing_count += 1
        if state == SEALED:
            self.tiers._stored(rec, seg)
        return rec

    def seal_small(
        self, s: Session, oid: bytes, offset: int, nbytes: int, dtype: str, shape: list[int],
        consumers: list[str] | None,
    ) -> ObjectRecord:
        """Publish an object the client wrote into its slab (the asynchronous put path)."""
        self.check_live(s)
        if oid not in s.issued:
            raise InvalidDataRef("seal of an ID that this connection was not issued; use IDs from a lease")
        seg = s.arena
        if seg is None or offset < s.arena_next or offset % 64 or offset + nbytes > (seg.limit or seg.size):
            raise ProtocolError(
                f"seal at offset {offset} (+{nbytes}) is outside the free part of this connection's slab"
            )
        shp = check_meta(nbytes, dtype, shape)
        cons = check_consumers(consumers, s.functions)
        s.issued.discard(oid)
        self.quotas.add(s.invocation, IDS, -1)
        s.arena_next = offset + nbytes
        rec = self._record(oid, s.invocation, s.function, cons, seg, offset, nbytes, dtype, shp, SEALED, None)
        where = s.slots.pop(oid, None)
        if where is not None and where[0] == seg.id:
            rec.slot = where[1]
        return rec

    @staticmethod
    def directory_pending(s: Session) -> bool:
        """Whether the session's slab has a directory entry not yet sealed (one 8-byte read)."""
        seg = s.arena
        if seg is None or seg.index is None or seg.described >= seg.index.next:
            return False
        view = seg.directory
        return view is not None and committed(view, seg.limit + seg.described * DIR_ENTRY)

    def scan_directory(self, s: Session) -> tuple[list[ObjectRecord], GfaasError | None]:
        """Seal the small objects the session described in its slab's directory since the last scan
        (a put that sends no ``Seal``, see slabindex.py): each entry is checked exactly as a
        ``Seal`` carrying the same fields. Returns the objects sealed and the first refusal."""
        seg = s.arena
        if seg is None or seg.index is None:
            return [], None
        view = seg.directory
        if view is None:
            view = seg.directory = self.backend.host_view(seg.handle)
        if view is None:
            return [], None
        done: list[ObjectRecord] = []
        err: GfaasError | None = None
        slots = min(seg.index.next, seg.index.entries)
        while seg.described < slots:
            at = seg.limit + seg.described * DIR_ENTRY
            if not committed(view, at):
                break  # not written yet (slots are used in order)
            entry = DIR.unpack_from(bytes(view[at : at + DIR_ENTRY]))  # a copy: the client may write on
            slot = seg.described
            seg.described += 1
            n, oid, code, ndim, everyone, d0, d1, d2, d3, mask, commit = entry
            try:
                if ndim > DIR_MAX_NDIM:
                    raise ProtocolError(f"directory slot {slot} describes no object that can be sealed from it")
                if s.slots.get(oid) != (seg.id, slot):
                    raise InvalidDataRef(f"directory slot {slot} names an ID not issued for it")
                if code >= len(DTYPES):
                    raise ProtocolError(f"directory slot {slot} has an unknown dtype code {code}")
                cons = None if everyone else [f for i, f in enumerate(s.functions[:128])
                                               if mask[i // 8] >> (i % 8) & 1]
                done.append(self.seal_small(s, oid, commit - 1, n, DTYPES[code], [d0, d1, d2, d3][:ndim], cons))
            except GfaasError as exc:
                self.seal_refused(s, oid, exc)
                err = err or exc
            except Exception as exc:  # a bug must not take the node down (as in Daemon._run)
                log.exception("internal error sealing from a slab directory")
                err = err or DataPlaneError(f"internal error in the node daemon: {exc!r}")
        return done, err

    def seal_refused(self, s: Session, oid: object, exc: GfaasError) -> None:
        """Remember why the seal of an ID issued to ``s`` was refused, so its readers learn it (a put is
        not answered: its producer hears of the refusal only with its next request, if it makes one)."""
        if isinstance(oid, bytes) and oid in s.issued and s.invocation in self.registry:
            tombs = self._tombs.setdefault(s.invocation, OrderedDict())
            tombs[oid] = REFUSED_SEAL + str(exc)
            if len(tombs) > self.config.tombstones_per_invocation:
                tombs.popitem(last=False)

    def allocate(
        self, s: Session, nbytes: int, dtype: str, shape: list[int], consumers: list[str] | None,
        device: int = -1,
    ) -> tuple[ObjectRecord, Segment]:
        """Reserve space for an object written in place; it stays ``writing`` until sealed.
        ``device >= 0`` places it in that GPU's pool (a segment of its own)."""
        self.check_live(s)
        shp = check_meta(nbytes, dtype, shape)
        cons = check_consumers(consumers, s.functions)
        self.quotas.check(s.invocation, UNSEALED, 1)
        self._check_spill_quota(s.invocation)
        seg = s.arena
        off = align(s.arena_next)
        own = True  # a segment of its own, charged to the reserved-bytes quota until sealed
        if device >= 0:  # a GPU pool has a cap of its own; the quota is on host memory
            own = False
            self.device_counters["device_objects"] += 1
            seg, off = self._new_segment(s.invocation, None, max(nbytes, 1), "allocation", device), 0
        elif nbytes <= self.config.small_object_max and seg is not None and off + nbytes <= (seg.limit or seg.size):
            s.arena_next = off + nbytes
            own = False  # in its slab, charged as the slab
        else:
            self._check_reserved(s.invocation, nbytes)
            seg = self._take_warm(s.invocation, nbytes, s.id) or self._new_segment(
                s.invocation, None, max(nbytes, 1), "allocation")
            seg.mapper = s.id  # its writable descriptor goes to this session (Daemon._export)
            off = 0
        oid = self._new_journalled_id(s.invocation)
        rec = self._record(oid, s.invocation, s.function, cons, seg, off, nbytes, dtype, shp, WRITING, s.id)
        s.writing.add(oid)
        self.quotas.hold(("w", oid), s.invocation, UNSEALED, 1, check=False)
        if own:
            self.quotas.hold(("r", oid), s.invocation, RESERVED, seg.size, check=False)
        return rec, seg

    def seal(self, s: Session | None, oid: bytes, event: bytes = b"") -> ObjectRecord:
        """Make an allocated object immutable and visible (``s=None``: internal, e.g. a pull)."""
        rec = self.objects.get(oid)
        if rec is not None and s is not None and rec.state != WRITING and (rec.invocation, rec.producer) == (
                s.invocation, s.function):
            raise ObjectStateError(f"object {oid.hex()} is already sealed; objects are sealed once")
        if rec is None or (s is not None and (rec.writer != s.id or rec.invocation != s.invocation)):
            raise AccessDenied("seal refused: no object with this ID is being written by this connection")
        if rec.state != WRITING:
            raise ObjectStateError(f"object {oid.hex()} is already sealed; objects are sealed once")
        if rec.writer is not None and (w := self.sessions.get(rec.writer)) is not None:
            w.writing.discard(oid)
        rec.state, rec.writer = SEALED, None
        self.writing_count -= 1
        self.quotas.drop(("w", oid))
        self.quotas.drop(("r", oid))
        if (seg := self.segments.get(rec.segment)) is not None:
            self.tiers._stored(rec, seg)
            if seg.owner is None and seg.device < 0 and self.config.seal_writes:
                self.backend.seal_writes(seg.handle)  # immutable: no new writable mapping, by anyone
        if event:
            if self.segments[rec.segment].device < 0:
                raise ProtocolError("a seal with a CUDA event is for device objects; this one is in host memory")
            rec.event = event
        return rec

    def derive(
        self, s: Session, segment: int, offset: int, nbytes: int, dtype: str, shape: list[int],
        consumers: list[str] | None,
    ) -> ObjectRecord:
        """Publish bytes of an object the session read as a new sealed object, without a copy.

        Allowed only inside an object this session got from a segment of its own and still holds a
        view of (a pin): those bytes are sealed and, while pinned, never handed out again. The new
        object keeps the segment alive on its own; its parent may be freed meanwhile.
        """
        self.check_live(s)
        seg = self.segments.get(segment)
        ranges = s.read.get(segment)
        if seg is None or not ranges:
            raise AccessDenied("derive refused: this connection holds no view of an object in that segment")
        if nbytes < 0 or not any(a <= offset and offset + nbytes <= a + n for a, n in ranges):
            raise AccessDenied(f"derive refused: bytes {offset}..{offset + nbytes} are outside the object read")
        shp = check_meta(nbytes, dtype, shape)
        cons = check_consumers(consumers, s.functions)
        oid = self._new_journalled_id(s.invocation)
        return self._record(oid, s.invocation, s.function, cons, seg, offset, nbytes, dtype, shp, SEALED, None)

    def place(
        self, invocation: str, producer: str, consumers: frozenset[str] | None, pending: set[str] | None,
        oid: bytes, nbytes: int, dtype: str, shape: tuple[int, ...],
    ) -> tuple[ObjectRecord, Segment]:
        """Reserve a segment for an object arriving from elsewhere (a cross-node pull)."""
        if oid in self.objects:
            raise ObjectStateError(f"object {oid.hex()} is already on node {self.config.node_id}")
        # A warm segment of the workflow when one fits: fresh shared memory is faulted in at ~1 GB/s
        # here, a third of what a TCP stream delivers, so a pull into one cannot reach the link's rate.
        seg = self._take_warm(invocation, max(nbytes, 1)) or self._new_segment(invocation, None, max(nbytes, 1), "pull")
        seg.mapper = 0  # written by the daemon (the puller), through its own mapping
        rec = self._record(oid, invocation, producer, consumers, seg, 0, nbytes, dtype, shape, WRITING, None)
        rec.pending = pending
        return rec, seg

    # ---- reads and deletes ---------------------------------------------------------------------
    def lookup(self, invocation: str, function: str, oid: object) -> ObjectRecord:
        """The record if ``function`` of ``invocation`` may read it; the right error otherwise."""
        if not isinstance(oid, bytes) or len(oid) != ID_BYTES:
            raise InvalidDataRef(f"object ID must be {ID_BYTES} bytes")
        rec = self.objects.get(oid)
        if rec is None or not may_read(rec.invocation, rec.producer, rec.consumers, invocation, function):
            if rec is None:
                tombs = self._tombs.get(invocation)
                reason = tombs.get(oid) if tombs is not None else None
                if reason is not None and reason.startswith(REFUSED_SEAL):
                    raise DataLost(f"object {oid.hex()} was never stored: {reason}; re-run the function that"
                                   " produced it")
                if reason is not None:
                    raise DataDeleted(f"object {oid.hex()} was freed ({reason}); it can no longer be read")
                if self._lost.get(oid) == invocation:
                    raise DataLost(
                        f"object {oid.hex()} was lost when node {self.config.node_id} restarted;"
                        " re-run the function that produced it"
                    )
            raise AccessDenied(DENIED_MESSAGE)
        if rec.state != SEALED:
            raise ObjectStateError(f"object {oid.hex()} is still being written; get it after it is sealed")
        return rec

    def get(self, s: Session, oid: object, export: Callable[[ObjectRecord, Segment], Any] | None = None) -> Any:
        """Read access for the session: ``export(record, segment)`` runs before any consumption
        frees the object, and its result is returned (the record itself when ``export`` is None)."""
        self.check_live(s)
        rec = self.lookup(s.invocation, s.function, oid)
        seg = self.tiers.resident(rec)
        rec.accessed = self.clock.now()
        out = export(rec, seg) if export is not None else rec
        self.consumed(rec, s.function)
        return out

    def delivery(self, s: Session, nbytes: int, device: int) -> Segment:
        """A segment on another tier for a copy of an object this session is about to get (a GPU
        function reading a host object, or the reverse). It holds no object: it lives while the
        session's view of it does (:meth:`pin`), then goes back."""
        self.check_live(s)
        self.check_device(device)
        seg = self._new_segment(s.invocation, None, max(nbytes, 1), "delivery", device)
        self.device_counters["deliveries_to_device" if device >= 0 else "deliveries_to_host"] += 1
        self.device_counters["bytes_delivered"] += nbytes
        seg.open = False
        seg.recyclable = False
        return seg

    def staging(self, invocation: str, nbytes: int) -> Segment:
        """A host segment to send a GPU object off this machine from (the transfer server copies the
        object into it, then streams it from there). It is a warm segment of the invocation's
        workflow when one fits, and goes back to that pool after (:meth:`end_staging`), so the same
        memory serves the workflow's next pulls and the GPU's registration of it
        (``dataplane.pinned``) is paid once."""
        self.check_open(invocation)
        seg = self._take_warm(invocation, max(nbytes, 1)) or self._new_segment(invocation, None, max(nbytes, 1),
                                                                               "staging")
        seg.open = False
        self.device_counters["staged_for_transfer"] += 1
        return seg

    def end_staging(self, seg: Segment) -> None:
        """The transfer that staged through ``seg`` is over (sent or failed): back to the warm pool."""
        self._maybe_retire(seg)

    def hold(self, seg: Segment) -> None:
        """Keep a segment's memory while a copy reads it outside the lock (see :meth:`unhold`)."""
        seg.holds += 1

    def unhold(self, seg: Segment) -> None:
        seg.holds -= 1
        self._maybe_retire(seg)

    def drop_delivery(self, seg: Segment) -> None:
        """Give back a delivery segment that was never handed out (the get failed)."""
        if seg.id in self.segments and not seg.pins and not seg.live:
            self._retire(seg)

    def consumed(self, rec: ObjectRecord, function: str) -> None:
        """Note that ``function`` read ``rec``; free it when every declared consumer has."""
        if rec.pending is not None and function in rec.pending:
            rec.pending.discard(function)
            if not rec.pending:
                self._free(rec, "read by all of its consumers")
            else:
                self.tiers.read(rec)  # its other readers may be done already

    def delete(self, s: Session, oid: object) -> None:
        self.check_live(s)
        rec = self.objects.get(oid) if isinstance(oid, bytes) else None
        if rec is None or rec.invocation != s.invocation or rec.producer != s.function:
            if rec is not None and may_read(rec.invocation, rec.producer, rec.consumers, s.invocation, s.function):
                raise AccessDenied(f"only the producer {rec.producer!r} may delete object {rec.id.hex()}")
            self.lookup(s.invocation, s.function, oid)  # raises the precise error
            raise AccessDenied(DENIED_MESSAGE)
        self._free(rec, "deleted by its producer")

    def forget(self, rec: ObjectRecord) -> None:
        """Drop a record without a tombstone (a pulled copy: later reads go to its owner again)."""
        self._free(rec, None)

    def _free(self, rec: ObjectRecord, reason: str | None) -> None:
        del self.objects[rec.id]
        if rec.state == WRITING:
            self.writing_count -= 1
            self.quotas.drop(("w", rec.id))
            self.quotas.drop(("r", rec.id))
        if rec.writer is not None and (w := self.sessions.get(rec.writer)) is not None:
            w.writing.discard(rec.id)
        ids = self._by_inv.get(rec.invocation)
        if ids is not None:
            ids.discard(rec.id)
        if reason is not None and rec.invocation in self.registry:
            tombs = self._tombs.setdefault(rec.invocation, OrderedDict())
            tombs[rec.id] = reason
            if len(tombs) > self.config.tombstones_per_invocation:
                tombs.popitem(last=False)
        self.tiers._unsettled = True
        sp = self.tiers.spilled.get(rec.segment)
        if sp is not None:
            sp.objects.discard(rec.id)
            if not sp.objects:
                del self.tiers.spilled[sp.id]
                self.quotas.drop(("spill", sp.id))
                if self.tiers.spill is not None:
                    self.tiers.spill.remove(sp.id)
            tier = sp.home
            self.book.remove(DISK, rec.nbytes)
        else:
            tier = -1
        seg = self.segments.get(rec.segment)
        if seg is not None:
            self.book.remove(seg.device, rec.nbytes)
            if rec.slot >= 0 and seg.index is not None:
                seg.index.gone(rec.slot)
            tier = seg.home
            objs = self.tiers._seg_objs.get(seg.id)
            if objs is not None:
                objs.discard(rec.id)
                if not objs:
                    del self.tiers._seg_objs[seg.id]
            seg.live -= 1
            self._maybe_retire(seg)
        if rec.state == SEALED and (tracker := self.tiers.demand.get(tier)) is not None:
            tracker.released(self.tiers._demand_key(rec), self.clock.now())

    def _movable(self, seg: Segment) -> bool:
        """Nobody holds a view into it or writes it, no copy reads it, no small put packs into it."""
        return (not seg.open and not seg.pins and not seg.holds and not seg.pooled and seg.live > 0
                and all(r.state == SEALED for r in self.tiers._objs(seg)))

    # ---- introspection -------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        writing = sum(1 for r in self.objects.values() if r.state == WRITING)
        return {
            "objects": len(self.objects) - writing,
            "writing": writing,
            "bytes_reserved": self.reserved,
            "bytes_live": sum(r.nbytes for r in self.objects.values()),
            "capacity_bytes": self.config.capacity_bytes,
            "segments": len(self.segments),
            "invocations": len(self.registry),
            "connections": len(self.sessions),
            "lost": len(self._lost),
            "bytes_pooled": self.pooled_bytes,
            "segments_pooled": sum(len(v) for v in self._pool.values()),
            "device_bytes_held": sum(b.pool.held for b in self.devices.values()),
            "device_bytes_used": sum(b.pool.used for b in self.devices.values()),
            **self.tiers.counters,
            **self.device_counters,
            "objects_on_disk": sum(len(sp.objects) for sp in self.tiers.spilled.values()),
            "bytes_on_disk": self.tiers.spill.bytes_on_disk if self.tiers.spill is not None else 0,
            "pool_target": self.tiers.host_target,
            "device_pool_target": sum(b.pool.target for b in self.devices.values()),
            "bytes_host_direct": sum(b.bytes_host_direct for b in self.devices.values()),
            "bytes_host_ring": sum(b.bytes_host_ring for b in self.devices.values()),
        }

    # ---- the tiers, as the daemon and tools see them (see gfaas.dataplane.tiers) -----------------
    def settle(self) -> None:
        self.tiers.settle()

    def next_settle(self) -> float | None:
        return self.tiers.next_settle()

    def queue_hint(self, invocation_id: object, positions: Mapping[str, int], done: Iterable[str] = ()) -> None:
        self.tiers.queue_hint(invocation_id, positions, done)

    def queue_state(self, entries: Iterable[tuple[str, Mapping[str, tuple[str, int]], Iterable[str], Iterable[str]]],
                    heads: Mapping[str, int]) -> int:
        return self.tiers.queue_state(entries, heads)

    def resident(self, rec: ObjectRecord, device: int | None = None) -> Segment:
        return self.tiers.resident(rec, device)

    def warm_limit(self, freeing: int = 0) -> int:
        return self.tiers.warm_limit(freeing)

    def finish_spill(self, job: SpillJob, error: Exception | None) -> None:
        self.tiers.finish_spill(job, error)

    def close(self) -> None:
        self.tiers.close()

    @property
    def spill(self) -> SpillDir | None:
        return self.tiers.spill

    @property
    def spilled(self) -> dict[int, Spilled]:
        return self.tiers.spilled

    @property
    def counters(self) -> dict[str, int]:
        return self.tiers.counters

    @property
    def host_target(self) -> int:
        return self.tiers.host_target

    @property
    def spilling_bytes(self) -> int:
        return self.tiers.spilling_bytes

    @property
    def spill_error(self) -> str:
        return self.tiers.spill_error

    @property
    def spill_runner(self) -> Callable[[SpillJob], None] | None:
        return self.tiers.spill_runner

    @spill_runner.setter
    def spill_runner(self, runner: Callable[[SpillJob], None] | None) -> None:
        self.tiers.spill_runner = runner
