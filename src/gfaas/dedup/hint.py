"""The public hint API, process-local: mark what a function wants shared as mergeable.

A hint only marks pages (``madvise(MADV_MERGEABLE)`` on the object's whole pages, see
:mod:`gfaas.dedup.madvise`); KSM merges them when the node's merge controller runs a burst. The worker
reports :func:`take_hinted` bytes to the node daemon, which tells the controller. No sockets here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import DedupError
from .madvise import advise, buffer_span, page_range

log = logging.getLogger("gfaas.dedup")

_lock = threading.Lock()
_hinted = 0
_advised: list[tuple[int, int]] = []  # every range advised, for unmerge_all


@dataclass(frozen=True)
class Hint:
    """What one :func:`merge` did: ``length`` bytes advised from ``start``, of ``requested`` asked."""

    start: int
    length: int
    requested: int


def _record(start: int, nbytes: int) -> None:
    global _hinted
    with _lock:
        _hinted += nbytes
        if nbytes:
            _advised.append((start, nbytes))


def merge(obj: Any) -> Hint:
    """Mark the inward-aligned whole pages of ``obj`` (buffer, numpy array, CPU tensor) mergeable.

    The object must stay alive and unmoved while it should stay merged; a write to a merged page
    copies it back to private memory (only this process's copy changes)."""
    addr, nbytes = buffer_span(obj)
    start, length = page_range(addr, nbytes)
    advise(start, length)
    _record(start, length)
    log.debug("merge hint %#x +%d bytes (%d requested)", start, length, nbytes)
    return Hint(start=start, length=length, requested=nbytes)


def merge_regions(regions: Iterable[tuple[int, int]]) -> int:
    """Advise each ``(start, length)`` range (its whole pages); returns the bytes advised."""
    total = 0
    for addr, nbytes in regions:
        start, length = page_range(addr, nbytes)
        advise(start, length)
        _record(start, length)  # per range: a later failure must not lose what was already advised
        total += length
    return total


def take_hinted() -> int:
    """Bytes advised in this process since the last call (the worker reports them)."""
    global _hinted
    with _lock:
        n, _hinted = _hinted, 0
    return n


def unmerge_all() -> int:
    """Take back every hint of this process (``MADV_UNMERGEABLE``: merged pages are copied back and
    KSM no longer sees them). The runtime asks for it when the node refused the hints (another
    sharing domain holds KSM): memory left mergeable would otherwise be merged by that domain's
    next burst. Ranges unmapped since are skipped. Returns the bytes taken back."""
    global _hinted
    with _lock:
        ranges, _advised[:] = list(_advised), []
        _hinted = 0
    done = 0
    for start, length in ranges:
        try:
            advise(start, length, mergeable=False)
        except DedupError as exc:  # unmapped since (the object was freed): nothing left to unmerge
            log.debug("unmerge %#x +%d: %s", start, length, exc)
            continue
        done += length
    return done
