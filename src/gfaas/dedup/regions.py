"""Find the memory a library allocated for itself, from ``/proc/PID/maps``.

An inference runtime (onnxruntime, torch) keeps its own copies of weights in private heap memory that
Python never sees, so a hint on numpy arrays alone does not cover them. Comparing the maps before and
after a session load gives the private anonymous writable ranges the load added; those can be hinted
with :func:`gfaas.dedup.hint.merge_regions`::

    with track_regions() as t:
        sess = ort.InferenceSession(path)
    merge_regions(t.regions)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from ..errors import ConfigError


@dataclass(frozen=True)
class MapEntry:
    """One line of ``/proc/PID/maps``: ``[start, end)``, permissions (``rw-p``), file offset, inode
    and path (empty for anonymous memory, ``[heap]``, ``[stack]``, or a file)."""

    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str


def _parse_line(line: str) -> MapEntry:
    parts = line.split(maxsplit=5)
    if len(parts) < 5 or "-" not in parts[0]:
        raise ConfigError(f"not a /proc/PID/maps line: {line!r}")
    lo, hi = parts[0].split("-", 1)
    return MapEntry(
        start=int(lo, 16),
        end=int(hi, 16),
        perms=parts[1],
        offset=int(parts[2], 16),
        inode=int(parts[4]),
        path=parts[5].strip() if len(parts) > 5 else "",
    )


def read_maps(pid: int | str = "self", proc_root: Path = Path("/proc")) -> list[MapEntry]:
    """The mappings of process ``pid`` (default: this process), in address order."""
    text = (proc_root / str(pid) / "maps").read_text()
    return [_parse_line(line) for line in text.splitlines() if line.strip()]


def _eligible(e: MapEntry) -> bool:
    # Private anonymous writable memory: what malloc, arenas and anonymous mmap hand out. File-backed
    # and shared mappings are never KSM candidates; [stack] changes all the time.
    return e.perms == "rw-p" and e.path in ("", "[heap]") and e.inode == 0


def _subtract(lo: int, hi: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for c_lo, c_hi in covered:  # sorted, non-overlapping
        if c_hi <= lo or c_lo >= hi:
            continue
        if c_lo > lo:
            out.append((lo, c_lo))
        lo = max(lo, c_hi)
        if lo >= hi:
            return out
    out.append((lo, hi))
    return out


def added_regions(before: list[MapEntry], after: list[MapEntry]) -> list[tuple[int, int]]:
    """Private anonymous writable ranges of ``after`` not covered by an eligible range of ``before``
    (new mappings and the grown part of grown ones), as ``(start, length)`` in address order.

    Only *eligible* ranges of ``before`` count as covered: malloc arenas reserve address space
    ``---p`` and make parts of it ``rw-p`` as they grow, and those parts hold the new allocations.
    """
    covered = sorted((e.start, e.end) for e in before if _eligible(e))
    merged: list[tuple[int, int]] = []
    for lo, hi in covered:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    out: list[tuple[int, int]] = []
    for e in sorted((e for e in after if _eligible(e)), key=lambda e: e.start):
        for lo, hi in _subtract(e.start, e.end, merged):
            if hi > lo:
                out.append((lo, hi - lo))
    return out


@dataclass
class RegionTracker:
    """Context manager recording the private anonymous ranges added while its block ran.

    Attributes:
        regions: ``(start, length)`` ranges added (set on exit).
        nbytes: their total size in bytes.
    """

    pid: int | str = "self"
    proc_root: Path = Path("/proc")
    regions: list[tuple[int, int]] = field(default_factory=list)
    nbytes: int = 0
    _before: list[MapEntry] = field(default_factory=list, repr=False)

    def __enter__(self) -> RegionTracker:
        self._before = read_maps(self.pid, self.proc_root)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.regions = added_regions(self._before, read_maps(self.pid, self.proc_root))
        self.nbytes = sum(n for _, n in self.regions)


def track_regions() -> RegionTracker:
    """A :class:`RegionTracker` for this process: ``with track_regions() as t: ...``."""
    return RegionTracker()
