"""The store's memory tiers: each GPU pool, then host memory, then a spill directory on disk.

A GPU pool at its cap moves victims to a faster peer GPU or to host memory; host memory over its
cap writes victims to disk (or releases objects nobody will read); evicted objects come back on a
get and, after each reply, into memory that was freed (:meth:`Tiers.settle`). Queue hints
from the runtime say which objects are needed soonest. Every decision comes from
:mod:`gfaas.policy.storage`: victims from ``plan_eviction``, what comes back from ``plan_restore``,
a GPU victim's destination from ``migration_target``, pool sizes from a ``DemandTracker`` per tier.
This module only keeps the facts those functions need (sizes, accesses, queue hints) and carries
out their answers. :class:`Tiers` is a component of :class:`gfaas.dataplane.store.Store` (``store.tiers``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..clock import Clock
from ..config import NodeConfig
from ..errors import CapacityError, ConfigError, DataLost, NotFound
from ..policy.storage import (
    DemandTracker,
    Peer,
    QueueBook,
    Resident,
    Ticket,
    migration_target,
    plan_eviction,
    plan_restore,
    positions_by_consumer,
    storage_policy,
    unneeded,
)
from .auth import Registry
from .backends import Backend, DeviceBackend
from .quota import SPILL, Quotas
from .records import ObjectRecord, Segment
from .spill import SpillDir
from .tierbook import DISK, TierBook

log = logging.getLogger("gfaas.dataplane")

#: Pool targets are recomputed at most this often (clock seconds): a target needs no per-request
#: precision, and each recomputation takes quantiles of every function's histograms.
RETARGET_S = 0.05


@dataclass(slots=True)
class SpillJob:
    """A segment being written to disk by a worker thread while it stays readable in memory."""

    seg: Segment
    key: int  # the spill file's key (and the Spilled id once it completes)
    data: memoryview  # the bytes to write: a view of the segment, or a copy of it
    view: memoryview | None  # the segment's own view behind ``data`` (released when done)
    objects: frozenset[bytes]  # the objects it held when the write started
    length: int


@dataclass(slots=True)
class Spilled:
    """A segment evicted to disk: its objects keep their offsets and come back together."""

    id: int  # from the segment counter, so an object's ``segment`` names either kind
    invocation: str
    workflow: str
    size: int
    length: int  # bytes in the file: up to the end of its last object
    home: int
    recyclable: bool
    objects: set[bytes]


class StoreCore(Protocol):
    """What the tiers use of the store: its memory and objects, and the operations that keep the
    store's books when a segment is created, moved or retired (see :class:`~gfaas.dataplane.store.Store`)."""

    config: NodeConfig
    backend: Backend
    devices: dict[int, DeviceBackend]
    clock: Clock
    registry: Registry
    objects: dict[bytes, ObjectRecord]
    segments: dict[int, Segment]
    _by_inv: dict[str, set[bytes]]
    reserved: int
    pooled_bytes: int
    _pool: dict[str, list[Segment]]
    _next_seg: int
    book: TierBook

    def _new_segment(self, invocation: str, owner: int | None, nbytes: int, what: str, device: int = -1,
                     force: bool = False) -> Segment: ...
    def _add_segment(self, invocation: str, owner: int | None, handle: Any, size: int, device: int) -> Segment: ...
    def _retire(self, seg: Segment) -> None: ...
    def _evict_warm(self, need: int) -> None: ...
    def _take_warm(self, invocation: str, nbytes: int) -> Segment | None: ...
    def _free(self, rec: ObjectRecord, reason: str | None) -> None: ...
    def _movable(self, seg: Segment) -> bool: ...
    def unhold(self, seg: Segment) -> None: ...


class Tiers:
    """Eviction, restore, queue hints and pool targets of one :class:`~gfaas.dataplane.store.Store`.

    A component of the store (``store.tiers``), not a base class: it keeps its own state (the disk
    tier, demand trackers, hints, counters) and reaches the store's segments and objects through
    ``core``, the part of the store described by :class:`StoreCore`.
    """

    def __init__(self, core: StoreCore, config: NodeConfig, spill: SpillDir | None) -> None:
        """``core`` is the store; its ``devices`` must be set already."""
        self.core = core
        self.options = config.storage_options()
        self.spill = spill
        self.spilled: dict[int, Spilled] = {}
        self._seg_objs: dict[int, set[bytes]] = {}
        self.queues = QueueBook()  # where each invocation's functions wait (queue hints)
        # The host tier's floor is the warm cache's size; a GPU's is the pool floor of issue 5.
        self.demand: dict[int, DemandTracker] = {
            -1: DemandTracker(storage_policy(config.storage_policy, floor_bytes=config.warm_pool_bytes))}
        for k in self.core.devices:
            self.demand[k] = DemandTracker(storage_policy(config.storage_policy,
                                                          floor_bytes=config.device_pool_floor_bytes))
        self.host_target = config.warm_pool_bytes
        self.counters = {"evictions": 0, "restores": 0, "released_unread": 0, "migrations": 0,
                         "bytes_spilled": 0, "bytes_restored": 0, "queue_hints": 0, "spills": 0}
        self._unsettled = False
        self._next_retarget = -float("inf")
        self._next_change: float | None = None  # when a reservation expires (DemandTracker.next_change)
        self._next_expiry = float("inf")  # when a demand sample leaves its window
        self._seen: tuple[object, ...] = ()  # what the targets were last computed from (_inputs)
        self._away: set[int] = set()  # segments holding objects evicted from their GPU
        self.spill_error = ""
        # Invocations whose hint named finished functions (or whose objects were read since): look
        # among their objects for ones nobody will read. Only theirs: a hint never changes another's.
        self._recheck: set[str] = set()
        # Set by the daemon: runs a SpillJob's write off the event loop and later hands it to
        # finish_spill (under the daemon's lock). None: writes happen inline (tests, in-process).
        self.spill_runner: Callable[[SpillJob], None] | None = None
        self.spilling: dict[int, SpillJob] = {}  # segment id -> write in flight
        self.spilling_bytes = 0
        self.quotas: Quotas | None = None  # set by the store: spilled bytes count per invocation

    def _why_full(self) -> str:
        if self.spill_error:
            why, self.spill_error = self.spill_error, ""
            return f"eviction to disk failed ({why}), nothing was lost"
        if self.spill is None:
            return "there is no disk tier to evict to (spill_capacity_bytes=0)"
        stuck = sum(r.nbytes for r in self._host_residents() if r.pinned)
        return (f"{stuck} bytes cannot be evicted: readers hold views of them, they are being written,"
                " or they are slabs still open for small puts")

    def _device_alloc(self, device: int, nbytes: int, owner: str = "") -> Any:
        """A block of GPU ``device``'s pool; when the pool is at its cap, victims of
        :func:`plan_eviction` move to a peer GPU or to host memory (:func:`migration_target`) one
        at a time until the block fits (freed bytes need not be contiguous)."""
        dev = self.core.devices[device]
        try:
            return dev.alloc(nbytes, owner)
        except CapacityError:
            if nbytes > dev.pool.cap:
                raise
        order = plan_eviction(self._device_residents(device), dev.pool.cap, self.options)
        for r in order:
            seg = self.core.segments.get(r.key)  # type: ignore[call-overload]
            if seg is None or not self._evict_device(seg):
                continue
            try:
                return dev.alloc(nbytes, owner)
            except CapacityError:
                pass
        try:
            return dev.alloc(nbytes, owner)
        except CapacityError as exc:
            stuck = sum(r.nbytes for r in self._device_residents(device) if r.pinned)
            raise CapacityError(
                f"{exc} (after evicting what could move; {stuck} bytes are pinned by views or being written"
                f"{'; ' + self.spill_error if self.spill_error else ''})"
            ) from None

    def _demand_key(self, rec: ObjectRecord) -> str:
        workflow = self.core.registry.get(rec.invocation).workflow if rec.invocation in self.core.registry else ""
        return f"{workflow}/{rec.producer}"

    def _stored(self, rec: ObjectRecord, seg: Segment) -> None:
        tracker = self.demand.get(seg.home)
        if tracker is not None:
            tracker.stored(self._demand_key(rec), rec.nbytes, self.core.clock.now())

    def queue_hint(self, invocation_id: object, positions: Mapping[str, int], done: Iterable[str] = ()) -> None:
        """Where the functions of an invocation wait: ``positions[f]`` requests are ahead of ``f``
        in its queue (0: runs next, or is running now), a function missing from it is not queued
        (its objects are evicted first), and ``done`` functions will not run again (objects only
        they were left to read are released rather than spilled). Replaces the previous hint."""
        if not isinstance(invocation_id, str) or invocation_id not in self.core.registry:
            raise NotFound(
                f"queue hint for invocation {invocation_id!r}: no such open invocation on node"
                f" {self.core.config.node_id}; send hints between open_invocation and end_invocation"
            )
        done = list(done)
        self._check_hint(invocation_id, [*positions, *done])
        for f, p in positions.items():
            if not isinstance(p, int) or isinstance(p, bool) or p < 0:
                raise ConfigError(
                    f"queue hint for invocation {invocation_id}: position {p!r} of {f!r} is invalid;"
                    " give the number of requests ahead of it, an integer >= 0"
                )
        self._apply_hint(invocation_id, positions, done, None)

    def queue_state(self, entries: Iterable[tuple[str, Mapping[str, Ticket], Iterable[str], Iterable[str]]],
                    heads: Mapping[str, int]) -> int:
        """Many invocations' hints at once, the runtime's form (:class:`~gfaas.policy.storage.QueueBook`):
        each entry is ``(invocation, queued, running, done)``, ``queued[f] = (q, t)`` placing ``f`` at
        ticket ``t`` of queue ``q``, ``running`` functions at position 0, ``done`` as for
        :meth:`queue_hint`; ``heads[q]`` requests have left queue ``q``. An entry replaces its
        invocation's hint; one of an invocation not open here is skipped (it ended while the hint
        was on its way). Nothing is applied if any value is invalid. Returns the entries applied."""
        for q, n in heads.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ConfigError(f"queue state: head {n!r} of queue {q!r} is invalid; give the requests that"
                                  " have left the queue, an integer >= 0")
        applied = []
        for inv, queued, running, done in entries:
            if inv not in self.core.registry:
                continue
            running, done = list(running), list(done)
            self._check_hint(inv, [*queued, *running, *done])
            for f, (q, t) in queued.items():
                if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                    raise ConfigError(f"queue hint for invocation {inv}: ticket {t!r} of {f!r} in queue {q!r} is"
                                      " invalid; give the requests that entered the queue before it, an integer >= 0")
            applied.append((inv, queued, running, done))
        self.queues.advance(heads)
        for inv, queued, running, done in applied:
            self._apply_hint(inv, dict.fromkeys(running, 0), done, queued)
        return len(applied)

    def _check_hint(self, invocation_id: str, functions: list[str]) -> None:
        known = self.core.registry.get(invocation_id).functions
        for f in functions:
            if f not in known:
                raise ConfigError(
                    f"queue hint for invocation {invocation_id}: {f!r} is not one of its functions"
                    f" ({', '.join(known)})"
                )

    def _apply_hint(self, invocation_id: str, positions: Mapping[str, int], done: list[str],
                    tickets: Mapping[str, Ticket] | None) -> None:
        self.queues.hint(invocation_id, positions, done, tickets)
        self.counters["queue_hints"] += 1
        if done:
            self._recheck.add(invocation_id)
            self._unsettled = True

    def read(self, rec: ObjectRecord) -> None:
        """``rec`` was read and still has readers to come: if those are all done, it is not needed."""
        if self.queues.done(rec.invocation):
            self._recheck.add(rec.invocation)
            self._unsettled = True

    def forget(self, invocation_id: str) -> None:
        """The invocation ended: drop its queue hint."""
        self.queues.forget(invocation_id)
        self._recheck.discard(invocation_id)

    def resident(self, rec: ObjectRecord, device: int | None = None) -> Segment:
        """The segment holding ``rec`` in memory, restored first if it was evicted.

        From disk it always comes back (into host memory, overshooting the cap by this segment if
        need be, see :meth:`_reserve`); an object evicted from GPU ``k`` goes back to ``k`` when the
        reader wants it wherever it lives (``device`` None) or on ``k``, and ``k`` has room without
        evicting anything (else it is served from where it is). Only this object's copy runs here.
        """
        sp = self.spilled.get(rec.segment)
        if sp is not None:
            self._restore_spilled(sp, force=True)
        seg = self.core.segments[rec.segment]
        if seg.home >= 0 and seg.device != seg.home and device in (None, seg.home) and self.core._movable(seg):
            self._move_home(seg)
        return self.core.segments[rec.segment]

    def settle(self) -> None:
        """Work the get and free paths leave for later; the daemon runs it after each reply.

        Evicts down to the cap after a get restored past it, brings evicted objects back into
        freed memory (:func:`plan_restore`, disk to host and host or peer to their GPU), and moves
        each pool's target to what the :class:`DemandTracker` asks. Doing this after the reply is
        what keeps a get from ever waiting for somebody else's eviction or restore.
        """
        now = self.core.clock.now()
        if self._unsettled:
            self._unsettled = False
            self._rebalance()
        if (now >= self._next_retarget and self._retarget_due(now)) or (
                self._next_change is not None and now >= self._next_change):
            self._retarget(now)

    def _inputs(self) -> tuple[object, ...]:
        return (*(d.version for d in self.demand.values()), self.core.reserved, self.core.pooled_bytes)

    def _retarget_due(self, now: float) -> bool:
        """Whether the targets may have moved since they were computed: a demand event, bytes in use
        or pooled, a sample leaving its window (a reservation's end is ``_next_change``). A GPU's
        free memory moves with other processes, so with GPU pools they are recomputed on time."""
        return bool(self.core.devices) or now >= self._next_expiry or self._inputs() != self._seen

    def next_settle(self) -> float | None:
        """Clock time at which a pool target changes with no request arriving (a function's
        reservation expires): an idle daemon calls :meth:`settle` then, so memory goes back."""
        return self._next_change

    def _rebalance(self) -> None:
        if self._recheck:
            invs, self._recheck = self._recheck, set()
            self._release_unneeded(invs)
        cap = self.core.config.capacity_bytes
        if self.core.reserved - self.spilling_bytes > cap:
            self.core._evict_warm(0)
            if self.core.reserved - self.spilling_bytes > cap:
                self._make_host_room(self.core.reserved - self.spilling_bytes - cap)
        if self.options.restore:
            room = cap - self.core.reserved + self.core.pooled_bytes  # warm segments are reused or retired first
            if self.spilled and room > 0:
                spilled = [self._resident(sp.id, sp.size, [self.core.objects[o] for o in sp.objects], False)
                           for sp in self.spilled.values()]
                for r in plan_restore(spilled, room, self.options):
                    sp = self.spilled.get(r.key)  # type: ignore[call-overload]
                    if sp is None:
                        continue
                    try:
                        self._restore_spilled(sp, force=False)
                    except (CapacityError, DataLost) as exc:
                        log.warning("proactive restore stopped: %s", exc)
                        break
            for k, dev in self.core.devices.items():
                away = [g for g in (self.core.segments[i] for i in self._away) if g.home == k and g.live]
                if not away:
                    continue
                res = [self._resident(g.id, g.size, self._objs(g), not self.core._movable(g)) for g in away]
                for r in plan_restore(res, dev.pool.cap - dev.pool.used, self.options):
                    seg = self.core.segments.get(r.key)  # type: ignore[call-overload]
                    if seg is not None and not self._move_home(seg):
                        break

    def warm_limit(self, freeing: int = 0) -> int:
        """Bytes of freed large-object segments to keep warm: ``warm_pool_bytes`` always, and
        under ``elastic`` pooling more while the demand target leaves more above the bytes in use
        (a burst); nothing under ``none``. ``freeing``: bytes of a segment being freed, no longer
        in use.

        ``warm_pool_bytes`` is a floor of *warm* bytes, not of warm plus in-use bytes: with it
        counted against the bytes in use, a steady stream of 256 MiB objects with two in flight
        (512 MiB plus a slab, over a 512 MiB target) retired every freed segment, and each put
        then faulted in fresh memory and each get waited for the old segment's pages to be freed
        (9x slower puts, 300x slower gets; issue 12). Warm memory never blocks a put: the store
        retires it first when the cap is reached (:meth:`Store._reserve`).
        """
        wpb = self.core.config.warm_pool_bytes
        if self.options.pooling == "none" or wpb == 0:
            return 0
        if self.options.pooling != "elastic":
            return wpb
        return max(wpb, self.host_target - (self.core.reserved - self.core.pooled_bytes - freeing))

    def _retarget(self, now: float) -> None:
        elastic = self.options.pooling == "elastic"
        plans = {k: d.plan(now, self.core.devices[k].free_bytes() if k >= 0 and elastic else None)
                 for k, d in self.demand.items()}
        self.host_target = plans[-1].target
        limit = self.warm_limit()
        for seg in [g for warm in self.core._pool.values() for g in warm]:  # oldest first per workflow
            if self.core.pooled_bytes <= limit:
                break
            self.core._retire(seg)
        for k, dev in self.core.devices.items():
            if elastic:
                dev.pool.set_target(plans[k].target)
                dev.pool.prewarm(plans[k].largest_object)
            elif self.options.pooling == "none":
                dev.pool.set_target(0)
        self._next_retarget = now + RETARGET_S
        ends = [p.next_change for p in plans.values() if p.next_change is not None]
        self._next_change = max(min(ends), self._next_retarget) if ends else None
        self._next_expiry = min((p.next_expiry for p in plans.values() if p.next_expiry is not None),
                                default=float("inf"))
        self._seen = self._inputs()

    def _objs(self, seg: Segment) -> list[ObjectRecord]:
        return [self.core.objects[o] for o in self._seg_objs.get(seg.id, ())]

    def _resident(self, key: int, nbytes: int, objs: list[ObjectRecord], pinned: bool) -> Resident:
        """The policy's view of a segment (or spilled segment) and the objects in it."""
        position: int | None = None
        readers = 0
        inv, queue = "", None
        for rec in objs:
            if rec.invocation != inv:  # a segment's objects are all of one invocation, as a rule
                inv, queue = rec.invocation, self.queues.positions(rec.invocation)
            if rec.pending is None:
                readers += 1  # open to the whole invocation: somebody may still read it
                wanted: Iterable[str] = queue or ()
            else:
                readers += len(rec.pending - self.queues.done(rec.invocation))
                wanted = rec.pending
            p = positions_by_consumer(queue, wanted) if queue else None
            if p is not None and (position is None or p < position):
                position = p
        last = max((r.accessed for r in objs), default=0.0)
        return Resident(key, nbytes, last, position, readers, pinned)

    def _host_residents(self) -> list[Resident]:
        return [self._resident(g.id, g.size, self._objs(g), not self.core._movable(g))
                for g in self.core.segments.values() if g.device < 0 and g.live and not g.pooled]

    def _device_residents(self, device: int) -> list[Resident]:
        return [self._resident(g.id, g.size, self._objs(g), not self.core._movable(g))
                for g in self.core.segments.values() if g.device == device and g.live]

    def _make_host_room(self, need: int) -> None:
        """Evict :func:`plan_eviction`'s victims until ``need`` bytes are freed: objects nobody
        will read are released, the rest are written to disk (none without a disk tier)."""
        residents = self._host_residents()
        if self.spill is None:
            residents = [r for r in residents if r.readers_left <= 0]
        for r in plan_eviction(residents, need, self.options):
            seg = self.core.segments.get(r.key)  # type: ignore[call-overload]
            if seg is None:
                continue
            if r.readers_left <= 0 and self.options.release_unread:
                self._release_unread(seg)
            elif self.spill is not None:
                try:
                    if not self._spill(seg):
                        return
                except CapacityError as exc:
                    self.spill_error = str(exc)
                    log.warning("eviction to disk failed, the object stays in memory: %s", exc)
                    return

    def _release_unneeded(self, invocations: Iterable[str]) -> None:
        """Drop at once what :func:`unneeded` names among the objects of ``invocations``: those
        whose readers have all finished. O(their objects), not O(everything stored)."""
        mem: set[int] = set()
        disk: set[int] = set()
        for inv in invocations:
            for oid in self.core._by_inv.get(inv, ()):
                rec = self.core.objects.get(oid)
                if rec is not None:
                    (disk if rec.segment in self.spilled else mem).add(rec.segment)
        segs = [g for g in (self.core.segments.get(i) for i in sorted(mem)) if g is not None and g.live and not g.pooled]
        inmem = [self._resident(g.id, g.size, self._objs(g), not self.core._movable(g)) for g in segs]
        for key in unneeded(inmem, self.options):
            seg = self.core.segments.get(key)  # type: ignore[call-overload]
            if seg is not None:
                self._release_unread(seg)
        ondisk = [self._resident(sp.id, sp.size, [self.core.objects[o] for o in sp.objects], False)
                  for sp in (self.spilled[i] for i in sorted(disk) if i in self.spilled)]
        for key in unneeded(ondisk, self.options):
            sp = self.spilled.get(key)  # type: ignore[call-overload]
            if sp is not None:
                self.counters["released_unread"] += len(sp.objects)
                self._lose(sp, "none of its remaining consumers will read it")

    def _release_unread(self, seg: Segment) -> None:
        seg.recyclable = False  # its memory is wanted now, not as a warm segment
        for rec in self._objs(seg):
            self.counters["released_unread"] += 1
            self.core._free(rec, "none of its remaining consumers will read it")

    def _spill(self, seg: Segment) -> bool:
        """Write a host segment's objects to one file and give its memory back.

        The segment stays in memory and readable (``holds`` keeps it from being retired or chosen
        again) until :meth:`finish_spill`, and its bytes count as leaving. With a ``spill_runner``
        (the daemon) the write happens on a worker thread, so a put may take the tier over its cap
        by the writes in flight instead of waiting for the disk; without one it happens here.
        Returns False if the write failed (already reported by :meth:`finish_spill`); raises
        CapacityError, changing nothing, if the disk tier has no room.
        """
        assert self.spill is not None
        objs = self._objs(seg)
        length = max(r.offset + r.nbytes for r in objs)
        self.spill.check_room(length)
        view = self.core.backend.host_view(seg.handle)
        if view is None:  # a backend without a host mapping: copy out now, write later
            data = memoryview(bytearray(length))
            self.core.backend.copy_out(seg.handle, 0, length, data)
        else:
            data = view[:length]
        self.core._next_seg += 1
        job = SpillJob(seg, self.core._next_seg, data, view, frozenset(r.id for r in objs), length)
        seg.holds += 1
        self.spill.pending += length
        self.spilling[seg.id] = job
        self.spilling_bytes += seg.size
        if self.spill_runner is not None:
            self.spill_runner(job)
            return True
        try:
            self.spill.write_file(job.key, job.data)
        except CapacityError as exc:
            self.finish_spill(job, exc)
            return False
        self.finish_spill(job, None)
        return True

    def finish_spill(self, job: SpillJob, error: Exception | None) -> None:
        """The worker finished ``job``'s write (``error`` if it failed): give the segment's memory
        back, unless its objects changed or a client took a view of it meanwhile (then the file
        goes and the segment stays)."""
        assert self.spill is not None
        seg = job.seg
        del self.spilling[seg.id]
        self.spilling_bytes -= seg.size
        self.spill.pending -= job.length
        job.data.release()
        if job.view is not None:
            job.view.release()
        changed = seg.id not in self.core.segments or seg.pins or frozenset(r.id for r in self._objs(seg)) != job.objects
        if error is not None or changed:
            if error is not None:
                self.spill_error = str(error)
                log.warning("eviction to disk failed, the object stays in memory: %s", error)
            else:
                self.spill.discard(job.key)
            self._unsettled = True  # still over the cap, perhaps: settle picks other victims
            if seg.id in self.core.segments:
                self.core.unhold(seg)
            return
        self.spill.commit(job.key, job.length)
        seg.holds -= 1
        objs = self._objs(seg)
        sp = Spilled(job.key, seg.invocation, seg.workflow, seg.size, job.length, seg.home, seg.recyclable,
                     {r.id for r in objs})
        self.spilled[sp.id] = sp
        if self.quotas is not None:  # never refused: the eviction runs for whoever needed memory
            self.quotas.hold(("spill", sp.id), sp.invocation, SPILL, sp.length, check=False)
        for rec in objs:
            rec.segment = sp.id
        self.core.book.move(seg.device, DISK, sum(r.nbytes for r in objs), len(objs))
        self._seg_objs.pop(seg.id, None)
        seg.live = 0
        self.core._retire(seg)
        self.counters["evictions"] += len(objs)
        self.counters["spills"] += 1
        self.counters["bytes_spilled"] += job.length
        log.debug("evicted segment %d (%d objects, %d bytes) to disk", seg.id, len(objs), job.length)

    def _restore_spilled(self, sp: Spilled, force: bool) -> Segment:
        """Read a spilled segment back into host memory; its objects keep their offsets."""
        assert self.spill is not None
        seg = self.core._take_warm(sp.invocation, sp.size) or self.core._new_segment(
            sp.invocation, None, sp.size, "restore", force=force)
        view = self.core.backend.host_view(seg.handle)
        data = memoryview(bytearray(sp.length)) if view is None else view[:sp.length]
        try:
            self.spill.read_into(sp.id, data)
            if view is None:
                self.core.backend.copy_in(seg.handle, 0, data)
        except OSError as exc:
            self.core._retire(seg)
            self._lose(sp, f"lost: its spilled copy in {self.spill.path} could not be read: {exc}")
            raise DataLost(
                f"objects of segment {sp.id} were lost: the spilled copy in {self.spill.path} could not be"
                f" read ({exc}); re-run the functions that produced them"
            ) from None
        finally:
            data.release()
            if view is not None:
                view.release()
        seg.workflow, seg.recyclable, seg.home = sp.workflow, sp.recyclable, sp.home
        if seg.home >= 0:
            self._away.add(seg.id)
        moved = 0
        for oid in sp.objects:
            rec = self.core.objects[oid]
            rec.segment = seg.id
            moved += rec.nbytes
        self.core.book.move(DISK, seg.device, moved, len(sp.objects))
        self._seg_objs[seg.id] = set(sp.objects)
        seg.live = len(sp.objects)
        del self.spilled[sp.id]
        if self.quotas is not None:
            self.quotas.drop(("spill", sp.id))
        self.spill.remove(sp.id)
        self.counters["restores"] += len(sp.objects)
        self.counters["bytes_restored"] += sp.length
        return seg

    def _lose(self, sp: Spilled, reason: str) -> None:
        for oid in list(sp.objects):
            self.core._free(self.core.objects[oid], reason)

    def _repoint(self, old: Segment, new: Segment) -> None:
        """Move ``old``'s objects (copied already) to ``new`` and retire ``old``."""
        objs = self._objs(old)
        for rec in objs:
            rec.segment = new.id
            rec.event = b""  # the copy that moved it finished: nothing left to wait for
        self.core.book.move(old.device, new.device, sum(r.nbytes for r in objs), len(objs))
        self._seg_objs[new.id] = self._seg_objs.pop(old.id, set())
        new.live, old.live = old.live, 0
        new.home, new.workflow, new.invocation = old.home, old.workflow, old.invocation
        if new.home >= 0 and new.device != new.home:
            self._away.add(new.id)
        self.core._retire(old)

    def _copy_segment(self, src: Segment, dst: Segment, nbytes: int) -> None:
        """Copy the first ``nbytes`` of ``src`` into ``dst`` (host/GPU in any direction), in the
        caller's thread; a GPU source waits for its producers' events first."""
        for rec in self._objs(src):
            if rec.event and src.device >= 0:
                self.core.devices[src.device].wait_event(rec.event)
        if nbytes <= 0:
            return
        if src.device >= 0 and dst.device >= 0:
            self.core.devices[dst.device].transfer(src.handle, 0, dst.handle, 0, nbytes)
            return
        host, dev = (dst, src) if dst.device < 0 else (src, dst)
        view = self.core.backend.host_view(host.handle)
        data = memoryview(bytearray(nbytes)) if view is None else view[:nbytes]
        try:
            if dst.device < 0:
                self.core.devices[src.device].copy_out(src.handle, 0, nbytes, data)
                if view is None:
                    self.core.backend.copy_in(dst.handle, 0, data)
            else:
                if view is None:
                    self.core.backend.copy_out(src.handle, 0, nbytes, data)
                self.core.devices[dev.device].copy_in(dst.handle, 0, data)
        finally:
            data.release()
            if view is not None:
                view.release()

    def _evict_device(self, seg: Segment) -> bool:
        """Move a GPU segment to the peer :func:`migration_target` picks, or to host memory."""
        k = seg.device
        length = max(r.offset + r.nbytes for r in self._objs(seg))
        peers = [Peer(str(j), d.pool.cap - d.pool.used, self.core.devices[k].peer_link_gbps)
                 for j, d in self.core.devices.items() if j != k]
        dest = migration_target(seg.size, peers, self.core.devices[k].host_link_gbps, self.options)
        new: Segment | None = None
        if dest is not None:
            try:
                handle = self.core.devices[int(dest)].alloc(seg.size, seg.workflow)
            except CapacityError:
                pass  # fragmented: host memory instead
            else:
                new = self.core._add_segment(seg.invocation, None, handle, self.core.devices[int(dest)].size_of(handle),
                                        int(dest))
                self.counters["migrations"] += seg.live
        if new is None:
            try:
                new = self.core._new_segment(seg.invocation, None, seg.size, f"eviction from GPU {k}")
            except CapacityError as exc:
                self.spill_error = str(exc)
                return False
        new.open = False
        self._copy_segment(seg, new, length)
        self.counters["evictions"] += seg.live
        self._repoint(seg, new)
        return True

    def _move_home(self, seg: Segment) -> bool:
        """Bring a segment evicted from its GPU back there if the pool has room as it is."""
        k = seg.home
        try:
            handle = self.core.devices[k].alloc(seg.size, seg.workflow)
        except CapacityError:
            return False
        new = self.core._add_segment(seg.invocation, None, handle, self.core.devices[k].size_of(handle), k)
        new.open = False
        self._copy_segment(seg, new, max(r.offset + r.nbytes for r in self._objs(seg)))
        self.counters["restores"] += seg.live
        self._repoint(seg, new)
        return True

    def close(self) -> None:
        """Remove the disk tier's files (the daemon is going away; its objects go with it)."""
        if self.spill is not None:
            self.spill.close()
        self.spilled.clear()
