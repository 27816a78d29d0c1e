"""A sub-allocator over a few large raw allocations: the per-device memory pool the daemon owns.

Raw allocations (``cudaMalloc`` on a GPU, fake addresses on the null backend) are slow and, on a
GPU, synchronise the device when freed. The pool takes them in *arenas* of ``arena_bytes`` (or
larger, for an object that needs it) and serves objects as blocks inside them, so a put costs a
few list operations instead of a driver call. Each arena is also the unit of sharing: a CUDA IPC
handle names a whole ``cudaMalloc`` allocation, so a consumer opens an arena once and every later
object in it is an offset.

Sizing is driven from outside through a *reservation*: :meth:`SegmentPool.set_target` says how
many bytes of arenas to keep while they are empty (the elastic-storage policy of issue 6 computes
it; until then a fixed floor), :meth:`SegmentPool.prewarm` grows up to it ahead of demand, and the
cap bounds everything. Empty arenas above the target are returned as soon as they empty.

*One owner per arena.* Since opening an arena's handle maps all of it, read and write, an arena
holds the blocks of one owner only (the daemon passes the workflow: a tenant), so a function that
opens the handle of its own object cannot reach another tenant's. An arena is unowned until its
first block (prewarmed arenas are), and keeps its owner until it goes back: its handle may still be
open in the owner's processes, so it is never handed to another owner.

Free space is kept per owner as a list sorted by ``(size, arena, offset)`` (best fit by one
bisection) plus, per arena, maps from a free block's start and end to the block, so a freed block
merges with its free neighbours at once. No clock, no threads: the caller serialises calls.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import CapacityError, ConfigError
from ..units import MiB

ARENA_GRANULE = 2 * MiB  # the GPU's large-page size: arenas are whole multiples of it


@dataclass(frozen=True, slots=True)
class Block:
    """``size`` bytes at ``offset`` inside arena ``arena`` (whose raw base is ``base``)."""

    arena: int
    base: int
    offset: int
    size: int

    @property
    def address(self) -> int:
        return self.base + self.offset


@dataclass(slots=True)
class Arena:
    serial: int  # never reused: consumers cache opened handles by it
    base: int
    size: int
    owner: str | None = None  # whose blocks it holds (None: nobody's yet)
    used: int = 0
    live: dict[int, int] = field(default_factory=dict)  # offset -> size of each live block
    free_by_start: dict[int, int] = field(default_factory=dict)  # offset -> size
    free_by_end: dict[int, int] = field(default_factory=dict)  # end offset -> start offset


@dataclass(frozen=True)
class PoolStats:
    arena_bytes: int  # raw bytes held
    used_bytes: int  # bytes in live blocks (after alignment)
    target_bytes: int
    cap_bytes: int
    arenas: int
    blocks: int
    raw_allocs: int
    raw_frees: int


class SegmentPool:
    """Blocks carved from arenas obtained with ``raw_alloc(nbytes) -> base`` and returned with
    ``raw_free(base)``; see the module docstring.

    ``on_arena_freed(serial)`` is called after an arena went back, so whoever handed out handles
    to it can tell their holders to close them.
    """

    def __init__(
        self,
        raw_alloc: Callable[[int], int],
        raw_free: Callable[[int], None],
        *,
        cap_bytes: int,
        arena_bytes: int = 64 * MiB,
        align: int = 512,
        target_bytes: int = 0,
        name: str = "pool",
        serial_base: int = 0,
        on_arena_freed: Callable[[int], None] | None = None,
    ) -> None:
        if arena_bytes <= 0 or arena_bytes % ARENA_GRANULE:
            raise ConfigError(f"{name}: arena_bytes={arena_bytes} must be a positive multiple of 2 MiB")
        if align <= 0 or align & (align - 1):
            raise ConfigError(f"{name}: align={align} must be a power of two")
        if cap_bytes < ARENA_GRANULE:
            raise ConfigError(f"{name}: cap_bytes={cap_bytes} must be at least 2 MiB (one arena granule)")
        self.name = name
        self._raw_alloc, self._raw_free = raw_alloc, raw_free
        self.cap = cap_bytes
        self.arena_bytes = arena_bytes
        self.align = align
        self.target = 0
        self.on_arena_freed = on_arena_freed
        self.arenas: dict[int, Arena] = {}
        # owner (None: unowned arenas) -> its free blocks as (size, arena serial, offset), sorted
        self._free: dict[str | None, list[tuple[int, int, int]]] = {}
        self._serial = serial_base  # arena serials are unique across pools that use distinct bases
        self.held = 0
        self.used = 0
        self.raw_allocs = 0
        self.raw_frees = 0
        self.set_target(target_bytes)

    # ---- reservation ---------------------------------------------------------------------
    def set_target(self, nbytes: int) -> None:
        """Keep up to ``nbytes`` of arenas while empty (clamped to the cap); trims what is above."""
        if nbytes < 0:
            raise ConfigError(f"{self.name}: target {nbytes} bytes must be >= 0")
        self.target = min(nbytes, self.cap)
        self.trim()

    def prewarm(self, object_bytes: int = 0) -> int:
        """Grow by whole arenas until ``target`` bytes are held; returns the bytes added.

        ``object_bytes`` is the largest object expected (the policy's R_size): arenas grown here are
        at least that big, so the object it forecasts fits one of them instead of missing.
        """
        size = max(self.arena_bytes, -(-object_bytes // ARENA_GRANULE) * ARENA_GRANULE)
        added = 0
        while self.held + size <= self.target:
            self._grow(size)
            added += size
        return added

    def trim(self) -> int:
        """Return empty arenas while more than ``target`` bytes are held; returns the bytes freed."""
        freed = 0
        for a in sorted(self.arenas.values(), key=lambda a: -a.serial):  # newest first
            if self.held <= self.target:
                break
            if not a.live:
                freed += a.size
                self._drop(a)
        return freed

    # ---- blocks ----------------------------------------------------------------------------
    def alloc(self, nbytes: int, owner: str = "") -> Block:
        """A block of at least ``nbytes`` (rounded up to the alignment) in an arena of ``owner``'s
        (one of its own, else an unowned one it then owns, else a new one)."""
        if nbytes <= 0:
            raise CapacityError(f"{self.name}: cannot allocate {nbytes} bytes; the size must be > 0")
        need = -(-nbytes // self.align) * self.align
        free = self._free.get(owner)
        if free is None:  # (not setdefault: that would build a list on every call)
            free = self._free[owner] = []
        i = bisect.bisect_left(free, (need, -1, -1))
        if i == len(free) and self._claim(need, owner):
            i = bisect.bisect_left(free, (need, -1, -1))
        if i == len(free):
            if need > self.cap:
                raise CapacityError(
                    f"{self.name}: an object of {nbytes} bytes exceeds the pool's cap of {self.cap} bytes;"
                    " raise the cap or split the object"
                )
            size = max(self.arena_bytes, -(-need // ARENA_GRANULE) * ARENA_GRANULE)
            if self.held + size > self.cap:
                self._drop_empty(self.held + size - self.cap)
            if self.held + size > self.cap:
                raise CapacityError(
                    f"{self.name}: no room for {nbytes} bytes: {self.used} of {self.cap} bytes in use"
                    f" ({self.held} held in {len(self.arenas)} arenas); free objects or raise the cap"
                )
            self._grow(size, owner)
            free = self._free[owner]
            i = bisect.bisect_left(free, (need, -1, -1))
        size, serial, off = free.pop(i)
        a = self.arenas[serial]
        del a.free_by_start[off], a.free_by_end[off + size]
        if size > need:
            self._add_free(a, off + need, size - need)
        a.used += need
        a.live[off] = need
        self.used += need
        return Block(serial, a.base, off, need)

    def free(self, block: Block) -> None:
        """Give a block back; merges with free neighbours; an emptied arena above target goes back."""
        a = self.arenas.get(block.arena)
        if a is None or block.offset < 0 or block.offset + block.size > a.size:
            raise CapacityError(f"{self.name}: block {block} is not from this pool")
        off, size = block.offset, block.size
        if a.live.get(off) != size:
            raise CapacityError(f"{self.name}: block {block} is not live (already freed, or forged)")
        del a.live[off]
        a.used -= size
        self.used -= size
        start = a.free_by_end.get(off)
        if start is not None:  # merge with the free block just before
            prev = a.free_by_start[start]
            self._take_free(a, start, prev)
            off, size = start, size + prev
        nxt = a.free_by_start.get(off + size)
        if nxt is not None:  # and the one just after
            self._take_free(a, off + size, nxt)
            size += nxt
        self._add_free(a, off, size)
        if not a.live and self.held > self.target:
            self._drop(a)

    def stats(self) -> PoolStats:
        return PoolStats(self.held, self.used, self.target, self.cap, len(self.arenas),
                         sum(len(a.live) for a in self.arenas.values()), self.raw_allocs, self.raw_frees)

    def close(self) -> None:
        """Return every arena, live blocks or not (the daemon is going away)."""
        for a in list(self.arenas.values()):
            self._drop(a)

    # ---- internals -------------------------------------------------------------------------
    def _claim(self, need: int, owner: str) -> bool:
        """Give ``owner`` the smallest unowned arena with a free block of ``need`` bytes."""
        unowned = self._free.get(None)
        if not unowned:
            return False
        i = bisect.bisect_left(unowned, (need, -1, -1))
        if i == len(unowned):
            return False
        a = self.arenas[unowned[i][1]]
        blocks = list(a.free_by_start.items())
        for off, size in blocks:
            self._take_free(a, off, size)
        a.owner = owner
        for off, size in blocks:
            self._add_free(a, off, size)
        return True

    def _grow(self, size: int, owner: str | None = None) -> Arena:
        base = self._raw_alloc(size)
        self.raw_allocs += 1
        self._serial += 1
        a = Arena(self._serial, base, size, owner)
        self.arenas[a.serial] = a
        self.held += size
        self._add_free(a, 0, size)
        return a

    def _drop(self, a: Arena) -> None:
        for off, size in list(a.free_by_start.items()):
            self._take_free(a, off, size)
        del self.arenas[a.serial]
        self.held -= a.size
        self.used -= a.used
        self._raw_free(a.base)
        self.raw_frees += 1
        if self.on_arena_freed is not None:
            self.on_arena_freed(a.serial)

    def _drop_empty(self, need: int) -> None:
        for a in sorted(self.arenas.values(), key=lambda a: a.size):
            if need <= 0:
                return
            if not a.live:
                need -= a.size
                self._drop(a)

    def _add_free(self, a: Arena, off: int, size: int) -> None:
        a.free_by_start[off] = size
        a.free_by_end[off + size] = off
        free = self._free.get(a.owner)
        if free is None:
            free = self._free[a.owner] = []
        bisect.insort(free, (size, a.serial, off))

    def _take_free(self, a: Arena, off: int, size: int) -> None:
        del a.free_by_start[off], a.free_by_end[off + size]
        free = self._free[a.owner]
        i = bisect.bisect_left(free, (size, a.serial, off))
        del free[i]

