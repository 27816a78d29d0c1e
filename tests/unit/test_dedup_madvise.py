"""gfaas.dedup.madvise and gfaas.dedup.hint: whole-page rounding, buffer spans, madvise."""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas.dedup import hint
from gfaas.dedup.madvise import PAGE, advise, buffer_span, page_range
from gfaas.errors import ConfigError, DedupError


def _vma_flags(addr: int) -> set[str]:
    """The VmFlags of the mapping holding ``addr`` (``mg`` = VM_MERGEABLE)."""
    current = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            current = lo <= addr < hi
        elif head == "VmFlags:" and current:
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.fixture
def private_map() -> Iterator[mmap.mmap]:
    """16 pages of private anonymous memory, un-advised and unmapped afterwards (the test process
    must not stay KSM-mergeable)."""
    m = mmap.mmap(-1, 16 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        yield m
    finally:
        addr, n = buffer_span(m)
        advise(addr, n, mergeable=False)
        m.close()
    assert "ksm_mergeable: no" in Path("/proc/self/ksm_stat").read_text() or not Path("/proc/self/ksm_stat").exists()


def test_page_range_exact() -> None:
    """Rounds inward: partial first and last pages are left out; no whole page gives length 0."""
    assert page_range(0, 3 * PAGE) == (0, 3 * PAGE)
    assert page_range(1, 3 * PAGE) == (PAGE, 2 * PAGE)
    assert page_range(PAGE - 1, PAGE + 2) == (PAGE, PAGE)
    assert page_range(10, PAGE) == (PAGE, 0)
    assert page_range(5 * PAGE, 0) == (5 * PAGE, 0)
    with pytest.raises(ConfigError, match="nbytes=-1"):
        page_range(0, -1)


@given(st.integers(0, 1 << 40), st.integers(0, 1 << 24))
def test_page_range_is_the_largest_aligned_subrange(addr: int, nbytes: int) -> None:
    """The result is page aligned, inside [addr, addr+n), and no larger aligned range fits."""
    start, length = page_range(addr, nbytes)
    assert start % PAGE == 0 and length % PAGE == 0
    assert addr <= start and start + length <= addr + nbytes or length == 0
    assert start - PAGE < addr  # the first boundary at or after addr
    end = start + length
    assert (end + PAGE > addr + nbytes) or length == 0
    if length == 0:
        assert (addr + nbytes) // PAGE * PAGE - start <= 0


def test_buffer_span_numpy_bytes_memoryview() -> None:
    """Address and size of C-contiguous buffers match numpy's own pointer."""
    a = np.arange(1000, dtype=np.float32)
    assert buffer_span(a) == (a.ctypes.data, 4000)
    assert buffer_span(memoryview(a)) == (a.ctypes.data, 4000)
    assert buffer_span(a[10:20]) == (a.ctypes.data + 40, 40)
    ro = np.frombuffer(b"x" * 100, dtype=np.uint8)
    assert buffer_span(b"x" * 100)[1] == 100 and buffer_span(ro)[1] == 100


def test_buffer_span_refusals() -> None:
    """Strided arrays, non-buffers, GPU and non-contiguous tensors: ConfigError naming the problem."""
    with pytest.raises(ConfigError, match="C-contiguous buffer: got a strided ndarray of 32 bytes"):
        buffer_span(np.zeros((4, 4))[:, 1])
    with pytest.raises(ConfigError, match="got int"):
        buffer_span(3)

    def tensor(device: str, contiguous: bool) -> SimpleNamespace:
        return SimpleNamespace(
            data_ptr=lambda: 4096 * 7, numel=lambda: 1000, element_size=lambda: 2,
            is_contiguous=lambda: contiguous, device=SimpleNamespace(type=device, __str__=None),
            shape=(10, 100), stride=lambda: (1, 10),
        )

    assert buffer_span(tensor("cpu", True)) == (4096 * 7, 2000)
    with pytest.raises(ConfigError, match="got a tensor on .*tensor.cpu"):
        buffer_span(tensor("cuda", True))
    with pytest.raises(ConfigError, match=r"shape \(10, 100\) with strides \(1, 10\)"):
        buffer_span(tensor("cpu", False))


def test_advise_marks_only_the_whole_pages(private_map: mmap.mmap) -> None:
    """merge() of a buffer starting mid-page advises only its whole pages: the VMA is split and the
    partial pages around it stay unmergeable; the bytes are counted once by take_hinted."""
    base, _ = buffer_span(private_map)
    view = memoryview(private_map)[100 : 100 + 5 * PAGE]  # pages 0 and 5 partial
    hint.take_hinted()
    h = hint.merge(view)
    assert h == hint.Hint(start=base + PAGE, length=4 * PAGE, requested=5 * PAGE)
    assert "mg" not in _vma_flags(base)
    assert "mg" in _vma_flags(base + PAGE) and "mg" in _vma_flags(base + 4 * PAGE)
    assert "mg" not in _vma_flags(base + 5 * PAGE)
    assert hint.take_hinted() == 4 * PAGE and hint.take_hinted() == 0
    view.release()


def test_merge_regions_counts_whole_pages(private_map: mmap.mmap) -> None:
    """merge_regions rounds each range inward and returns (and records) the bytes advised."""
    base, _ = buffer_span(private_map)
    hint.take_hinted()
    assert hint.merge_regions([(base, 2 * PAGE), (base + 3 * PAGE + 1, 2 * PAGE)]) == 3 * PAGE
    assert hint.take_hinted() == 3 * PAGE
    assert "mg" in _vma_flags(base) and "mg" not in _vma_flags(base + 2 * PAGE)


def test_advise_errors() -> None:
    """Unaligned ranges are a ConfigError; an unmapped range is a DedupError with the errno text."""
    with pytest.raises(ConfigError, match="page-aligned"):
        advise(PAGE + 1, PAGE)
    with pytest.raises(DedupError, match=r"madvise\(0x0, \d+, MADV_MERGEABLE\) failed: .*errno 12"):
        advise(0, PAGE)
    advise(PAGE, 0)  # nothing to do: no system call, no error
