"""Large copies split over threads: byte-exact for any length and split, safe across fork."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.dataplane import copy as C


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 3 * (1 << 16) + 17), threads=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_split_copy_equals_the_source_for_any_length(n: int, threads: int, seed: int) -> None:
    """Pieces are page-run aligned with a ragged tail: every byte lands once, nothing beyond."""
    src = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    dst = np.zeros(n + 64, np.uint8)
    saved, C.PARALLEL_MIN = C.PARALLEL_MIN, 0  # split even small copies, to test the pieces
    try:
        C.copy_bytes(dst[:n], src, threads=threads)
    finally:
        C.PARALLEL_MIN = saved
    assert np.array_equal(dst[:n], src) and not dst[n:].any()


def test_a_large_copy_runs_on_several_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above PARALLEL_MIN the copy is cut into one piece per thread, the caller copying the first."""
    seen: list[int] = []
    real = np.copyto

    def spy(dst: np.ndarray, src: np.ndarray) -> None:
        seen.append(src.nbytes)
        real(dst, src)

    monkeypatch.setattr(C.np, "copyto", spy)
    n = C.PARALLEL_MIN + 12345
    src = np.arange(n, dtype=np.uint64).view(np.uint8)[:n]
    dst = np.empty(n, np.uint8)
    C.copy_bytes(dst, src, threads=3)
    assert sum(seen) == n and len(seen) == 3 and np.array_equal(dst, src)
    seen.clear()
    C.copy_bytes(dst[: C.PARALLEL_MIN - 1], src[: C.PARALLEL_MIN - 1], threads=3)
    assert len(seen) == 1  # below the threshold: one copy on the caller's thread


def test_lengths_must_match() -> None:
    with pytest.raises(ValueError, match="copy of 10 bytes into a buffer of 9 bytes"):
        C.copy_bytes(np.empty(9, np.uint8), np.empty(10, np.uint8))


def test_thread_count_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GFAAS_COPY_THREADS", "1")
    assert C.copy_threads() == 1
    monkeypatch.setenv("GFAAS_COPY_THREADS", "junk")  # ignored: falls back to the cores
    assert 1 <= C.copy_threads() <= 4
    monkeypatch.delenv("GFAAS_COPY_THREADS")
    assert C.copy_threads() == max(1, min(4, len(os.sched_getaffinity(0))))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_copies_with_a_fresh_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's threads do not survive fork: the child makes its own instead of hanging."""
    monkeypatch.setattr(C, "PARALLEL_MIN", 0)
    src = np.arange(1 << 18, dtype=np.uint32).view(np.uint8)
    dst = np.empty_like(src)
    C.copy_bytes(dst, src, threads=2)  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            out = np.empty_like(src)
            C.copy_bytes(out, src, threads=2)
            os._exit(0 if np.array_equal(out, src) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
