"""The host backend: object bytes live in anonymous shared-memory segments (``memfd``).

Segments have no name in ``/dev/shm``: a process can map one only if the daemon handed it the file
descriptor, so a function never reaches segments of another invocation. Writers receive a
read-write descriptor; readers receive a descriptor reopened read-only through ``/proc``, so a
``PROT_WRITE`` shared mapping of it fails in the kernel. Segments are sealed memfds
(:mod:`gfaas.dataplane.memfd`): their size is fixed at allocation, and their writes are sealed
(``F_SEAL_FUTURE_WRITE``) when their object is sealed or before a reader first gets a descriptor,
so reopening that descriptor read-write through ``/proc/self/fd/N`` gains nothing. A segment's memory is returned when the
daemon and every process mapping it have let go, also when the daemon is killed: nothing stale is
left behind in the filesystem.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import CapacityError, DataPlaneError
from .. import memfd
from .base import Backend


@dataclass
class HostSegment:
    fd: int
    size: int
    ro_fd: int = -1
    _map: mmap.mmap | None = field(default=None, repr=False)
    sealed: bool = False  # F_SEAL_FUTURE_WRITE is set: no new writable mapping, by anyone

    def view(self) -> memoryview:
        if self._map is None:
            # Mapped before any write seal (seal_writes); a writable mapping made after one fails.
            prot = mmap.PROT_READ | (0 if self.sealed else mmap.PROT_WRITE)
            self._map = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, prot)
        return memoryview(self._map)


def _round_page(n: int) -> int:
    return (n + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE


class HostBackend(Backend):
    name = "host"

    def __init__(self) -> None:
        self.live = 0
        # Called with a segment's mapping before it is unmapped (the node's GPUs' registrations of
        # it, dataplane.pinned.HostPins.release): set by the daemon when it has CUDA GPUs.
        self.before_unmap: Callable[[mmap.mmap], None] | None = None

    def _alloc(self, nbytes: int, owner: str = "") -> Any:  # a memfd each: nothing shared to split
        size = _round_page(nbytes)
        try:
            fd = memfd.create("gfaas-seg", size)
        except OSError as exc:
            raise CapacityError(f"cannot create a {size}-byte shared segment: {exc}") from exc
        self.live += 1
        return HostSegment(fd, size)

    def _free(self, handle: Any) -> None:
        if handle._map is not None:
            if self.before_unmap is not None:
                self.before_unmap(handle._map)
            try:
                handle._map.close()
            except BufferError:
                pass  # a daemon-side view is still exported; the mapping goes with the last view
            handle._map = None
        for fd in (handle.fd, handle.ro_fd):
            if fd >= 0:
                os.close(fd)
        handle.fd = handle.ro_fd = -1
        self.live -= 1

    def _copy_in(self, handle: Any, offset: int, src: memoryview, deadline: float = math.inf) -> None:
        handle.view()[offset : offset + src.nbytes] = src.cast("B")

    def _copy_out(self, handle: Any, offset: int, nbytes: int, dst: memoryview,
                  deadline: float = math.inf) -> None:
        dst.cast("B")[:nbytes] = handle.view()[offset : offset + nbytes]

    def _transfer(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        dst.view()[dst_offset : dst_offset + nbytes] = src.view()[src_offset : src_offset + nbytes]

    def host_view(self, handle: Any) -> memoryview | None:
        return handle.view().cast("B")

    def seal_writes(self, handle: Any) -> None:
        if not handle.sealed and handle.fd >= 0:
            # The daemon's own writable mapping, made before the seal: it keeps working after it
            # (a restore into a reused sealed segment writes through it), where a new one would not.
            # Made only here, not at allocation: Python's mmap holds a duplicate descriptor, and a
            # segment never sealed needs no mapping until the daemon copies (issue 14 row 8: fds).
            handle.view().release()
            memfd.seal_writes(handle.fd)
            handle.sealed = True

    def writes_sealed(self, handle: Any) -> bool:
        return bool(handle.sealed)

    def export(self, handle: Any, writable: bool) -> int | None:
        if writable:
            if handle.sealed:
                raise DataPlaneError("internal error: a write-sealed segment cannot be handed out for writing")
            return int(handle.fd)
        if handle.ro_fd < 0:
            # Reopening through /proc yields an independent read-only open file description.
            handle.ro_fd = os.open(f"/proc/self/fd/{handle.fd}", os.O_RDONLY | os.O_CLOEXEC)
        return int(handle.ro_fd)


def attach(fd: int, writable: bool, populate: bool = False) -> mmap.mmap:
    """Map a segment received from the daemon (client side); closes ``fd`` afterwards.

    ``populate`` maps every page at once (MAP_POPULATE): for a segment whose pages already exist
    (a warm one being reused), mapping and writing 11 MiB took 1.5 ms against 3.1 ms with
    ``madvise(POPULATE_WRITE)`` (``benchmarks/machine_probes.py``, ``warm_segment_put_ms``)."""
    try:
        size = os.fstat(fd).st_size
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        return mmap.mmap(fd, size, flags, prot)
    finally:
        os.close(fd)
