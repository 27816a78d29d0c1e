"""Where an acceleratable function runs: on the in-storage accelerator that holds its input, or on a CPU.

Seed 004 §5.3 in our words: requests are served first come, first served; a storage node whose
accelerator has taken a function is marked *busy* and gets nothing more until it finishes (run to
completion, no preemption); when the accelerator cannot take the function (busy, or absent/unhealthy)
the function fails over to conventional execution on a CPU compute node that reads the data remotely.
A request that finds neither waits in one bounded FIFO queue; when the queue is full it is refused.

Pure and clock-free: the caller (the rack simulator in :mod:`gfaas.sim.dscs` and the runtime, `gfaas.runtime.accel`)
owns time and tells the policy what became free. The decisions:

* :func:`place` -- one arriving request: ``"accel"`` (its home drive is idle and healthy),
  ``"cpu"`` (fail-over: the drive is busy or absent and a CPU is free) or ``"queue"``.
* :class:`FcfsQueue` -- the waiting requests in arrival order. A freed drive takes the *earliest*
  waiting request whose input lives on it; a freed CPU takes the earliest waiting request of all
  (fail-over). Both are O(1) amortised (per-drive FIFOs plus one global FIFO, lazily pruned), so a
  10,000-deep queue costs nothing per event.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError, Overloaded

__all__ = ["ACCEL", "CPU", "QUEUE", "FcfsQueue", "Waiting", "place"]

ACCEL = "accel"
CPU = "cpu"
QUEUE = "queue"


def place(home: int, drive_busy: Sequence[bool], drive_healthy: Sequence[bool], cpus_free: int) -> str:
    """Where a request whose input object lives on drive ``home`` goes now.

    The accelerator first (the data is there, nothing crosses the network); a busy or unhealthy
    drive fails over to a free CPU; with neither, the request queues.
    """
    if not 0 <= home < len(drive_busy):
        raise ConfigError(f"home drive {home} does not exist: there are {len(drive_busy)} drives (0..{len(drive_busy) - 1})")
    if cpus_free < 0:
        raise ConfigError(f"cpus_free={cpus_free}: a count of free CPUs cannot be negative")
    if drive_healthy[home] and not drive_busy[home]:
        return ACCEL
    if cpus_free > 0:
        return CPU
    return QUEUE


@dataclass(frozen=True)
class Waiting:
    """One queued request: its id (arrival order), the drive holding its input, and payload for the caller."""

    rid: int
    home: int
    app: str = ""


class FcfsQueue:
    """The scheduler's bounded FIFO of waiting requests (seed 004 §6.1: depth 10,000)."""

    __slots__ = ("_all", "_by_drive", "_n", "_taken", "depth")

    def __init__(self, depth: int, drives: int) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"queue depth {depth!r}: give a whole number >= 1 (seed 004 uses 10000)")
        if isinstance(drives, bool) or not isinstance(drives, int) or drives < 0:
            raise ConfigError(f"drives={drives!r}: give a whole number >= 0")
        self.depth = depth
        self._all: deque[Waiting] = deque()
        self._by_drive: list[deque[Waiting]] = [deque() for _ in range(drives)]
        self._taken: set[int] = set()
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def push(self, w: Waiting) -> None:
        """Queue ``w`` at the back; a full queue refuses it with :class:`Overloaded`."""
        if self._n >= self.depth:
            raise Overloaded(f"scheduler queue is full ({self._n} of {self.depth} waiting): request {w.rid} for "
                             f"drive {w.home} refused; add platforms or raise the queue depth")
        if not 0 <= w.home < len(self._by_drive):
            raise ConfigError(f"request {w.rid}: home drive {w.home} does not exist ({len(self._by_drive)} drives)")
        self._all.append(w)
        self._by_drive[w.home].append(w)
        self._n += 1

    def _take(self, q: deque[Waiting]) -> Waiting | None:
        while q:
            w = q.popleft()
            if w.rid in self._taken:
                self._taken.discard(w.rid)  # its other copy, already served through the other FIFO
                continue
            self._taken.add(w.rid)
            self._n -= 1
            return w
        return None

    def next_for_drive(self, drive: int) -> Waiting | None:
        """The earliest waiting request whose input lives on ``drive`` (a freed accelerator takes it)."""
        if not 0 <= drive < len(self._by_drive):
            raise ConfigError(f"drive {drive} does not exist ({len(self._by_drive)} drives)")
        return self._take(self._by_drive[drive])

    def next_any(self) -> Waiting | None:
        """The earliest waiting request of all (a freed CPU takes it: fail-over)."""
        return self._take(self._all)
