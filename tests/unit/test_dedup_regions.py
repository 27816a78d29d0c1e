"""gfaas.dedup.regions: /proc/PID/maps parsing and the ranges a load added."""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas.dedup.madvise import PAGE
from gfaas.dedup.regions import MapEntry, RegionTracker, added_regions, read_maps, track_regions
from gfaas.errors import ConfigError

BEFORE = """\
55d0a0000000-55d0a0021000 r--p 00000000 08:01 1234    /usr/bin/python3
55d0a2000000-55d0a2100000 rw-p 00000000 00:00 0       [heap]
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
7f0000100000-7f0004000000 ---p 00000000 00:00 0
7f0010000000-7f0010200000 rw-s 00000000 00:01 99      /dev/shm/x
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0       [stack]
"""

AFTER = """\
55d0a0000000-55d0a0021000 r--p 00000000 08:01 1234    /usr/bin/python3
55d0a2000000-55d0a2300000 rw-p 00000000 00:00 0       [heap]
7f0000000000-7f0000300000 rw-p 00000000 00:00 0
7f0000300000-7f0004000000 ---p 00000000 00:00 0
7f0010000000-7f0010200000 rw-s 00000000 00:01 99      /dev/shm/x
7f0020000000-7f0020400000 rw-p 00000000 00:00 0
7f0030000000-7f0030100000 rw-p 00001000 08:01 77      /usr/lib/libfoo.so
7ffc00000000-7ffc00041000 rw-p 00000000 00:00 0       [stack]
"""


def _write(root: Path, text: str) -> None:
    (root / "42").mkdir(parents=True, exist_ok=True)
    (root / "42" / "maps").write_text(text)


def test_read_maps_parses_fields(tmp_path: Path) -> None:
    """Every field of a maps line; the path may be empty."""
    _write(tmp_path, BEFORE)
    maps = read_maps(42, tmp_path)
    assert maps[0] == MapEntry(0x55D0A0000000, 0x55D0A0021000, "r--p", 0, 1234, "/usr/bin/python3")
    assert maps[2] == MapEntry(0x7F0000000000, 0x7F0000100000, "rw-p", 0, 0, "")
    assert len(maps) == 6
    _write(tmp_path, "garbage\n")
    with pytest.raises(ConfigError, match="not a /proc/PID/maps line: 'garbage'"):
        read_maps(42, tmp_path)


def test_added_regions_exact(tmp_path: Path) -> None:
    """Grown heap, grown arena (formerly ---p) and a new anonymous mapping are added; shared, file
    and stack mappings never are."""
    _write(tmp_path, BEFORE)
    before = read_maps(42, tmp_path)
    _write(tmp_path, AFTER)
    after = read_maps(42, tmp_path)
    assert added_regions(before, after) == [
        (0x55D0A2100000, 0x200000),
        (0x7F0000100000, 0x200000),
        (0x7F0020000000, 0x400000),
    ]
    assert added_regions(after, after) == []


def test_tracker_on_fake_proc(tmp_path: Path) -> None:
    """RegionTracker reads the maps on entry and exit and sums the added bytes."""
    _write(tmp_path, BEFORE)
    with RegionTracker(pid=42, proc_root=tmp_path) as t:
        _write(tmp_path, AFTER)
    assert t.nbytes == 0x200000 + 0x200000 + 0x400000
    assert len(t.regions) == 3


def test_track_regions_sees_a_new_private_mapping() -> None:
    """A real private anonymous mapping made inside the block is inside one reported region."""
    with track_regions() as t:
        m = mmap.mmap(-1, 64 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    try:
        assert any(lo <= addr and addr + 64 * PAGE <= lo + n for lo, n in t.regions)
    finally:
        m.close()


def _entries(ranges: list[tuple[int, int, bool]]) -> list[MapEntry]:
    return [MapEntry(lo * PAGE, (lo + n) * PAGE, "rw-p" if ok else "r--p", 0, 0, "") for lo, n, ok in ranges]


ranges_st = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 8), st.booleans()), max_size=6)


@given(ranges_st, ranges_st)
def test_added_regions_matches_a_page_set_model(before: list, after: list) -> None:
    """Page by page: added = eligible pages of after minus eligible pages of before; the result is
    sorted and its ranges do not overlap."""
    def pages(rs: list[tuple[int, int, bool]]) -> set[int]:
        return {p for lo, n, ok in rs if ok for p in range(lo, lo + n)}

    # maps never overlap within one snapshot: keep the first of overlapping ranges
    def clean(rs: list[tuple[int, int, bool]]) -> list[tuple[int, int, bool]]:
        out, used = [], set()
        for lo, n, ok in rs:
            span = set(range(lo, lo + n))
            if not span & used:
                out.append((lo, n, ok))
                used |= span
        return out

    before, after = clean(before), clean(after)
    got = added_regions(_entries(before), _entries(after))
    got_pages = [p for lo, n in got for p in range(lo // PAGE, (lo + n) // PAGE)]
    assert len(got_pages) == len(set(got_pages))
    assert set(got_pages) == pages(after) - pages(before)
    assert got == sorted(got)
