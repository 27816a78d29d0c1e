"""GPU memory of the simulated stores: capacity, pools, eviction, migration and restore (issue 6).

Every decision is taken by the pure policy the node daemon uses (``gfaas.policy.storage`` and
``gfaas.policy.pooling``); this module only supplies the facts (sizes, queue positions, free room,
link speeds) and the physics (transfers through the simulated data plane, time).

Model, per GPU:

- A *store* with a capacity: ``storage_fraction`` x the GPU's memory (the topology's
  ``memory_bytes``, else :data:`DEFAULT_GPU_MEMORY`), or an absolute ``storage_bytes``. Its memory is
  a :class:`~gfaas.policy.PoolModel` capped at the capacity; a put costs ``raw_calls`` x
  ``CUDA_MALLOC_S`` when the pool had to go to the driver, else ``POOL_ALLOC_S``. A chunked
  (GMLake-like) pool also makes the consumer open one IPC handle per chunk (:data:`IPC_CHUNK_S`).
- A :class:`~gfaas.policy.DemandTracker` fed with the GPU's function requests, its executions'
  stored bytes and their releases; the elastic pool's target is recomputed on each of those events
  and again when the tracker says a reservation expires (``next_change``).
- Intermediate objects stay until their consumer has read them. When a put finds no room,
  :func:`~gfaas.policy.plan_eviction` picks victims (the incoming object is a candidate too: under
  queue-aware eviction a new object whose consumer is furthest back goes straight to host memory).
  A victim moves to a peer GPU chosen by :func:`~gfaas.policy.migration_target` or to host memory,
  as a simulated transfer; a consumer that asks meanwhile waits for it to land, then reads it from
  where it now is. When room comes back, :func:`~gfaas.policy.plan_restore` picks the objects to
  bring home, again as transfers, off any function's critical path.

Approximation: an evicted object's GPU memory counts as free as soon as its migration starts (the
copy-out is simulated for its bandwidth and for readers, not for the memory it still holds).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from ..errors import CapacityError, ConfigError
from ..policy import (
    DemandTracker,
    Grant,
    Peer,
    PoolModel,
    Resident,
    StorageOptions,
    migration_target,
    plan_eviction,
    plan_restore,
)
from ..topology import Topology
from .kernel import Simulator
from .systems import CUDA_MALLOC_S, POOL_ALLOC_S

log = logging.getLogger(__name__)

#: GPU memory assumed when the topology does not give one: a V100-32GB.
DEFAULT_GPU_MEMORY = 32 * 2**30
#: Opening one 2 MiB chunk's IPC handle in a chunked (GMLake-like) pool. Seed 000 §7.1 reports up to
#: 45 ms of IPC per object; our largest intermediate object (8 1080p frames, 49.8 MB) is 24 chunks,
#: so 45 ms / 24 = 1.9 ms per chunk.
IPC_CHUNK_S = 0.045 / 24

#: How far ahead the deadline of a background move (eviction, restore) lies: it only gets the
#: bandwidth SLO-aware sharing leaves over once functions' own transfers have theirs (our choice).
BACKGROUND_SLACK_S = 1.0

#: ``move(src, dst, nbytes, on_done, deadline)``: a transfer through the simulated data plane.
Mover = Callable[[str, str, int, Callable[[], None], float], None]


@dataclass(eq=False)
class StoredObject:
    """One intermediate object: where it lives, who reads it, and what holds its memory."""

    key: Hashable
    nbytes: int
    home: str  # the GPU whose store it belongs to
    producer_fn: str
    execution: Hashable  # the producing execution (its objects are released together)
    consumer_gpu: str | None  # None: a CPU function reads it
    consumer_key: Hashable  # the consumer's entry in its GPU's queue
    stored_at: float
    request_arrival: float | None = None  # when the request arrived (GPUs serve the oldest first)
    where: str = ""
    holder: str | None = None  # the GPU whose pool holds its bytes now (None: host memory)
    handle: int | None = None
    share_units: int = 1
    moving: bool = False
    pinned: bool = False
    readers_left: int = 1
    waiters: list[Callable[[], None]] = field(default_factory=list)


@dataclass
class Sample:
    time: float
    reserved: int
    live: int


class GpuStore:
    """One GPU's store: pool, demand tracker, residents and the objects spilled from it."""

    def __init__(self, name: str, capacity: int, options: StorageOptions) -> None:
        self.name = name
        self.capacity = capacity
        self.options = options
        self.pool = PoolModel(options, capacity)
        self.tracker = DemandTracker(options)
        self.residents: dict[Hashable, StoredObject] = {}  # bytes held in this GPU's pool
        self.spilled: dict[Hashable, StoredObject] = {}  # home here, bytes elsewhere
        self.live_per_execution: dict[Hashable, int] = {}
        self.timeline: list[Sample] = []
        self.wake_at: float | None = None

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.pool.live_bytes

    def sample(self, now: float) -> None:
        s = Sample(now, self.pool.reserved_bytes, self.pool.live_bytes)
        if self.timeline and self.timeline[-1].reserved == s.reserved and self.timeline[-1].live == s.live:
            return
        if self.timeline and self.timeline[-1].time == now:
            self.timeline[-1] = s
        else:
            self.timeline.append(s)


@dataclass
class MemoryStats:
    alloc_s: list[float] = field(default_factory=list)  # per put: allocation cost paid
    ipc_s: list[float] = field(default_factory=list)  # per get: IPC opens paid
    evictions: int = 0
    to_peer: int = 0
    direct_to_host: int = 0  # puts that went straight to host memory
    restores: int = 0
    host_reads: int = 0  # gets served from host memory


class MemoryModel:
    """The GPU stores of a cluster under one :class:`~gfaas.policy.StorageOptions`."""

    def __init__(self, sim: Simulator, topo: Topology, options: StorageOptions, capacity: Callable[[str], int],
                 move: Mover, queue_positions: Callable[[str], Callable[[Hashable, float | None], int | None]]) -> None:
        self.sim = sim
        self.topo = topo
        self.options = options
        self._move = move
        self._positions = queue_positions
        self.stores = {g: GpuStore(g, capacity(g), options) for g in topo.gpus}
        self.objects: dict[Hashable, StoredObject] = {}
        self.stats = MemoryStats()
        self._host_gbps = {g: max((e.gbps for e in topo.out_edges(g) if topo.device(e.dst).kind == "pcie"),
                                  default=0.0) for g in topo.gpus}
        for s in self.stores.values():
            s.pool.tick(0.0, s.tracker.target(0.0))
            s.sample(0.0)

    # ---- demand -------------------------------------------------------------------------------
    def requested(self, gpu: str, function: str) -> None:
        """A request for ``function`` reached ``gpu``: its reservation is (re)activated."""
        s = self.stores[gpu]
        s.tracker.request(function, self.sim.now)
        self._retarget(s)

    def _retarget(self, s: GpuStore) -> None:
        now = self.sim.now
        if s.options.pooling == "elastic":
            s.pool.tick(now, s.tracker.target(now), s.tracker.largest_object(now))
            nxt = s.tracker.next_change(now)
            if nxt is not None and (s.wake_at is None or nxt < s.wake_at or s.wake_at <= now):
                s.wake_at = max(nxt, now) + 1e-9
                self.sim.at(s.wake_at, self._wake, s)
        elif s.options.pooling == "periodic":
            # The reclaim is due every interval whatever happens in between; waking once per
            # interval while something is cached is enough for the pool to apply it on time.
            s.pool.tick(now)
            if s.pool.reserved_bytes > s.pool.live_bytes and (s.wake_at is None or s.wake_at <= now):
                s.wake_at = now + s.options.reclaim_interval_s
                self.sim.at(s.wake_at, self._wake, s)
        s.sample(now)

    def _wake(self, s: GpuStore) -> None:
        if s.wake_at is not None and self.sim.now < s.wake_at:
            return  # a later wake-up superseded this one
        s.wake_at = None
        self._retarget(s)
        self._restore(s)

    # ---- put ------------------------------------------------------------------------------------
    def put(self, key: Hashable, nbytes: int, home: str, producer_fn: str, execution: Hashable,
            consumer_gpu: str | None, consumer_key: Hashable, producer_gpu: str,
            request_arrival: float | None = None) -> tuple[StoredObject, float]:
        """Store one object on ``home``; returns it and the allocation time the put waits for.

        ``request_arrival`` lets the policy see where a consumer that is not queued yet will stand:
        behind every queued execution of an older request (GPUs run the oldest request first).
        When the store has room, ``obj.where`` is ``home`` and the put copies it there. When the
        eviction policy picks the incoming object itself, it is migrated to host memory from the
        producer's GPU like any victim, in the background (``obj.moving``), and the put is done.
        """
        if key in self.objects:
            raise ConfigError(f"object {key!r} is stored twice; keys must be unique per request and edge")
        s = self.stores[home]
        now = self.sim.now
        obj = StoredObject(key, nbytes, home, producer_fn, execution, consumer_gpu, consumer_key, now,
                           request_arrival)
        self.objects[key] = obj
        cost = 0.0
        grant = self._make_room(s, obj)
        if grant is None:
            s.spilled[key] = obj
            obj.where = producer_gpu
            dest = self._place_elsewhere(s, obj, allow_peer=True)
            if dest == self.topo.host_of(self.topo.device(home).node):
                self.stats.direct_to_host += 1
            self._transfer(obj, producer_gpu, dest)
        else:
            obj.where, obj.holder, obj.handle, obj.share_units = home, home, grant.handle, grant.share_units
            s.residents[key] = obj
            cost = grant.raw_calls * CUDA_MALLOC_S if grant.raw_calls else POOL_ALLOC_S
        self.stats.alloc_s.append(cost)
        s.live_per_execution[execution] = s.live_per_execution.get(execution, 0) + 1
        s.sample(now)  # the demand histograms change at stored(), once per execution
        return obj, cost

    def stored(self, home: str, producer_fn: str, nbytes: int) -> None:
        """One execution of ``producer_fn`` finished storing ``nbytes`` on ``home``."""
        s = self.stores[home]
        s.tracker.stored(producer_fn, nbytes, self.sim.now)
        self._retarget(s)

    def _resident(self, obj: StoredObject, positions: dict[str | None, Callable[[Hashable, float | None], int | None]],
                  ) -> Resident:
        pos = None
        if obj.consumer_gpu is not None:
            f = positions.get(obj.consumer_gpu)
            if f is None:
                f = positions[obj.consumer_gpu] = self._positions(obj.consumer_gpu)
            pos = f(obj.consumer_key, obj.request_arrival)
        return Resident(obj.key, obj.nbytes, obj.stored_at, pos, obj.readers_left, obj.pinned or obj.moving)

    def _make_room(self, s: GpuStore, incoming: StoredObject) -> Grant | None:
        """A pool grant for ``incoming``, evicting victims first if needed; None: it goes to host."""
        now = self.sim.now
        positions: dict[str | None, Callable[[Hashable, float | None], int | None]] = {}
        while True:
            try:
                return s.pool.alloc(incoming.nbytes, now)
            except CapacityError:
                pass
            cands = [self._resident(o, positions) for o in s.residents.values()]
            cands.append(self._resident(incoming, positions))
            need = max(incoming.nbytes - s.free_bytes, 1)
            plan = plan_eviction(cands, need, s.options)
            if not plan or plan[0].key == incoming.key:
                return None
            self._evict(s, s.residents[plan[0].key], allow_peer=True)

    # ---- eviction and restore -------------------------------------------------------------------
    def _evict(self, s: GpuStore, obj: StoredObject, allow_peer: bool) -> None:
        now = self.sim.now
        src = obj.where
        assert obj.handle is not None
        s.pool.free(obj.handle, now)
        del s.residents[obj.key]
        obj.handle = obj.holder = None
        self.stats.evictions += 1
        target = self._place_elsewhere(s, obj, allow_peer)
        self.stores[obj.home].spilled[obj.key] = obj
        self._transfer(obj, src, target)
        s.sample(now)

    def _place_elsewhere(self, s: GpuStore, obj: StoredObject, allow_peer: bool) -> str:
        """Where an object leaving ``s`` goes: a peer GPU's store (its memory taken there) or host.

        Only an object leaving its home store may go to a peer; a guest evicted from a peer goes to
        host memory, so an object never hops from peer to peer.
        """
        now = self.sim.now
        dest = None
        if allow_peer and obj.home == s.name:
            node = self.topo.device(s.name).node
            peers = [Peer(g, self.stores[g].free_bytes, self.topo.nvlink_gbps(s.name, g))
                     for g in self.topo.of_kind("gpu", node) if g != s.name]
            dest = migration_target(obj.nbytes, peers, self._host_gbps[s.name], s.options)
        if dest is not None:
            peer = self.stores[dest]
            try:
                g = peer.pool.alloc(obj.nbytes, now)
            except CapacityError:
                dest = None
            else:
                obj.holder, obj.handle, obj.share_units = dest, g.handle, g.share_units
                peer.residents[obj.key] = obj
                self.stats.to_peer += 1
                peer.sample(now)
        return dest if dest is not None else self.topo.host_of(self.topo.device(s.name).node)

    def _transfer(self, obj: StoredObject, src: str, dst: str) -> None:
        obj.moving = True

        def landed() -> None:
            obj.moving = False
            obj.where = dst
            waiters, obj.waiters = obj.waiters, []
            for w in waiters:
                w()

        self._move(src, dst, obj.nbytes, landed, self.sim.now + BACKGROUND_SLACK_S)

    def settle(self, key: Hashable) -> None:
        """The producer's copy of ``key`` to where it was put has landed: it may move and be read."""
        obj = self.objects.get(key)
        if obj is None or not obj.moving:
            return
        obj.moving = False
        waiters, obj.waiters = obj.waiters, []
        for w in waiters:
            w()

    def _restore(self, s: GpuStore) -> None:
        if not s.options.restore or not s.spilled:
            return
        positions: dict[str | None, Callable[[Hashable, float | None], int | None]] = {}
        cands = [self._resident(o, positions) for o in s.spilled.values() if not o.moving and not o.pinned]
        now = self.sim.now
        for r in plan_restore(cands, s.free_bytes, s.options):
            obj = s.spilled[r.key]
            try:
                g = s.pool.alloc(obj.nbytes, now)
            except CapacityError:
                continue
            src, old_holder, old_handle = obj.where, obj.holder, obj.handle
            if old_holder is not None and old_handle is not None:  # it was a guest on a peer
                peer = self.stores[old_holder]
                peer.pool.free(old_handle, now)
                del peer.residents[obj.key]
                peer.sample(now)
            del s.spilled[obj.key]
            obj.holder, obj.handle, obj.share_units = s.name, g.handle, g.share_units
            s.residents[obj.key] = obj
            self.stats.restores += 1
            self._transfer(obj, src, s.name)
        s.sample(now)

    # ---- get and release --------------------------------------------------------------------------
    def fetch(self, key: Hashable, dst: str, then: Callable[[], None], deadline: float) -> None:
        """Copy object ``key`` to GPU ``dst`` (waiting for a migration in flight), then release it."""
        obj = self.objects[key]
        if obj.moving:
            obj.waiters.append(lambda: self.fetch(key, dst, then, deadline))
            return
        obj.pinned = True
        ipc = obj.share_units * IPC_CHUNK_S if self.options.pooling == "chunked" and obj.holder else 0.0
        self.stats.ipc_s.append(ipc)
        if self.topo.device(obj.where).kind == "host":
            self.stats.host_reads += 1

        def done() -> None:
            obj.pinned = False
            self.consume(key)
            then()

        def go() -> None:
            self._move(obj.where, dst, obj.nbytes, done, deadline)

        self.sim.schedule(ipc, go)

    def where(self, key: Hashable) -> str:
        return self.objects[key].where

    def consume(self, key: Hashable) -> None:
        """One reader is done with ``key``; the last one frees its memory (and maybe restores others)."""
        obj = self.objects[key]
        obj.readers_left -= 1
        if obj.readers_left > 0:
            return
        now = self.sim.now
        del self.objects[key]
        home = self.stores[obj.home]
        home.spilled.pop(key, None)
        freed: GpuStore | None = None
        if obj.holder is not None and obj.handle is not None:
            freed = self.stores[obj.holder]
            freed.pool.free(obj.handle, now)
            del freed.residents[key]
            obj.handle = obj.holder = None
        left = home.live_per_execution[obj.execution] - 1
        if left:
            home.live_per_execution[obj.execution] = left
            home.sample(now)
        else:
            del home.live_per_execution[obj.execution]
            home.tracker.released(obj.producer_fn, now)
            self._retarget(home)
        if freed is not None:
            if freed is not home:
                freed.sample(now)
            self._restore(freed)

    # ---- views ------------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise if any store's books are inconsistent (used by the tests after every step)."""
        for s in self.stores.values():
            live = sum(o.nbytes for o in s.residents.values())
            if s.pool.live_bytes > s.capacity or s.pool.reserved_bytes > s.capacity:
                raise CapacityError(f"{s.name}: {s.pool.reserved_bytes} bytes reserved over its cap {s.capacity}")
            if s.pool.reserved_bytes < s.pool.live_bytes or s.pool.live_bytes < live:
                raise CapacityError(f"{s.name}: books disagree: reserved {s.pool.reserved_bytes}, "
                                    f"live {s.pool.live_bytes}, objects {live}")


def queue_position(arrivals: list[tuple[float, int]], mine: tuple[float, int] | None) -> int | None:
    """How many entries of the sorted ``arrivals`` run before ``mine`` (None: not queued)."""
    if mine is None:
        return None
    return bisect.bisect_left(arrivals, mine)
