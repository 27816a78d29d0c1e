"""gfaas.dedup.remap: a buffer's pages remapped copy-on-write onto the shared store copy (content kept,
PSS halved across two processes, writes private to the writer, ineligible buffers untouched)."""

from __future__ import annotations

import hashlib
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gfaas.dedup import remap
from gfaas.dedup.remap import PAGE, eligible_range, remap_shared
from gfaas.errors import ConfigError, DedupError

MiB = 1 << 20


def _anon(n: int) -> mmap.mmap:
    return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _fill(m: mmap.mmap, seed: int = 0) -> np.ndarray:
    a = np.frombuffer(m, np.uint8)
    a[:] = np.random.default_rng(seed).integers(0, 256, a.size, dtype=np.uint8)
    return a


def _vma(addr: int, pid: int | str = "self") -> dict[str, object]:
    """The /proc/PID/smaps entry of the mapping that holds ``addr``: start, end, path and kB fields."""
    found: dict[str, object] | None = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                if found is not None:
                    break
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                if lo <= addr < hi:
                    found = {"start": lo, "end": hi, "path": head[5] if len(head) > 5 else ""}
            elif found is not None and len(head) == 3 and head[2] == "kB":
                found[head[0].rstrip(":")] = int(head[1]) * 1024
    assert found is not None, f"no mapping holds {addr:#x}"
    return found


def test_remap_keeps_the_content_and_maps_the_store_file(tmp_path: Path) -> None:
    """After remap the buffer reads the same bytes; its pages are the store file named by their SHA-256."""
    m = _anon(8 * MiB)
    a = _fill(m)
    before = a.copy()
    assert remap_shared(a, store_dir=tmp_path) == 8 * MiB
    np.testing.assert_array_equal(a, before)
    vma = _vma(a.ctypes.data)
    assert vma["path"] == str(tmp_path / "default" / hashlib.sha256(before.tobytes()).hexdigest())
    assert vma["Anonymous"] == 0  # nothing written since: every page is the file's


def test_only_whole_inner_pages_are_remapped(tmp_path: Path) -> None:
    """A buffer starting mid-page remaps from the next page boundary to the last whole page."""
    m = _anon(4 * MiB)
    a = _fill(m)[100:-100]
    start, length = eligible_range(a, min_bytes=PAGE) or (0, 0)
    assert start == a.ctypes.data - 100 + PAGE and length == 4 * MiB - 2 * PAGE
    before = a.copy()
    assert remap_shared(a, store_dir=tmp_path, min_bytes=PAGE) == length
    np.testing.assert_array_equal(a, before)
    assert _vma(start)["path"].startswith(str(tmp_path))  # type: ignore[union-attr]


def test_write_after_remap_changes_only_this_copy(tmp_path: Path) -> None:
    """A write to a remapped page changes the process's copy, never the store file."""
    m = _anon(4 * MiB)
    a = _fill(m)
    remap_shared(a, store_dir=tmp_path)
    store_file = Path(str(_vma(a.ctypes.data)["path"]))
    a[PAGE + 5] ^= 0xFF
    on_disk = np.fromfile(store_file, np.uint8)
    assert on_disk[PAGE + 5] != a[PAGE + 5]
    assert hashlib.sha256(on_disk.tobytes()).hexdigest() == store_file.name
    assert _vma(a.ctypes.data)["Anonymous"] == PAGE  # exactly the page written was copied


def test_ineligible_buffers_are_left_alone(tmp_path: Path) -> None:
    """Too small, in [heap], or a shared mapping: remap returns 0 and changes nothing."""
    small = _anon(MiB)
    _fill(small)
    assert remap_shared(small, store_dir=tmp_path) == 0  # under the 2 MiB default
    heap = bytearray(64 * 1024)  # below malloc's mmap threshold: from the main arena, i.e. [heap]
    addr = np.frombuffer(heap, np.uint8).ctypes.data
    entry = [e for e in remap._read_maps() if e.start <= addr < e.end][0]
    if entry.path != "[heap]":  # pragma: no cover - allocator-dependent precondition
        pytest.skip(f"the bytearray landed in {entry.path or 'an anonymous mapping'}, not [heap]")
    assert remap_shared(heap, store_dir=tmp_path, min_bytes=PAGE) == 0
    shared_map = mmap.mmap(-1, 4 * MiB)  # MAP_SHARED: not this process's private memory
    assert remap_shared(shared_map, store_dir=tmp_path) == 0
    assert not (tmp_path / "default").exists() or list((tmp_path / "default").iterdir()) == []


def test_bad_buffers_raise_config_errors() -> None:
    """Read-only bytes, non-contiguous arrays and non-buffers are refused with the fix."""
    with pytest.raises(ConfigError, match="read-only"):
        remap_shared(b"x" * (4 * MiB))
    with pytest.raises(ConfigError, match="not C-contiguous.*ascontiguousarray"):
        remap_shared(np.zeros((2048, 2048), np.uint8)[:, ::2])
    with pytest.raises(ConfigError, match="int is not a buffer"):
        remap_shared(5)


def test_a_write_between_publish_and_compare_cancels_the_remap(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """If the buffer changes after its content was published, the byte comparison fails: 0, untouched."""
    m = _anon(4 * MiB)
    a = _fill(m)
    real = remap.publish_bytes

    def publish_then_write(data: memoryview, **kw: object) -> Path:
        p = real(data, **kw)  # type: ignore[arg-type]
        a[7] ^= 1  # another thread breaks the caller contract
        return p

    monkeypatch.setattr(remap, "publish_bytes", publish_then_write)
    expect = a.copy()
    expect[7] ^= 1
    assert remap_shared(a, store_dir=tmp_path) == 0
    np.testing.assert_array_equal(a, expect)
    assert _vma(a.ctypes.data)["path"] == ""


def test_a_damaged_store_file_is_reported(tmp_path: Path) -> None:
    """A store file of the wrong size under the digest name is a DedupError that says to clear the store."""
    m = _anon(4 * MiB)
    a = _fill(m)
    d = tmp_path / "default"
    d.mkdir(mode=0o700, parents=True)
    os.chmod(tmp_path, 0o700)
    (d / hashlib.sha256(a.tobytes()).hexdigest()).write_bytes(b"short")
    with pytest.raises(DedupError, match="store is damaged; clear it"):
        remap_shared(a, store_dir=tmp_path)


_CHILD = r"""
import mmap, sys
import numpy as np
from pathlib import Path
from gfaas.dedup.remap import remap_shared
n, store = int(sys.argv[1]), Path(sys.argv[2])
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
a = np.frombuffer(m, np.uint8)
a[:] = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
print(a.ctypes.data, flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "remap":
        print(remap_shared(a, store_dir=store), flush=True)
    elif cmd[0] == "write":
        a[int(cmd[1])] = int(cmd[2])
        print("ok", flush=True)
    elif cmd[0] == "touch":
        print(int(a.sum()), flush=True)  # fault every page in
    elif cmd[0] == "read":
        print(int(a[int(cmd[1])]), flush=True)
"""


class _Child:
    def __init__(self, n: int, store: Path) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", _CHILD, str(n), str(store)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.addr = int(self.ask(None))

    def ask(self, cmd: str | None) -> str:
        assert self.p.stdin is not None and self.p.stdout is not None
        if cmd is not None:
            self.p.stdin.write(cmd + "\n")
            self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def pss(self) -> int:
        return int(_vma(self.addr, self.p.pid)["Pss"])  # type: ignore[call-overload]

    def vma(self) -> dict[str, object]:
        return _vma(self.addr, self.p.pid)

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(timeout=10)


@pytest.mark.timeout(60)
def test_two_processes_share_the_pages_and_write_copy_on_write(tmp_path: Path) -> None:
    """Two processes with identical 16 MiB: each one's PSS for the range halves after both remap; a write by
    one is seen by it alone, and the other and the store file keep the old byte."""
    n = 16 * MiB
    a, b = _Child(n, tmp_path), _Child(n, tmp_path)
    try:
        assert a.pss() >= n and b.pss() >= n  # private anonymous copies (the VMA may hold neighbours too)
        assert a.ask("remap") == b.ask("remap") == str(n)
        for c in (a, b):  # now exactly our range, mapped from the store file
            assert (c.vma()["start"], c.vma()["end"]) == (c.addr, c.addr + n)
        assert a.ask("touch") == b.ask("touch")
        assert a.pss() == b.pss() == n // 2
        off = 3 * PAGE + 11
        old = int(a.ask(f"read {off}"))
        assert a.ask(f"write {off} {(old + 1) % 256}") == "ok"
        assert int(a.ask(f"read {off}")) == (old + 1) % 256
        assert int(b.ask(f"read {off}")) == old
        store_file = next((tmp_path / "default").iterdir())
        assert np.fromfile(store_file, np.uint8)[off] == old
        # a's written page is its own now (anonymous, counted whole); b alone maps the file's copy of it.
        assert a.vma()["Anonymous"] == PAGE and b.vma()["Anonymous"] == 0
        assert a.pss() == (n - PAGE) // 2 + PAGE
        assert b.pss() == (n - PAGE) // 2 + PAGE
    finally:
        a.close()
        b.close()
