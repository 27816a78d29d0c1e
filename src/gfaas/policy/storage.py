"""Elastic storage policy: how much memory a store keeps, what leaves it first, what comes back.

Seeds 000 §7 and 001 §4.4 size a GPU store by *demand* rather than by history: every function
contributes a reservation while it is being called, and the store keeps the sum of the live
reservations (never less than a small floor, never more than a fraction of the memory the device
has free). When the store is over budget, objects leave in the order their readers will need them
last; when room comes back, the ones needed soonest return before anybody asks.

Everything here is a pure decision: callers pass the time (``now``) and the facts (sizes, queue
positions, free memory, link speeds) and get back numbers or orderings. The node daemon and the
simulator both call these same objects.

Terms used below:

- **R_window**: the 99th percentile of the gaps between a function's requests. While the last
  request is younger than that, the function counts as active and its reservation stays.
- **R_size**: the 99th percentile of the bytes one execution of the function stores.
- **R_con**: the 99th percentile of how many of the function's executions have data in the store at
  once (accumulation, e.g. when its consumers queue up behind a burst).
- reservation = R_size x R_con; pool target = clamp(sum of active reservations, floor, cap).
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ..errors import ConfigError

MB = 10**6

#: How a store picks victims: by consumer queue position (the papers) or least recently used.
Eviction = Literal["queue", "lru"]
#: How a store keeps memory between objects (the allocators of 000 Fig. 16).
Pooling = Literal["elastic", "caching", "periodic", "chunked", "none"]


@dataclass(frozen=True)
class StorageOptions:
    """One storage policy: the papers' elastic store, or one of the baselines it is compared with.

    Attributes:
        pooling: ``elastic`` (demand-sized pool), ``caching`` (keeps every block it ever allocated,
            as PyTorch's caching allocator), ``periodic`` (caching, but returns every free block each
            ``reclaim_interval_s``), ``chunked`` (GMLake-like: fixed ``chunk_bytes`` chunks, never
            returned) or ``none`` (a raw allocation per object).
        eviction: ``queue`` (furthest-back consumer first) or ``lru`` (least recently used first).
        restore: bring evicted objects back, soonest consumer first, when memory frees up.
        release_unread: drop objects nobody is left to read at once instead of keeping them.
        migrate_peers: evict to another device with room and a link faster than the host's first.
        floor_bytes: the least the elastic pool keeps while memory is plentiful (300 MB in the papers).
        cap_fraction: the most the store may hold, as a fraction of the device's free memory
            (0.5 in seed 001).
        window_s: how far back the histograms look.
        max_samples: most samples kept per histogram (the oldest go first).
        quantile: the percentile of each histogram (0.99 in the papers).
        default_window_s: R_window of a function seen fewer than two times.
        max_window_s: the longest R_window allowed (a function called once a day should not pin
            its reservation all day).
        reclaim_interval_s: the period of ``periodic`` pooling.
        chunk_bytes: the chunk of ``chunked`` pooling (2 MiB, the GPU page size).
    """

    pooling: Pooling = "elastic"
    eviction: Eviction = "queue"
    restore: bool = True
    release_unread: bool = True
    migrate_peers: bool = True
    floor_bytes: int = 300 * MB
    cap_fraction: float = 0.5
    window_s: float = 600.0
    max_samples: int = 512
    quantile: float = 0.99
    default_window_s: float = 60.0
    max_window_s: float = 600.0
    reclaim_interval_s: float = 0.0
    chunk_bytes: int = 2 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.pooling not in ("elastic", "caching", "periodic", "chunked", "none"):
            raise ConfigError(f"pooling={self.pooling!r}: use elastic, caching, periodic, chunked or none")
        if self.eviction not in ("queue", "lru"):
            raise ConfigError(f"eviction={self.eviction!r}: use queue or lru")
        if self.floor_bytes < 0:
            raise ConfigError(f"floor_bytes={self.floor_bytes} must be >= 0")
        if not 0.0 < self.cap_fraction <= 1.0:
            raise ConfigError(f"cap_fraction={self.cap_fraction} must be in (0, 1]")
        if not 0.0 < self.quantile <= 1.0:
            raise ConfigError(f"quantile={self.quantile} must be in (0, 1]")
        for name in ("window_s", "default_window_s", "max_window_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be > 0 seconds")
        if self.max_samples < 1:
            raise ConfigError(f"max_samples={self.max_samples} must be >= 1")
        if self.pooling == "periodic" and not self.reclaim_interval_s > 0:
            raise ConfigError("periodic pooling needs reclaim_interval_s > 0 (e.g. 60 for every minute)")
        if self.chunk_bytes <= 0:
            raise ConfigError(f"chunk_bytes={self.chunk_bytes} must be > 0")


#: The papers' store and its baselines (001 Fig. 18, 000 Fig. 15b/16), by name.
STORAGE_POLICIES: dict[str, StorageOptions] = {
    "gfaas": StorageOptions(),
    "queue-no-restore": StorageOptions(restore=False),
    "lru": StorageOptions(eviction="lru", restore=False, migrate_peers=False),
    "no-migration": StorageOptions(restore=False, migrate_peers=False),
    "caching": StorageOptions(pooling="caching"),
    "reclaim-1h": StorageOptions(pooling="periodic", reclaim_interval_s=3600.0),
    "reclaim-10min": StorageOptions(pooling="periodic", reclaim_interval_s=600.0),
    "reclaim-1min": StorageOptions(pooling="periodic", reclaim_interval_s=60.0),
    "gmlake": StorageOptions(pooling="chunked"),
    "no-pool": StorageOptions(pooling="none"),
}


def storage_policy(name: str, **overrides: object) -> StorageOptions:
    """A named policy from :data:`STORAGE_POLICIES`, with fields overridden by keyword."""
    if name not in STORAGE_POLICIES:
        raise ConfigError(f"unknown storage policy {name!r}; choose one of {', '.join(STORAGE_POLICIES)}")
    try:
        return replace(STORAGE_POLICIES[name], **overrides)  # type: ignore[arg-type]
    except TypeError as e:
        raise ConfigError(f"storage policy {name!r}: {e}; fields are those of StorageOptions") from None


# ---- histograms ------------------------------------------------------------------------------
class SlidingQuantile:
    """Samples from the last ``window_s`` seconds (at most ``max_samples``) and their quantile.

    The quantile is the nearest-rank one (the smallest sample with at least ``q`` of the samples at
    or below it), so it is always a value that was observed. The samples are kept sorted as they
    come and go (a binary search and a move of at most ``max_samples`` references each), so a
    quantile is a lookup, not a sort.
    """

    def __init__(self, window_s: float, max_samples: int) -> None:
        self.window_s = window_s
        self.max_samples = max_samples
        self._samples: deque[tuple[float, float]] = deque()
        self._sorted: list[float] = []

    def add(self, now: float, value: float) -> None:
        self._expire(now)
        if len(self._samples) >= self.max_samples:
            self._drop_oldest()
        self._samples.append((now, value))
        bisect.insort(self._sorted, value)

    def __len__(self) -> int:
        return len(self._samples)

    def quantile(self, q: float, now: float) -> float | None:
        """The ``q`` quantile of the samples still in the window, or None if there are none."""
        self._expire(now)
        if not self._samples:
            return None
        k = max(1, math.ceil(q * len(self._sorted)))
        return self._sorted[k - 1]

    def next_expiry(self) -> float | None:
        """When the oldest sample leaves the window (the quantile may change then), or None."""
        return self._samples[0][0] + self.window_s if self._samples else None

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        while self._samples and self._samples[0][0] < horizon:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, v = self._samples.popleft()
        del self._sorted[bisect.bisect_left(self._sorted, v)]


@dataclass(frozen=True)
class Reservation:
    """What one function asks of the store right now."""

    function: str
    r_window_s: float
    r_size: int
    r_con: int
    last_request: float
    active: bool

    @property
    def nbytes(self) -> int:
        return self.r_size * self.r_con


class _FnDemand:
    def __init__(self, o: StorageOptions) -> None:
        self.intervals = SlidingQuantile(o.window_s, o.max_samples)
        self.sizes = SlidingQuantile(o.window_s, o.max_samples)
        self.concurrency = SlidingQuantile(o.window_s, o.max_samples)
        self.last_request: float | None = None
        self.live = 0  # executions whose data is in the store now


class DemandTracker:
    """Per-function R_window, R_size and R_con, and the pool target they add up to.

    Callers report three events, each with the time it happened: :meth:`request` when a request
    for a function arrives, :meth:`stored` when one execution has put its data, :meth:`released`
    when that data has left the store (read by everyone, deleted, or evicted for good).
    """

    def __init__(self, options: StorageOptions | None = None) -> None:
        self.options = options or StorageOptions()
        self._fns: dict[str, _FnDemand] = {}
        self.version = 0  # counts the events reported: a plan made at the same version (and time) is the same

    def _fn(self, function: str) -> _FnDemand:
        d = self._fns.get(function)
        if d is None:
            d = self._fns[function] = _FnDemand(self.options)
        return d

    def request(self, function: str, now: float) -> None:
        self.version += 1
        d = self._fn(function)
        if d.last_request is not None and now >= d.last_request:
            d.intervals.add(now, now - d.last_request)
        d.last_request = now if d.last_request is None else max(now, d.last_request)

    def stored(self, function: str, nbytes: int, now: float) -> None:
        if nbytes < 0:
            raise ConfigError(f"stored {nbytes} bytes for {function!r}: sizes must be >= 0")
        self.version += 1
        d = self._fn(function)
        if d.last_request is None:  # data without a request we saw: count it as one
            d.last_request = now
        d.live += 1
        d.sizes.add(now, nbytes)
        d.concurrency.add(now, d.live)

    def released(self, function: str, now: float) -> None:
        del now  # kept for symmetry: a release changes no histogram
        d = self._fns.get(function)
        if d is not None and d.live > 0:
            d.live -= 1
            self.version += 1

    def reservation(self, function: str, now: float) -> Reservation:
        o = self.options
        d = self._fns.get(function)
        if d is None or d.last_request is None:
            return Reservation(function, o.default_window_s, 0, 0, -math.inf, False)
        gap = d.intervals.quantile(o.quantile, now)
        window = o.default_window_s if gap is None else min(max(gap, 1e-9), o.max_window_s)
        size = d.sizes.quantile(o.quantile, now)
        con = d.concurrency.quantile(o.quantile, now)
        r_size = int(size) if size is not None else 0
        r_con = max(int(con), 1) if con is not None else 0
        active = now - d.last_request <= window
        return Reservation(function, window, r_size, r_con, d.last_request, active)

    def reservations(self, now: float) -> list[Reservation]:
        return [self.reservation(f, now) for f in sorted(self._fns)]

    def demand(self, now: float) -> int:
        """Sum of the active reservations (no floor, no cap)."""
        return sum(r.nbytes for r in self.reservations(now) if r.active)

    def target(self, now: float, free_bytes: int | None = None) -> int:
        """The pool size to keep: demand, raised to the floor, then capped by free memory."""
        return pool_target(self.demand(now), free_bytes, self.options)

    def largest_object(self, now: float) -> int:
        """The largest R_size among active functions: what pre-warmed arenas should hold."""
        return max((r.r_size for r in self.reservations(now) if r.active), default=0)

    def next_change(self, now: float) -> float | None:
        """When the earliest active reservation expires (re-evaluate the target then), or None."""
        ends = [r.last_request + r.r_window_s for r in self.reservations(now) if r.active and r.nbytes > 0]
        return min(ends) if ends else None

    def plan(self, now: float, free_bytes: int | None = None) -> DemandPlan:
        """:meth:`target`, :meth:`largest_object` and :meth:`next_change` from one pass over the
        reservations, and when a histogram's oldest sample leaves its window (a quantile may move
        then with no event): all an executor needs to re-evaluate only when something changed."""
        active = [r for r in self.reservations(now) if r.active]
        ends = [r.last_request + r.r_window_s for r in active if r.nbytes > 0]
        expiries = [t for d in self._fns.values() for h in (d.intervals, d.sizes, d.concurrency)
                    if (t := h.next_expiry()) is not None]
        return DemandPlan(pool_target(sum(r.nbytes for r in active), free_bytes, self.options),
                          max((r.r_size for r in active), default=0), min(ends) if ends else None,
                          min(expiries) if expiries else None)


@dataclass(frozen=True)
class DemandPlan:
    """A :class:`DemandTracker`'s answers at one time (:meth:`DemandTracker.plan`): ``target``, the pool
    size to keep; ``largest_object``, the largest active R_size; ``next_change``, when the earliest
    active reservation expires; ``next_expiry``, when the oldest sample leaves its window (None: no
    reservation, no sample)."""

    target: int
    largest_object: int
    next_change: float | None
    next_expiry: float | None


def pool_target(demand: int, free_bytes: int | None, options: StorageOptions) -> int:
    """``max(demand, floor)`` capped at ``cap_fraction`` of ``free_bytes`` (no cap if None).

    When the cap is below the floor memory is scarce, and the cap wins: the floor is for idle
    periods on a device with room to spare (001 §4.4.1).
    """
    if demand < 0:
        raise ConfigError(f"demand={demand} bytes must be >= 0")
    want = max(demand, options.floor_bytes)
    if free_bytes is None:
        return want
    if free_bytes < 0:
        raise ConfigError(f"free_bytes={free_bytes} must be >= 0")
    return min(want, int(options.cap_fraction * free_bytes))


# ---- eviction, release, restore --------------------------------------------------------------
@dataclass(frozen=True)
class Resident:
    """One stored object as the eviction policy sees it.

    ``position`` is how many requests wait ahead of the object's (earliest) consumer in that
    consumer's queue: 0 means it runs next. None means no consumer is queued yet, which puts the
    object behind every queued one. ``readers_left`` is how many declared consumers have still to
    read it; 0 means nobody will. ``pinned`` objects are being read or written and cannot move.
    """

    key: Hashable
    nbytes: int
    last_access: float
    position: int | None = None
    readers_left: int = 1
    pinned: bool = False


def _position_key(r: Resident) -> float:
    return math.inf if r.position is None else float(r.position)


def unneeded(residents: Iterable[Resident], options: StorageOptions) -> list[Hashable]:
    """Objects to drop at once: nobody is left to read them (only if ``release_unread``)."""
    if not options.release_unread:
        return []
    return [r.key for r in residents if r.readers_left <= 0 and not r.pinned]


def eviction_order(residents: Iterable[Resident], options: StorageOptions) -> list[Resident]:
    """Movable objects, first victim first.

    ``queue``: the consumer furthest back goes first (no consumer queued counts as furthest); among
    equals the most recently stored goes first, since its request arrived last. ``lru``: the least
    recently used goes first.
    """
    movable = [r for r in residents if not r.pinned]
    if options.eviction == "lru":
        return sorted(movable, key=lambda r: (r.last_access, str(r.key)))
    return sorted(movable, key=lambda r: (-_position_key(r), -r.last_access, str(r.key)))


def plan_eviction(residents: Iterable[Resident], need_bytes: int, options: StorageOptions) -> list[Resident]:
    """The victims, in order, that free at least ``need_bytes`` (all movable ones if they cannot).

    Objects nobody will read are taken first when ``release_unread`` is on (they cost nothing to
    lose); the rest follow :func:`eviction_order`.
    """
    if need_bytes <= 0:
        return []
    pool = list(residents)
    drop = set(unneeded(pool, options))
    first = [r for r in pool if r.key in drop]
    order = first + [r for r in eviction_order(pool, options) if r.key not in drop]
    out: list[Resident] = []
    freed = 0
    for r in order:
        if freed >= need_bytes:
            break
        out.append(r)
        freed += r.nbytes
    return out


def plan_restore(spilled: Iterable[Resident], free_bytes: int, options: StorageOptions) -> list[Resident]:
    """Evicted objects to bring back into ``free_bytes``, soonest consumer first.

    Greedy in consumer order: an object that does not fit is skipped and smaller ones behind it
    may still come back. Objects nobody will read never return. Empty unless ``restore``.
    """
    if not options.restore or free_bytes <= 0:
        return []
    order = sorted((r for r in spilled if r.readers_left > 0 and not r.pinned),
                   key=lambda r: (_position_key(r), r.last_access, str(r.key)))
    out: list[Resident] = []
    left = free_bytes
    for r in order:
        if r.nbytes <= left:
            out.append(r)
            left -= r.nbytes
    return out


# ---- where an evicted object goes ------------------------------------------------------------
@dataclass(frozen=True)
class Peer:
    """Another device an evicted object could go to: its free store budget and the link to it."""

    name: str
    free_bytes: int
    gbps: float


def migration_target(nbytes: int, peers: Sequence[Peer], host_gbps: float, options: StorageOptions) -> str | None:
    """The peer device to evict to, or None for host memory.

    A peer qualifies when it has room for the object and a faster link than the host's (otherwise
    reading the object back from the peer is no better than from host memory). Among those the
    fastest link wins, then the most room, then the name, so the choice is deterministic.
    """
    if not options.migrate_peers:
        return None
    ok = [p for p in peers if p.free_bytes >= nbytes and p.gbps > host_gbps]
    if not ok:
        return None
    return min(ok, key=lambda p: (-p.gbps, -p.free_bytes, p.name)).name


def positions_by_consumer(queue: Mapping[str, int], consumers: Iterable[str]) -> int | None:
    """The position of an object's earliest queued consumer, from a ``function -> position`` map."""
    ps = [queue[c] for c in consumers if c in queue]
    return min(ps) if ps else None


#: A queued function's place in a FIFO queue: (queue name, ticket), the ticket being the number of
#: requests that entered that queue before it.
Ticket = tuple[str, int]


class QueueBook:
    """Where each invocation's functions wait, as the runtime's queue hints say (pure: no clock, no
    I/O; the daemon's tiers keep one).

    A hint gives each function of an invocation a *position* (``positions[f]`` requests are ahead of
    it; 0: it runs next, or now) or a *ticket* ``(q, t)``: it is request number ``t`` of the FIFO
    queue ``q``. :meth:`advance` sets ``heads[q]``, the requests that have left ``q``, so a ticket's
    position is ``t - heads[q]``. A dispatch moves one head, not every waiter's position: the
    runtime's hints cost O(1) per change and stay exact (a queue whose head is not known yet counts
    from 0). ``done`` functions will not run again; a function in no hint is not queued yet. Heads only
    move forward, so a late or repeated message cannot move one back; at most ``max_queues`` heads are
    kept (the least recently advanced go first).
    """

    def __init__(self, max_queues: int = 4096) -> None:
        self.max_queues = max_queues
        self._positions: dict[str, dict[str, int]] = {}
        self._tickets: dict[str, dict[str, Ticket]] = {}
        self._done: dict[str, frozenset[str]] = {}
        self._heads: OrderedDict[str, int] = OrderedDict()

    def __contains__(self, invocation: object) -> bool:
        return invocation in self._done

    def __len__(self) -> int:
        return len(self._done)

    def hint(self, invocation: str, positions: Mapping[str, int], done: Iterable[str] = (),
             tickets: Mapping[str, Ticket] | None = None) -> None:
        """Replace the invocation's hint."""
        self._positions[invocation] = dict(positions)
        if tickets:
            self._tickets[invocation] = dict(tickets)
        else:
            self._tickets.pop(invocation, None)
        self._done[invocation] = frozenset(done)

    def advance(self, heads: Mapping[str, int]) -> None:
        """``heads[q]`` requests have left queue ``q`` so far."""
        for q, n in heads.items():
            self._heads[q] = max(n, self._heads.pop(q, n))
        while len(self._heads) > self.max_queues:
            self._heads.popitem(last=False)

    def positions(self, invocation: str) -> dict[str, int] | None:
        """Function -> requests ahead of it now, for the functions the hint places; None: no hint."""
        pos = self._positions.get(invocation)
        tickets = self._tickets.get(invocation)
        if not tickets:
            return pos
        out = dict(pos or {})
        for f, (q, t) in tickets.items():
            out[f] = max(0, t - self._heads.get(q, 0))
        return out

    def done(self, invocation: str) -> frozenset[str]:
        return self._done.get(invocation, frozenset())

    def forget(self, invocation: str) -> None:
        self._positions.pop(invocation, None)
        self._tickets.pop(invocation, None)
        self._done.pop(invocation, None)
