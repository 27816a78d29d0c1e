"""The backend hook interface.

A backend owns the bytes of stored objects. The store calls five small hooks; the public wrappers
around them check arguments once, so each backend only implements the mechanics:

``_alloc(nbytes, owner) -> handle``   reserve a segment of storage (``owner``: the tenant, for
                                      backends whose exports map more than the segment)
``_free(handle)``                     give it back
``_copy_in(handle, offset, src)``     write bytes from the daemon's address space into a segment
``_copy_out(handle, offset, n, dst)`` read bytes of a segment into ``dst``
``_transfer(src, so, dst, do, n)``    move bytes between two segments (e.g. device to device)

``export(handle, writable)`` turns a segment into something another process can map: a file
descriptor for ``host``; a CUDA IPC handle for the later ``cuda`` backend; ``None`` for ``null``.
Handles are opaque to the store, so device pointers and streams fit without changing it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

from ...errors import CapacityError


class Backend(ABC):
    """Storage for object bytes; see the module docstring for the hooks."""

    name: str = "?"

    # ---- public wrappers: validate once, then call the hook --------------------------------
    def alloc(self, nbytes: int, owner: str = "") -> Any:
        if nbytes <= 0:
            raise CapacityError(f"cannot allocate a segment of {nbytes} bytes on {self.name}; size must be > 0")
        return self._alloc(nbytes, owner)

    def free(self, handle: Any) -> None:
        self._free(handle)

    def copy_in(self, handle: Any, offset: int, src: memoryview, deadline: float = math.inf) -> None:
        self._check_range(handle, offset, src.nbytes)
        self._copy_in(handle, offset, src, deadline)

    def copy_out(self, handle: Any, offset: int, nbytes: int, dst: memoryview, deadline: float = math.inf) -> None:
        self._check_range(handle, offset, nbytes)
        self._copy_out(handle, offset, nbytes, dst, deadline)

    def transfer(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        self._check_range(src, src_offset, nbytes)
        self._check_range(dst, dst_offset, nbytes)
        self._transfer(src, src_offset, dst, dst_offset, nbytes)

    def export(self, handle: Any, writable: bool) -> Any:
        """An OS handle for another process to map the segment, or ``None`` if not shareable."""
        return None

    def seal_writes(self, handle: Any) -> None:
        """Make the segment's bytes immutable for every mapping made from now on (host memfds:
        ``F_SEAL_FUTURE_WRITE``); mappings that exist keep working. A no-op where nothing is shared."""

    def writes_sealed(self, handle: Any) -> bool:
        """Whether :meth:`seal_writes` ran: nobody can map the segment writable any more."""
        return False

    def host_view(self, handle: Any) -> memoryview | None:
        """A byte view of the segment in this process's memory, if the backend has one (so a
        transfer can send from or receive into it directly); ``None`` means use the copy hooks."""
        return None

    def size_of(self, handle: Any) -> int:
        return int(handle.size)

    def _check_range(self, handle: Any, offset: int, nbytes: int) -> None:
        size = self.size_of(handle)
        if offset < 0 or nbytes < 0 or offset + nbytes > size:
            raise CapacityError(
                f"range [{offset}, {offset + nbytes}) is outside a {size}-byte {self.name} segment"
            )

    # ---- hooks ------------------------------------------------------------------------------
    @abstractmethod
    def _alloc(self, nbytes: int, owner: str = "") -> Any: ...

    @abstractmethod
    def _free(self, handle: Any) -> None: ...

    @abstractmethod
    def _copy_in(self, handle: Any, offset: int, src: memoryview, deadline: float = math.inf) -> None:
        """``deadline``: when the copy is due, ``time.monotonic()`` seconds (inf: best effort); a
        device backend's copy engine shares its link by it (``slo_rates``)."""

    @abstractmethod
    def _copy_out(self, handle: Any, offset: int, nbytes: int, dst: memoryview,
                  deadline: float = math.inf) -> None: ...

    @abstractmethod
    def _transfer(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None: ...

    def close(self) -> None:
        """Release everything the backend still holds."""
