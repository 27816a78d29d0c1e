"""Large host-memory copies split over threads (``np.copyto`` runs with the GIL released).

A put copies the caller's array into the segment its consumers will map, and a copying get copies
out of it; both are memory-bound. One core's memcpy does not saturate the memory system of the
machines we measured, so large copies are cut into page-aligned pieces that run on a small pool of
threads while the calling thread copies the first piece (Ray's object store does the same for
large objects). Small copies stay on the calling thread: handing work to a thread costs tens of
microseconds.

The pool is created on first use and dropped in a forked child (its threads do not survive a fork).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

#: Copies at least this large are split (below it a thread hand-off costs more than it saves).
PARALLEL_MIN = 16 << 20
#: Pieces are multiples of this (a page run, so no two threads write one page).
_ALIGN = 1 << 16

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_workers = 0


def copy_threads() -> int:
    """Threads a large copy uses: the cores this process may run on, at most 4 (more only adds
    contention for memory bandwidth). ``GFAAS_COPY_THREADS`` overrides (1 turns splitting off)."""
    env = os.environ.get("GFAAS_COPY_THREADS", "")
    if env.strip():
        try:
            return max(1, int(env))
        except ValueError:
            pass
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def _executor(n: int) -> ThreadPoolExecutor:
    global _pool, _workers
    with _lock:
        if _pool is None or _workers < n:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool, _workers = ThreadPoolExecutor(n, thread_name_prefix="gfaas-copy"), n
        return _pool


def _after_fork() -> None:
    global _pool, _workers
    _pool, _workers = None, 0


os.register_at_fork(after_in_child=_after_fork)


def copy_bytes(dst: np.ndarray, src: np.ndarray, threads: int | None = None) -> None:
    """Copy ``src`` into ``dst``: two one-dimensional uint8 arrays of the same length."""
    n = src.nbytes
    if dst.nbytes != n:
        raise ValueError(f"copy of {n} bytes into a buffer of {dst.nbytes} bytes")
    k = copy_threads() if threads is None else threads
    if n < max(PARALLEL_MIN, 1) or k < 2:
        np.copyto(dst, src)
        return
    piece = -(-n // k)
    piece = -(-piece // _ALIGN) * _ALIGN
    pool = _executor(k - 1)
    futures: list[Future[None]] = [
        pool.submit(np.copyto, dst[i : i + piece], src[i : i + piece]) for i in range(piece, n, piece)
    ]
    try:
        np.copyto(dst[:piece], src[:piece])
    finally:
        for f in futures:
            f.result()


def as_bytes(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array's bytes as a flat uint8 array (no copy)."""
    return a.reshape(-1).view(np.uint8)
