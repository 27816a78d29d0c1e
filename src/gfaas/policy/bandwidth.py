"""SLO-aware sharing of PCIe/NIC bandwidth (seed 000 §6.1, seed 001 §4.3.2).

Host links are the scarce resource, so instead of letting concurrent copies fight over them (what
native PCIe sharing does), each transfer is given a rate:

* its *least rate*: the bandwidth that still lands its remaining bytes by its deadline, where the
  deadline is the invocation's start plus its SLO minus its inference time (the transfer must be
  done by the time the model has to start computing);
* the idle rest of the link goes entirely to the transfer with the tightest deadline, so urgent
  work finishes early without making anyone else late.

Chunks of different transfers are then issued in proportion to those rates, in batches
(:class:`ChunkBatcher`): a chunk cannot be interrupted once started, so issuing everything at once
would lock out newcomers, and issuing one chunk at a time costs a launch per chunk. Host staging
goes through one circular pinned buffer shared by all transfers (:class:`PinnedRing`), so pinned
memory is allocated once instead of per transfer.

All of it is pure: the current time is always passed in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..topology import GB
from .routing import MiB

#: Seed 001 §4.3.2: an SLO is 1.5-2x the service's average execution time.
SLO_FACTOR_RANGE = (1.5, 2.0)
#: The factor both executors use (the simulator and the runtime): SLO = 1.5x execution time, the low
#: end of the papers' range (seed 001 §4.3.2, §6.3).
SLO_FACTOR = SLO_FACTOR_RANGE[0]
#: The least time a deadline leaves a function's transfers (a zero-length execution still gets 1 ms).
MIN_TRANSFER_S = 1e-3


@dataclass(frozen=True)
class Demand:
    """One transfer competing for a link: bytes still to move and the absolute time they are due."""

    transfer: Hashable
    remaining_bytes: int
    deadline: float

    def __post_init__(self) -> None:
        if self.remaining_bytes < 0:
            raise ConfigError(f"Demand {self.transfer!r}: remaining_bytes={self.remaining_bytes} must be >= 0")
        if math.isnan(self.deadline):
            raise ConfigError(f"Demand {self.transfer!r}: deadline is NaN; give an absolute time in seconds")


def deadline_for(start: float, slo_s: float, inference_s: float) -> float:
    """When a function's input must have arrived: start + SLO - inference time."""
    return start + slo_s - inference_s


def rate_least(remaining_bytes: int, deadline: float, now: float) -> float:
    """GB/s needed to move ``remaining_bytes`` by ``deadline`` (seeds' Rate_least).

    Nothing left needs 0. A deadline at or before ``now`` with bytes left cannot be met at any
    finite rate, so it needs ``math.inf``: such a transfer is already late and is served first.
    """
    if remaining_bytes < 0:
        raise ConfigError(f"rate_least: remaining_bytes={remaining_bytes} must be >= 0")
    if remaining_bytes == 0:
        return 0.0
    left = deadline - now
    if left <= 0:
        return math.inf
    return remaining_bytes / GB / left


def slo_rates(demands: Sequence[Demand], capacity_gbps: float, now: float) -> dict[Hashable, float]:
    """Split ``capacity_gbps`` among ``demands``; returns GB/s per transfer, summing to the capacity.

    * Normally each transfer gets its least rate and the idle remainder goes to the one with the
      tightest deadline (among those with bytes left; ties: the earlier in ``demands``).
    * If the least rates add up to more than the capacity (the seeds do not say what to do), every
      least rate is scaled down by the same factor: all transfers miss by the same proportion
      rather than some starving completely.
    * If some transfers are already late (infinite least rate), they share the whole capacity in
      proportion to their remaining bytes, so they all finish as early as they jointly can; the
      others get nothing until then.
    """
    if not (capacity_gbps > 0 and math.isfinite(capacity_gbps)):
        raise ConfigError(f"slo_rates: capacity_gbps={capacity_gbps} must be a positive finite number (GB/s)")
    if not demands:
        return {}
    ids = [d.transfer for d in demands]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"slo_rates: transfer ids {ids!r} repeat; give one Demand per transfer")
    need = [rate_least(d.remaining_bytes, d.deadline, now) for d in demands]
    rates = [0.0] * len(demands)
    late = [i for i, n in enumerate(need) if math.isinf(n)]
    if late:
        total = sum(demands[i].remaining_bytes for i in late)
        for i in late:
            rates[i] = capacity_gbps * demands[i].remaining_bytes / total
        tight = late[0]
    else:
        want = sum(need)
        scale = 1.0 if want <= capacity_gbps else capacity_gbps / want
        rates = [n * scale for n in need]
        pending = [i for i, d in enumerate(demands) if d.remaining_bytes > 0] or list(range(len(demands)))
        tight = min(pending, key=lambda i: (demands[i].deadline, i))
    # The tightest one takes whatever is left, which also absorbs float rounding: the sum is exact.
    rest = capacity_gbps - (sum(rates) - rates[tight])
    rates[tight] = rest if rest > 0 else 0.0
    return dict(zip(ids, rates, strict=True))


def slo_for(exec_time_s: float, factor: float = SLO_FACTOR) -> float:
    """A function's latency SLO: ``factor`` times its execution time (seed 001 §4.3.2: 1.5-2x)."""
    if not exec_time_s > 0:
        raise ConfigError(f"slo_for: exec_time_s={exec_time_s} must be > 0 seconds")
    if not factor > 1:
        raise ConfigError(
            f"slo_for: factor={factor} leaves no time for data transfer; use a factor > 1"
            f" (the papers use {SLO_FACTOR_RANGE[0]}-{SLO_FACTOR_RANGE[1]})"
        )
    return exec_time_s * factor


def input_deadline(start: float, exec_time_s: float, factor: float = SLO_FACTOR) -> float:
    """When the data transfers of a function that starts at ``start`` and computes for
    ``exec_time_s`` are due: ``deadline_for(start, slo_for(exec_time_s, factor), exec_time_s)``, i.e.
    ``start + (factor - 1) x exec_time_s``, and never less than :data:`MIN_TRANSFER_S` after ``start``.

    The simulator gives this deadline to every transfer of a function (inputs and outputs) and the
    runtime records it per function run (``FunctionRecord.deadline_s``), so both take it from here.
    """
    if exec_time_s <= 0:
        return start + MIN_TRANSFER_S
    return max(deadline_for(start, slo_for(exec_time_s, factor), exec_time_s), start + MIN_TRANSFER_S)


class ChunkBatcher:
    """Issues the chunks of concurrent transfers in batches, in proportion to their rates.

    Each call of :meth:`next_batch` hands out up to ``batch_chunks`` chunks. Shares follow deficit
    round-robin: every transfer with bytes left earns ``batch_chunks * rate / sum(rates)`` credit
    per batch, each issued chunk costs one credit, and the transfer with the most credit goes next
    (ties: the one added first). Credit carries over between batches, so over many batches each
    transfer's chunk count stays within about one chunk of its share.

    A transfer added between two batches takes part from the very next one (seed 001 §4.3.2: a
    newcomer preempts bandwidth at the next batch, not after all queued data): its first batch
    starts with one of its chunks, charged to its credit like any other.

    A transfer missing from ``rates`` (or at rate 0) is paused. If every transfer with bytes left
    is paused, the batch is shared equally instead, so data never waits while the link idles.
    """

    def __init__(self, chunk_bytes: int = 2 * MiB, batch_chunks: int = 5) -> None:
        if chunk_bytes <= 0 or batch_chunks <= 0:
            raise ConfigError(
                f"ChunkBatcher(chunk_bytes={chunk_bytes}, batch_chunks={batch_chunks}): both must be > 0"
                " (the papers use 2 MiB chunks, 5 per batch)"
            )
        self.chunk_bytes = chunk_bytes
        self.batch_chunks = batch_chunks
        self._left: dict[Hashable, int] = {}
        self._credit: dict[Hashable, float] = {}
        self._fresh: dict[Hashable, None] = {}

    def add(self, transfer: Hashable, nbytes: int) -> None:
        """Queue ``nbytes`` of a new transfer; it joins from the next batch on."""
        if transfer in self._left:
            raise ConfigError(f"ChunkBatcher: transfer {transfer!r} is already queued; remove it first")
        if nbytes < 0:
            raise ConfigError(f"ChunkBatcher: transfer {transfer!r} has nbytes={nbytes}; it must be >= 0")
        self._left[transfer] = nbytes
        self._credit[transfer] = 0.0
        self._fresh[transfer] = None

    def remove(self, transfer: Hashable) -> None:
        """Forget a transfer (done or cancelled)."""
        if transfer not in self._left:
            raise ConfigError(f"ChunkBatcher: transfer {transfer!r} is not queued; add it first")
        del self._left[transfer], self._credit[transfer]
        self._fresh.pop(transfer, None)

    def remaining(self, transfer: Hashable) -> int:
        """Bytes of ``transfer`` not yet handed out."""
        if transfer not in self._left:
            raise ConfigError(f"ChunkBatcher: transfer {transfer!r} is not queued; add it first")
        return self._left[transfer]

    def next_batch(self, rates: Mapping[Hashable, float]) -> list[tuple[Hashable, int]]:
        """The next batch as ``(transfer, chunk bytes)`` in issue order (the last chunk may be short)."""
        for t, r in rates.items():
            if not r >= 0:
                raise ConfigError(f"ChunkBatcher: rate {r!r} for transfer {t!r} must be >= 0 (GB/s)")
        live = [t for t, n in self._left.items() if n > 0]
        if not live:
            return []
        weight = {t: rates.get(t, 0.0) for t in live}
        total = sum(weight.values())
        if total <= 0:
            weight = dict.fromkeys(live, 1.0)
            total = float(len(live))
        active = [t for t in live if weight[t] > 0]
        for t in active:
            self._credit[t] += self.batch_chunks * weight[t] / total
        out: list[tuple[Hashable, int]] = []
        for t in [t for t in self._fresh if t in weight and weight[t] > 0][: self.batch_chunks]:
            out.append(self._issue(t))
            del self._fresh[t]
        order = {t: i for i, t in enumerate(self._left)}
        while len(out) < self.batch_chunks:
            cands = [t for t in active if self._left[t] > 0]
            if not cands:
                break
            t = max(cands, key=lambda t: (self._credit[t], -order[t]))
            out.append(self._issue(t))
        for t in active:
            if self._left[t] == 0:
                self._credit[t] = 0.0  # finished: no debt or hoard carried into nothing
        return out

    def _issue(self, t: Hashable) -> tuple[Hashable, int]:
        n = min(self.chunk_bytes, self._left[t])
        self._left[t] -= n
        self._credit[t] -= 1.0
        return t, n


class PinnedRing:
    """Bookkeeping of a circular pinned staging buffer of ``capacity_bytes``.

    :meth:`acquire` hands out a contiguous range (never split across the end: a DMA wants one
    range) after the newest live range, wrapping to offset 0 when the end has no room. Space is
    reclaimed oldest first: :meth:`release` of a younger range only marks it, and it is reused once
    every range before it is released too. That is what lets one fixed buffer serve all transfers'
    batches in turn (seed 000 §6.1). The real backend maps offsets onto its pinned allocation.
    """

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ConfigError(f"PinnedRing(capacity_bytes={capacity_bytes}): the capacity must be > 0 bytes")
        self.capacity = capacity_bytes
        self._live: deque[list[int]] = deque()  # [offset, size, released] oldest first
        self._by_off: dict[int, list[int]] = {}

    @property
    def used_bytes(self) -> int:
        """Bytes of ranges handed out and not yet reclaimed (wasted wrap gaps not counted)."""
        return sum(b[1] for b in self._live)

    def live(self) -> list[tuple[int, int]]:
        """``(offset, size)`` of every range not yet released, oldest first."""
        return [(b[0], b[1]) for b in self._live if not b[2]]

    def acquire(self, nbytes: int) -> int | None:
        """Offset of a free range of ``nbytes``, or None if the ring has no room right now."""
        if not 0 < nbytes <= self.capacity:
            raise ConfigError(
                f"PinnedRing.acquire({nbytes}): ask for 1..{self.capacity} bytes (the ring's capacity)"
            )
        if not self._live:
            off: int | None = 0
        else:
            head = self._live[0][0]
            last = self._live[-1]
            tail = last[0] + last[1]
            if last[0] >= head:  # not wrapped: live data is [head, tail)
                off = tail if tail + nbytes <= self.capacity else (0 if nbytes <= head else None)
            else:  # wrapped: free space is [tail, head)
                off = tail if tail + nbytes <= head else None
        if off is None:
            return None
        block = [off, nbytes, 0]
        self._live.append(block)
        self._by_off[off] = block
        return off

    def release(self, offset: int) -> None:
        """Give back the range at ``offset``; space comes back in FIFO order."""
        block = self._by_off.pop(offset, None)
        if block is None:
            raise ConfigError(f"PinnedRing.release({offset}): no live range starts there; pass an offset acquire returned")
        block[2] = 1
        while self._live and self._live[0][2]:
            self._live.popleft()
