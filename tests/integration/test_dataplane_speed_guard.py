"""Regression guards for large objects: ratios measured inside one test, with generous bounds.

A 256 MiB object once cost 9x more to put and 300x more to get than before (the elastic warm limit
retired every freed segment, so each put faulted in fresh memory and each get waited for the old
segment's pages to be freed) and nothing noticed for 84 commits. These tests time the same daemon
against itself and against one memcpy in the same minutes, so a busy machine moves both sides;
the speed targets themselves live in ``gfaas bench dataplane``.

The consumer keeps its view of one object until it gets the next, as a function reading a stream
does, so two large objects are alive at once: the condition the regression needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from gfaas.config import GiB, MiB

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.node_config(capacity_bytes=2 * GiB, slab_bytes=8 * MiB)]

BIG = 256 * MiB
SMALL = 1 * MiB


def _median(fn: Callable[[], object], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _memcpy_time(size: int) -> float:
    """Median time of one np.copyto between two touched buffers (freed on return)."""
    src = np.full(size, 1, np.uint8)
    dst = np.zeros_like(src)
    return _median(lambda: np.copyto(dst, src), warmup=1, reps=5)


def _stream(node, size: int, reps: int, pair=None) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    """Put ``size``-byte objects and get each (zero-copy); the previous view is held meanwhile."""
    prod, cons = pair or (node.connect("f"), node.connect("g"))
    arr = np.full(size, 3, np.uint8)
    puts, gets = [], []
    held = None
    for i in range(reps):
        arr[:8] = i
        t0 = time.perf_counter()
        ref = prod.put(arr, consumers=["g"])
        t1 = time.perf_counter()
        view = cons.get(ref)
        t2 = time.perf_counter()
        assert int(view[0]) == i % 256 and int(view[-1]) == 3
        held = view  # the previous object's view dies only now
        puts.append(t1 - t0)
        gets.append(t2 - t1)
    del held
    return puts[2:], gets[2:]  # the first two fault in fresh segments


def test_zero_copy_get_of_256_mib_costs_about_what_1_mib_costs(node) -> None:  # type: ignore[no-untyped-def]
    """A zero-copy get maps the segment once: 256 MiB within 10x of 1 MiB (it was 300x)."""
    _, small = _stream(node, SMALL, 12)
    _, big = _stream(node, BIG, 8)
    ratio = float(np.median(big)) / float(np.median(small))
    assert ratio < 10, f"get 256 MiB p50 {np.median(big) * 1e3:.2f} ms = {ratio:.1f}x get 1 MiB"


def test_put_of_256_mib_costs_about_one_memcpy(node) -> None:  # type: ignore[no-untyped-def]
    """A put into a warm segment is one copy: within 4x of a memcpy of the same size (it was 13x)."""
    memcpy = _memcpy_time(BIG)
    puts, _ = _stream(node, BIG, 8)
    ratio = float(np.median(puts)) / memcpy
    assert ratio < 4, f"put 256 MiB p50 {np.median(puts) * 1e3:.1f} ms = {ratio:.1f}x memcpy ({memcpy * 1e3:.1f} ms)"


def test_a_stream_of_large_objects_reuses_warm_segments(node) -> None:  # type: ignore[no-untyped-def]
    """The cause of the regression, asserted directly: two 256 MiB objects in flight fit the
    default warm cache (512 MiB), so a stream of them allocates no new segment after warm-up."""
    pair = node.connect("f"), node.connect("g")
    _stream(node, BIG, 3, pair)
    before = node.stats()
    _stream(node, BIG, 6, pair)
    after = node.stats()
    assert after["bytes_pooled"] >= BIG, after
    assert after["bytes_reserved"] <= before["bytes_reserved"] + BIG, (before, after)
