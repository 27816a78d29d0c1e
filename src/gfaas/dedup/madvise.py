"""Mark memory mergeable with ``madvise(MADV_MERGEABLE)``: the address of a buffer, its whole pages,
and the system call.

Only the *inward-aligned whole pages* of a hinted object are advised: the first page boundary at or
after its start up to the last page boundary at or before its end. KSM merges whole pages, and a page
that the object only partly covers also holds neighbouring data (another array, an allocator header,
a secret) that its owner did not opt in to sharing. Advising that page would let KSM compare and
merge the neighbour's bytes too, which opens exactly the side channel the opt-in exists to close (a
process learns whether another process holds a page it guessed, from the copy-on-write cost of a
write). The few bytes at the ragged ends stay private; for big buffers that is under 8 KiB.

Process-wide merging (``prctl(PR_SET_MEMORY_MERGE)``) is never used: it would make every anonymous
page of the process mergeable, hinted or not.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any

from ..errors import ConfigError, DedupError

PAGE: int = os.sysconf("SC_PAGE_SIZE")
MADV_MERGEABLE = 12
MADV_UNMERGEABLE = 13

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int


class _PyBuffer(ctypes.Structure):
    # CPython's Py_buffer (stable since 3.3): we only need buf and len.
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.py_object),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_PyBUF_RECORDS_RO = 0x0008 | 0x0010 | 0x0004  # ND | STRIDES | FORMAT, read-only allowed
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None
_is_contiguous = ctypes.pythonapi.PyBuffer_IsContiguous
_is_contiguous.argtypes = [ctypes.POINTER(_PyBuffer), ctypes.c_char]
_is_contiguous.restype = ctypes.c_int


def _tensor_span(obj: Any) -> tuple[int, int]:
    device = getattr(obj.device, "type", str(obj.device))
    if device != "cpu":
        raise ConfigError(
            f"merge() needs memory in this process: got a tensor on {obj.device}; "
            "hint the CPU copy (tensor.cpu()) or load the model with load_shared()"
        )
    if not obj.is_contiguous():
        raise ConfigError(
            f"merge() needs a contiguous tensor: got shape {tuple(obj.shape)} with strides "
            f"{tuple(obj.stride())}; pass tensor.contiguous()"
        )
    return int(obj.data_ptr()), int(obj.numel()) * int(obj.element_size())


def buffer_span(obj: Any) -> tuple[int, int]:
    """``(address, nbytes)`` of a C-contiguous buffer: bytes-like, memoryview, numpy array or CPU
    torch tensor (duck-typed). :class:`ConfigError` naming the problem for anything else."""
    if all(hasattr(obj, a) for a in ("data_ptr", "numel", "element_size", "is_contiguous", "device")):
        return _tensor_span(obj)
    view = _PyBuffer()
    try:
        if _get_buffer(obj, ctypes.byref(view), _PyBUF_RECORDS_RO) != 0:  # pragma: no cover
            raise TypeError
    except (TypeError, BufferError) as exc:
        raise ConfigError(
            f"merge() needs a buffer (bytes-like, memoryview, numpy array or CPU tensor); "
            f"got {type(obj).__name__}"
        ) from exc
    try:
        if not _is_contiguous(ctypes.byref(view), b"C"):
            raise ConfigError(
                f"merge() needs a C-contiguous buffer: got a strided {type(obj).__name__} of "
                f"{view.len} bytes; pass a contiguous copy (numpy.ascontiguousarray)"
            )
        return int(view.buf or 0), int(view.len)
    finally:
        _release_buffer(ctypes.byref(view))


def page_range(addr: int, nbytes: int) -> tuple[int, int]:
    """The whole pages inside ``[addr, addr + nbytes)``: ``(start, length)``, both page multiples;
    length 0 when no whole page fits (see the module docstring for why we round inward)."""
    if addr < 0 or nbytes < 0:
        raise ConfigError(f"page_range needs addr >= 0 and nbytes >= 0, got addr={addr}, nbytes={nbytes}")
    start = -(-addr // PAGE) * PAGE
    end = (addr + nbytes) // PAGE * PAGE
    return start, max(0, end - start)


def advise(start: int, length: int, mergeable: bool = True) -> None:
    """``madvise(start, length, MADV_MERGEABLE)`` (or ``MADV_UNMERGEABLE``); ``start`` and ``length``
    must be page multiples (use :func:`page_range`). :class:`DedupError` with the errno text on failure."""
    if start % PAGE or length % PAGE or length < 0:
        raise ConfigError(
            f"advise needs page-aligned start and length (page {PAGE}), got start={start:#x}, "
            f"length={length}; round with page_range()"
        )
    if length == 0:
        return
    advice = MADV_MERGEABLE if mergeable else MADV_UNMERGEABLE
    if _libc.madvise(start, length, advice) != 0:
        err = ctypes.get_errno()
        name = "MADV_MERGEABLE" if mergeable else "MADV_UNMERGEABLE"
        if err == errno.EPERM:
            raise DedupError(f"madvise({start:#x}, {length}, {name}) was refused (EPERM): the node merges "
                             "another sharing domain's pages now, or this process is not a worker the "
                             "runtime supervises (gfaas.runtime.seccomp)")
        raise DedupError(
            f"madvise({start:#x}, {length}, {name}) failed: {os.strerror(err)} (errno {err}); "
            "the range must be mapped private memory of this process (ENOMEM: not mapped, "
            "EINVAL: kernel without KSM or a special mapping)"
        )
