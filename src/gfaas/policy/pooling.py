"""Memory pools as the elastic-storage experiments compare them (seed 000 §7.1, §9.2.4, Fig. 16).

A :class:`PoolModel` keeps the books of one device's store memory: what it has taken from the
device (``reserved_bytes``), what objects use (``live_bytes``), and how many slow raw allocations
each request needed. It moves no bytes and reads no clock; the caller passes ``now``.

- ``elastic``: the daemon's own :class:`~gfaas.policy.pool.SegmentPool`, resized on every tick
  to the target the :class:`~gfaas.policy.storage.DemandTracker` computes, and pre-warmed up to it
  with arenas the size of the largest forecast object (R_size) rather than fixed 64 MiB ones,
  which would leave a 47.5 MiB frame alone in a 64 MiB arena (1.35x before any policy effect);
  64 MiB arenas only until a first size has been seen.
- ``caching``: the same arenas, never returned (PyTorch's caching allocator: a freed block is kept
  for reuse; blocks of separate raw allocations never merge, so a 120 MB request can miss even
  though two free 100 MB blocks are cached).
- ``periodic``: ``caching`` plus a manual "empty the cache" every ``reclaim_interval_s``.
- ``chunked``: GMLake-like: memory in fixed 2 MiB chunks stitched into objects, so there is no
  fragmentation, but chunks are never returned and each chunk is one unit of sharing (one IPC
  handle to open per chunk).
- ``none``: a raw allocation per object, freed with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CapacityError
from .pool import ARENA_GRANULE, Block, SegmentPool
from .storage import StorageOptions

#: Keep-forever target for the caching pools (bounded by the cap anyway).
_FOREVER = 1 << 62
#: Arena size for pre-warming before any object size has been seen (the daemon's default arena).
PREWARM_ARENA = 64 * 2**20


@dataclass(frozen=True)
class Grant:
    """The result of one allocation: a handle for :meth:`PoolModel.free` and what it cost."""

    handle: int
    nbytes: int
    raw_calls: int  # raw device allocations this request had to wait for (0: served from the pool)
    share_units: int  # handles a consumer must open to see the object (arenas or chunks)


class PoolModel:
    """Bookkeeping of one device's store memory under one :class:`StorageOptions`."""

    def __init__(self, options: StorageOptions, cap_bytes: int) -> None:
        if cap_bytes < ARENA_GRANULE:
            raise CapacityError(f"pool cap {cap_bytes} bytes is below one 2 MiB granule; raise it")
        self.options = options
        self.cap = cap_bytes
        self._next = 0
        self._blocks: dict[int, Block] = {}
        self._units: dict[int, int] = {}  # handle -> chunks (chunked) or bytes (none)
        self.free_chunks = 0
        self.chunk_held = 0
        self._raw = 0
        self._last_reclaim = 0.0
        self.pool: SegmentPool | None = None
        if options.pooling in ("elastic", "caching", "periodic"):
            keep = options.floor_bytes if options.pooling == "elastic" else _FOREVER
            # Raw allocations sized to the request (2 MiB granules) or, for the elastic pool's
            # pre-warming, to the forecast object: never a fixed arena that objects only half fill.
            self.pool = SegmentPool(self._raw_alloc, self._raw_free, cap_bytes=cap_bytes, arena_bytes=ARENA_GRANULE,
                                    target_bytes=min(keep, cap_bytes), name=f"{options.pooling} pool")
        self.live_none = 0

    # ---- raw memory (fake addresses: only the count and size matter) ---------------------
    def _raw_alloc(self, nbytes: int) -> int:
        self._raw += 1
        self._next += 1
        return self._next << 40

    def _raw_free(self, base: int) -> None:
        del base

    # ---- the model ---------------------------------------------------------------------------
    @property
    def reserved_bytes(self) -> int:
        if self.pool is not None:
            return self.pool.held
        if self.options.pooling == "chunked":
            return self.chunk_held
        return self.live_none

    @property
    def live_bytes(self) -> int:
        if self.pool is not None:
            return self.pool.used
        if self.options.pooling == "chunked":
            return (self.chunk_held // self.options.chunk_bytes - self.free_chunks) * self.options.chunk_bytes
        return self.live_none

    def alloc(self, nbytes: int, now: float) -> Grant:
        """Room for one object of ``nbytes``; raises CapacityError when the cap is reached."""
        self.tick(now)
        before = self._raw
        self._next += 1
        h = self._next
        if self.pool is not None:
            block = self.pool.alloc(nbytes)
            self._blocks[h] = block
            return Grant(h, block.size, self._raw - before, 1)
        if self.options.pooling == "chunked":
            c = self.options.chunk_bytes
            need = -(-nbytes // c)
            fresh = max(0, need - self.free_chunks)
            if self.chunk_held + fresh * c > self.cap:
                raise CapacityError(f"chunked pool: no room for {nbytes} bytes under its cap of {self.cap} bytes")
            self.free_chunks -= need - fresh
            self.chunk_held += fresh * c
            self._raw += fresh
            self._units[h] = need
            return Grant(h, need * c, fresh, need)
        rounded = -(-nbytes // ARENA_GRANULE) * ARENA_GRANULE
        if self.live_none + rounded > self.cap:
            raise CapacityError(f"no pool: no room for {nbytes} bytes under the cap of {self.cap} bytes")
        self.live_none += rounded
        self._raw += 1
        self._units[h] = rounded
        return Grant(h, rounded, 1, 1)

    def free(self, handle: int, now: float) -> None:
        if handle in self._blocks:
            assert self.pool is not None
            self.pool.free(self._blocks.pop(handle))
        elif handle in self._units:
            n = self._units.pop(handle)
            if self.options.pooling == "chunked":
                self.free_chunks += n
            else:
                self.live_none -= n
        else:
            raise CapacityError(f"handle {handle} is not a live allocation of this pool")
        self.tick(now)

    def tick(self, now: float, target: int | None = None, object_bytes: int = 0) -> int:
        """Apply the policy at time ``now``: resize an elastic pool to ``target`` and pre-warm it
        with arenas that hold objects of ``object_bytes`` (the largest R_size), or run a periodic
        reclaim that is due. Returns the bytes given back."""
        if self.pool is None:
            return 0
        if self.options.pooling == "elastic":
            if target is None:
                return 0
            before = self.pool.held
            self.pool.set_target(target)
            self.pool.prewarm(object_bytes or PREWARM_ARENA)
            return max(0, before - self.pool.held)
        if self.options.pooling == "periodic" and now - self._last_reclaim >= self.options.reclaim_interval_s:
            self._last_reclaim = now
            before = self.pool.held
            self.pool.set_target(0)
            self.pool.set_target(_FOREVER)
            return before - self.pool.held
        return 0

    @property
    def raw_allocs(self) -> int:
        return self._raw
