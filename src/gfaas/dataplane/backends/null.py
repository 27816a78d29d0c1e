"""The null backend: records every transfer with its size and modelled duration, moves no bytes.

Used by unit tests and by the simulator: the store logic runs unchanged while the transfer log
says what a real backend would have moved and how long the model says it would take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .base import Backend


@dataclass(frozen=True)
class LinkModel:
    """Duration of moving ``n`` bytes: ``latency_s + n / bandwidth_bps`` (bytes per second)."""

    latency_s: float = 1e-6
    bandwidth_bps: float = 10e9

    def duration(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth_bps


@dataclass(frozen=True)
class Transfer:
    kind: str  # "alloc", "free", "copy_in", "copy_out", "transfer"
    segment: int
    nbytes: int
    seconds: float
    deadline: float = math.inf  # what the copy was due by (copies through a device's ring)


@dataclass
class NullSegment:
    id: int
    size: int


class NullBackend(Backend):
    name = "null"

    def __init__(self, link: LinkModel | None = None) -> None:
        self.link = link or LinkModel()
        self.log: list[Transfer] = []
        self._next = 0
        self.live: dict[int, NullSegment] = {}

    def _alloc(self, nbytes: int, owner: str = "") -> Any:
        self._next += 1
        seg = NullSegment(self._next, nbytes)
        self.live[seg.id] = seg
        self.log.append(Transfer("alloc", seg.id, nbytes, 0.0))
        return seg

    def _free(self, handle: Any) -> None:
        self.live.pop(handle.id, None)
        self.log.append(Transfer("free", handle.id, handle.size, 0.0))

    def _copy_in(self, handle: Any, offset: int, src: memoryview, deadline: float = math.inf) -> None:
        self.log.append(Transfer("copy_in", handle.id, src.nbytes, self.link.duration(src.nbytes)))

    def _copy_out(self, handle: Any, offset: int, nbytes: int, dst: memoryview,
                  deadline: float = math.inf) -> None:
        self.log.append(Transfer("copy_out", handle.id, nbytes, self.link.duration(nbytes)))

    def _transfer(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        self.log.append(Transfer("transfer", dst.id, nbytes, self.link.duration(nbytes)))
