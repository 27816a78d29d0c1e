"""What a warm worker does with the memory its handlers free: keep it for the next call.

A handler that makes a large array (``np.arange(16 * 2**20)``: 64 MiB) gets, from glibc's malloc, a
fresh mapping for every allocation over 32 MiB (the most its dynamic threshold reaches), and gives it
back to the kernel when the array is freed. The next call's array then faults every page in again
(16,384 small pages, or 32 huge ones). A warm worker serves the same function again and again, so
:func:`keep_freed` makes large allocations come from the process heap and keeps freed memory there,
up to ``trim_mib`` at its top, for the next call (``docs/performance.md``, "Warm heaps", with the
numbers of ``benchmarks/heap_ab.py``).

The cost: a worker keeps about its largest call's working set while idle (until its keep-alive ends
it), and on a VM whose untouched pages are slow to fault in, other processes' fresh arrays come from
colder memory (the runtime's copies of large results). ``RuntimeConfig.worker_heap="release"`` keeps
the C library's behaviour. It is applied once the worker has loaded its model, so the model's own
load is laid out as before.
"""

from __future__ import annotations

import logging

__all__ = ["HEAP_MODES", "keep_freed"]

log = logging.getLogger(__name__)

HEAP_MODES = ("reuse", "release")

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def keep_freed(trim_mib: int = 1024) -> bool:
    """Serve every allocation from the heap (no mapping per large block) and return freed memory to
    the kernel only beyond ``trim_mib`` MiB at the heap's top. False where the C library has no
    ``mallopt`` (not glibc): nothing changes there."""
    import ctypes  # only in a worker

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library: freed memory goes back to the kernel as before")
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    trim = min(int(trim_mib), 2047) << 20  # an int in C
    return bool(mallopt(_M_TRIM_THRESHOLD, trim)) and bool(mallopt(_M_MMAP_MAX, 0))
