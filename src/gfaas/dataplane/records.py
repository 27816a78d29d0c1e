"""The store's records: segments of memory, the objects in them, and the connections that use them.

Plain data shared by the store, its tiers and the cross-node parts; the logic that keeps them
consistent is in :mod:`gfaas.dataplane.store` and :mod:`gfaas.dataplane.tiers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .slabindex import SlabIndex

WRITING = "writing"
SEALED = "sealed"


@dataclass(slots=True)
class Segment:
    id: int
    invocation: str
    owner: int | None  # session allowed to pack objects into it (slabs); None for dedicated
    size: int
    handle: Any
    live: int = 0
    open: bool = True
    pins: int = 0  # replies naming this segment whose views are still alive in some client
    pooled: bool = False
    recyclable: bool = True
    workflow: str = ""  # whose invocations may reuse it once it is free (the warm pool's scope)
    device: int = -1  # -1: host memory; >= 0: the pool of that GPU
    holds: int = 0  # copies reading it right now (a delivery): not retired until they finish
    home: int = -1  # the tier its objects were stored on (-1 host, k GPU k): restores go back there
    index: SlabIndex | None = None  # a slab read locally: its index (see slabindex.py)
    limit: int = 0  # a slab with an index: objects end here, its directory follows
    described: int = 0  # directory slots already handled as seals (scan_directory)
    directory: memoryview | None = None  # the daemon's view of the slab, to read its directory
    mapper: int = 0  # the session sent its writable descriptor (a dedicated segment; 0: none)


@dataclass(slots=True)
class ObjectRecord:
    id: bytes
    invocation: str
    producer: str
    consumers: frozenset[str] | None
    pending: set[str] | None  # declared consumers that have not read it yet
    segment: int
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    state: str
    created: float
    writer: int | None = None  # session writing it (state WRITING)
    event: bytes = b""  # CUDA IPC event the producer recorded after writing it (device objects)
    accessed: float = 0.0  # last get (or creation): what LRU eviction orders by
    slot: int = -1  # its slot in its slab's index (small puts into a slab with one)


@dataclass(slots=True)
class Session:
    """One authenticated connection: a function of an invocation."""

    id: int
    invocation: str
    function: str
    functions: tuple[str, ...]
    arena: Segment | None = None
    arena_next: int = 0
    issued: set[bytes] = field(default_factory=set)
    # Of those, the ones in a slab's index: ID -> (slab, slot there); see slabindex.py.
    slots: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    pins: dict[int, int] = field(default_factory=dict)
    writing: set[bytes] = field(default_factory=set)  # objects it allocated and has not sealed
    # Byte ranges (offset, nbytes) of objects it got as pinned views, per segment: what it may derive.
    read: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
