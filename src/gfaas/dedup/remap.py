"""UPM's contract in user space for big explicit buffers: hash, compare, share copy-on-write.

:func:`remap_shared` publishes a buffer's whole pages into the content-addressed store
(:mod:`.shared`), checks byte for byte that the store file holds exactly those bytes, then maps the
store file ``MAP_PRIVATE | MAP_FIXED`` over the same addresses. Reads are then served from the store
file's page cache, one physical copy for every process that did the same with identical content; a
write faults in a private copy of that one page (copy-on-write), so no process can change another's
data. It takes milliseconds (one hash and one copy into RAM), where a KSM scan takes seconds.

Only pages inside one private anonymous mapping are remapped (``rw-p``, no file, not ``[heap]`` or
``[stack]``): the process's own memory that nothing else maps. Callers should use it on buffers that
own their mapping (``mmap`` buffers, numpy arrays large enough that malloc mmaps them, > 32 MiB with
glibc's default limits): an allocator that later returns such pages with ``MADV_DONTNEED`` would see
the file's bytes again instead of zeros.

Caller contract: no other thread writes the buffer during the call (a write between the comparison
and the remap would be lost).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, DedupError
from .shared import publish_bytes

log = logging.getLogger("gfaas.dedup")

PAGE = os.sysconf("SC_PAGE_SIZE")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.memcmp.restype = ctypes.c_int
_libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = 0x10


@dataclass(frozen=True)
class _Mapping:
    start: int
    end: int
    perms: str
    inode: int
    path: str


def _read_maps(pid: int | str = "self") -> list[_Mapping]:
    """The process's mappings from ``/proc/PID/maps`` (a small local parser; gfaas.dedup.regions has the
    shared one)."""
    out = []
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = parts[0].split("-")
            out.append(_Mapping(int(lo, 16), int(hi, 16), parts[1], int(parts[4]),
                                parts[5].strip() if len(parts) > 5 else ""))
    return out


def _span(obj: object) -> tuple[int, int]:
    """(address, nbytes) of a C-contiguous CPU buffer: numpy array, bytes-like / memoryview, or a CPU
    torch tensor (duck-typed)."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch.Tensor
        dev = getattr(getattr(obj, "device", None), "type", "cpu")
        if dev != "cpu" or not obj.is_contiguous():  # type: ignore[attr-defined]
            raise ConfigError(f"tensor on {dev!r} (contiguous: {obj.is_contiguous()}) cannot be remapped; "  # type: ignore[attr-defined]
                              "pass a contiguous CPU tensor (t.contiguous().cpu())")
        return int(obj.data_ptr()), int(obj.numel()) * int(obj.element_size())  # type: ignore[attr-defined]
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        import numpy as np

        arr = np.asarray(obj)
        if not arr.flags.c_contiguous:
            raise ConfigError("array is not C-contiguous and cannot be remapped; pass np.ascontiguousarray(x)")
        return int(iface["data"][0]), int(arr.nbytes)
    try:
        view = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"{type(obj).__name__} is not a buffer; pass a numpy array, memoryview, bytearray, mmap "
                          "or CPU tensor") from None
    if not view.c_contiguous:
        raise ConfigError("buffer is not C-contiguous and cannot be remapped; pass a contiguous copy")
    if view.nbytes == 0:
        return 0, 0
    if view.readonly:
        # ctypes cannot take the address of a read-only buffer; it is not ours to remap anyway.
        raise ConfigError("buffer is read-only (bytes?); remap_shared takes writable process memory, e.g. a "
                          "bytearray, numpy array or mmap")
    return ctypes.addressof(ctypes.c_char.from_buffer(view)), view.nbytes


def _inward(addr: int, nbytes: int) -> tuple[int, int]:
    start = -(-addr // PAGE) * PAGE
    end = (addr + nbytes) // PAGE * PAGE
    return start, max(0, end - start)


def eligible_range(obj: object, min_bytes: int = 2 << 20) -> tuple[int, int] | None:
    """The (start, length) :func:`remap_shared` would remap, or ``None`` when it would leave ``obj``
    alone (fewer than ``min_bytes`` of whole pages, or not inside one private anonymous mapping)."""
    start, length = _inward(*_span(obj))
    if length == 0 or length < min_bytes:
        return None
    for m in _read_maps():
        if m.start <= start and start + length <= m.end:
            if m.perms == "rw-p" and m.inode == 0 and m.path == "":
                return start, length
            return None
    return None


def remap_shared(obj: object, *, domain: str = "default", store_dir: Path | None = None,
                 min_bytes: int = 2 << 20) -> int:
    """Share ``obj``'s whole pages copy-on-write with every process that did the same with identical
    bytes (see the module doc). Returns the bytes remapped; 0 when ``obj`` is not eligible (then it is
    left untouched). No other thread may write ``obj`` during the call."""
    span = eligible_range(obj, min_bytes)
    if span is None:
        return 0
    start, length = span
    content = (ctypes.c_char * length).from_address(start)
    target = publish_bytes(memoryview(content), domain=domain, store_dir=store_dir)
    fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size != length:
            raise DedupError(f"store file {target} has {os.fstat(fd).st_size} bytes, expected {length}: the store "
                             "is damaged; clear it (gfaas.dedup.shared.clear_store)")
        # Byte-compare: the digest named the file, the bytes decide (a hash is not a proof of equality).
        ref = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if ref == _MAP_FAILED:
            err = ctypes.get_errno()
            raise DedupError(f"cannot map {target} to compare it: {os.strerror(err)}")
        try:
            same = _libc.memcmp(start, ref, length) == 0
        finally:
            _libc.munmap(ref, length)
        if not same:
            log.warning("buffer at %#x changed while it was published (a writer thread?); not remapped", start)
            return 0
        got = _libc.mmap(start, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | _MAP_FIXED, fd, 0)
        if got == _MAP_FAILED or got != start:
            err = ctypes.get_errno()
            # MAP_FIXED replaces the old pages before it can fail only on a bad argument, which the checks
            # above rule out; if it did fail, the range is unmapped and the process must not go on.
            raise DedupError(f"mmap(MAP_FIXED) of {target} over {length} bytes at {start:#x} failed: "
                             f"{os.strerror(err)}; the buffer's memory is no longer valid")
    finally:
        os.close(fd)
    log.debug("remapped %d bytes at %#x onto %s", length, start, target.name)
    return length

