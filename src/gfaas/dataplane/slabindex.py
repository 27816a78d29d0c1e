"""Local reads of small objects: a slab's directory (producer-written) and index (daemon-written).

A small put writes its bytes into the producer's slab and sends ``Seal`` without waiting. For the
consumer to read it without a round trip to the daemon, two small tables travel with each slab:

*Directory* (the last ``entries * DIR_ENTRY`` bytes of the slab itself, written by the producer
through its read-write mapping): entry ``seq`` describes the object put under the ``seq``-th ID
issued for this slab: offset, size, dtype, shape and the functions that may read it. The offset
word is written last (``0``: nothing there yet).

*Index* (a ``memfd`` of its own, written only by the daemon; readers get it read-only): a valid
flag for the whole slab, then entry ``seq`` = the ID the daemon issued for that slot and its state
(``LIVE`` until the object is freed, then ``GONE``). The daemon clears the valid flag when the slab
leaves memory or its invocation ends.

A reader that maps a slab (the daemon sends both descriptors with the reply to its first ``Get``
of an object in it, after the usual access check) finds a later object of the same slab by its ID
in the directory, and serves it locally only if the index confirms that this very ID was issued
for that slot of that slab and is still live, the slab is still valid, and the directory's reader
list names the reader (or nobody, for objects open to the whole invocation). Anything else falls
back to the ``Get`` round trip, which gives the precise answer. The directory is the producer's
word about its own objects only: the index pins each ID to the slab and slot the daemon issued it
for, so no producer can pass off bytes as another producer's object.
"""

from __future__ import annotations

import mmap
import os
import struct

from . import memfd
from .meta import _ITEMSIZE, RAW

#: Directory entry: nbytes, ID, dtype code, ndim, open to the whole invocation, 4 dimensions,
#: bitmask of the reader functions (by position in the invocation), and last the offset + 1 (0:
#: empty). ``struct.pack_into`` stores the fields in this order, so the offset lands last.
DIR = struct.Struct("<I16sBBBx4I16sQ")
DIR_ENTRY = DIR.size  # 64
DIR_ID = 4  # where the ID is in an entry
DIR_COMMIT = 56  # where the offset + 1 is
DIR_MAX_NDIM = 4
DIR_MAX_FUNCTIONS = 128
#: Index: header (valid flag), then per slot the ID and its state.
INDEX_HEADER = 64
INDEX_ENTRY = 32
LIVE = 1
GONE = 2
#: One directory slot per this many slab bytes (objects under ~1 KiB may outnumber the slots; those
#: beyond them are read through the daemon).
BYTES_PER_SLOT = 1024

DTYPES: tuple[str, ...] = (RAW, *sorted(k for k in _ITEMSIZE if k != RAW))
DTYPE_CODE = {d: i for i, d in enumerate(DTYPES)}


def slots_for(slab_bytes: int) -> int:
    return max(1, slab_bytes // BYTES_PER_SLOT)


def directory_bytes(slab_bytes: int) -> int:
    return slots_for(slab_bytes) * DIR_ENTRY


def committed(view: memoryview, at: int) -> bool:
    """Whether the directory entry at ``at`` has been written (its offset word is set)."""
    return _U64.unpack_from(view, at + DIR_COMMIT)[0] != 0


class SlabIndex:
    """The daemon's index of one slab (see the module docstring)."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self.next = 0
        size = INDEX_HEADER + entries * INDEX_ENTRY
        self.fd = memfd.create("gfaas-index", size)
        try:
            self.map: mmap.mmap | None = mmap.mmap(self.fd, size)
            memfd.seal_writes(self.fd)  # only the daemon's mapping, made just now, can write it
        except OSError:
            os.close(self.fd)
            raise
        self.ro_fd = -1
        self.map[0] = 1

    def add(self, oid: bytes) -> int:
        """Record ``oid`` in the next free slot; its slot number, or -1 when the index is full."""
        m = self.map
        if m is None or self.next >= self.entries:
            return -1
        seq = self.next
        self.next += 1
        at = INDEX_HEADER + seq * INDEX_ENTRY
        m[at : at + 16] = oid
        m[at + 16] = LIVE
        return seq

    def gone(self, seq: int) -> None:
        if self.map is not None and 0 <= seq < self.next:
            self.map[INDEX_HEADER + seq * INDEX_ENTRY + 16] = GONE

    def invalidate(self) -> None:
        if self.map is not None:
            self.map[0] = 0

    def export(self) -> int:
        """A read-only descriptor (reopened through ``/proc``, so no writable mapping is possible)."""
        if self.ro_fd < 0:
            self.ro_fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        return self.ro_fd

    def close(self) -> None:
        self.invalidate()
        if self.map is not None:
            self.map.close()
            self.map = None
        for fd in (self.fd, self.ro_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.ro_fd = -1


_U64 = struct.Struct("<Q")

#: Read log: the client's ``tail`` (u64) at 0, the daemon's ``head`` (u64) at 8, then a ring of IDs.
LOG_HEADER = 64
LOG_CAPACITY = 4096  # IDs


class ReadLog:
    """Where a connection notes the objects it read locally, for the daemon to count (see
    :meth:`Daemon._scan`): a ``memfd`` both map read-write. The client appends an ID, then moves
    ``tail``; the daemon copies entries out, then moves ``head``. A client that writes nonsense here
    only claims reads of its own: each is checked like a ``Get`` before it counts."""

    def __init__(self, capacity: int = LOG_CAPACITY) -> None:
        self.capacity = capacity
        self.head = 0
        self.fd = memfd.create("gfaas-reads", LOG_HEADER + capacity * 16)  # size sealed: no SIGBUS
        try:
            self.map: mmap.mmap | None = mmap.mmap(self.fd, LOG_HEADER + capacity * 16)
        except OSError:
            os.close(self.fd)
            raise

    def pending(self) -> bool:
        """Whether the client appended anything since the last :meth:`take` (one 8-byte read)."""
        return self.map is not None and _U64.unpack_from(self.map, 0)[0] != self.head

    def take(self) -> list[bytes]:
        """The IDs appended since the last call (at most one ring's worth)."""
        m = self.map
        if m is None:
            return []
        tail = int.from_bytes(m[0:8], "little")
        if tail == self.head:
            return []
        start = max(self.head, tail - self.capacity) if tail > self.head else tail
        out = []
        for i in range(start, tail):
            at = LOG_HEADER + (i % self.capacity) * 16
            out.append(bytes(m[at : at + 16]))
        self.head = tail
        m[8:16] = tail.to_bytes(8, "little")
        return out

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
