"""Chunked, pipelined host<->device copies through one pinned ring shared by every transfer.

Three layers, so the real backend, the null backend and the simulator share the decisions:

* :class:`StagingPlanner` (pure): splits transfers into 2 MiB chunks, hands them out in batches of
  5 whose shares follow the SLO rates of :func:`gfaas.policy.slo_rates` (recomputed before every
  batch, so a newcomer with a tight deadline takes bandwidth from the next batch on), gives each
  chunk a slot of the ring (:class:`gfaas.policy.PinnedRing`) and a stream (round robin, so chunk
  i+1 is staged while chunk i is on the link).
* :class:`CopyEngine`: one thread that runs the planner against :class:`StagingOps`, the mechanics
  (``memcpy`` into or out of the ring, an asynchronous DMA and its completion event). The CUDA
  backend passes CUDA ops; tests pass :class:`EmulatedOps` (host memory standing in for a device).
* :func:`model_timeline`: what the same plan would take on a modelled link, without any thread;
  the null backend and the simulator use it for durations.

Ring slots are whole chunks and the ring holds a whole number of batches, so a batch is planned
only when all of its slots are free and planning never has to undo an issued chunk.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ConfigError
from ..policy.bandwidth import ChunkBatcher, Demand, PinnedRing, slo_rates
from ..units import MiB

log = logging.getLogger("gfaas.dataplane.staging")

H2D = "h2d"
D2H = "d2h"


@dataclass(frozen=True, slots=True)
class ChunkOp:
    """One chunk of a transfer: its bytes ``[offset, offset + nbytes)``, ring slot and stream."""

    transfer: Hashable
    index: int
    offset: int
    nbytes: int
    slot: int
    stream: int


@dataclass(slots=True)
class _Plan:
    nbytes: int
    deadline: float
    next_offset: int = 0
    next_index: int = 0
    in_flight: int = 0


class StagingPlanner:
    """Pure chunk planning for concurrent transfers; see the module docstring.

    ``capacity_gbps`` is the link's bandwidth: the SLO rates are shares of it (only their ratios
    reach the batcher, so a rough value is enough)."""

    def __init__(
        self,
        ring_bytes: int = 20 * MiB,
        *,
        chunk_bytes: int = 2 * MiB,
        batch_chunks: int = 5,
        streams: int = 2,
        capacity_gbps: float = 25.0,
    ) -> None:
        if chunk_bytes <= 0 or batch_chunks <= 0:
            raise ConfigError(f"StagingPlanner: chunk_bytes={chunk_bytes} and batch_chunks={batch_chunks} must be > 0")
        if ring_bytes % chunk_bytes or ring_bytes < batch_chunks * chunk_bytes:
            raise ConfigError(
                f"StagingPlanner: ring_bytes={ring_bytes} must be a multiple of chunk_bytes={chunk_bytes} holding"
                f" at least one batch of {batch_chunks} chunks ({batch_chunks * chunk_bytes} bytes)"
            )
        if streams < 1:
            raise ConfigError(f"StagingPlanner: streams={streams} must be >= 1 (2 overlap staging and copying)")
        if not (capacity_gbps > 0 and math.isfinite(capacity_gbps)):
            raise ConfigError(f"StagingPlanner: capacity_gbps={capacity_gbps} must be a positive number (GB/s)")
        self.ring = PinnedRing(ring_bytes)
        self.batcher = ChunkBatcher(chunk_bytes, batch_chunks)
        self.chunk_bytes, self.batch_chunks, self.streams = chunk_bytes, batch_chunks, streams
        self.capacity_gbps = capacity_gbps
        self._plans: dict[Hashable, _Plan] = {}
        self._issued = 0

    @property
    def ring_bytes(self) -> int:
        return self.ring.capacity

    def add(self, transfer: Hashable, nbytes: int, deadline: float = math.inf) -> None:
        """Queue a transfer of ``nbytes`` due at ``deadline`` (absolute seconds; inf: best effort)."""
        if transfer in self._plans:
            raise ConfigError(f"StagingPlanner: transfer {transfer!r} is already queued")
        if nbytes <= 0:
            raise ConfigError(f"StagingPlanner: transfer {transfer!r} has nbytes={nbytes}; it must be > 0")
        self.batcher.add(transfer, nbytes)
        self._plans[transfer] = _Plan(nbytes, deadline)

    def pending(self) -> bool:
        """Whether some transfer still has chunks to hand out."""
        return any(p.next_offset < p.nbytes for p in self._plans.values())

    def can_plan(self) -> bool:
        """A batch is ready and the ring has slots for all of it."""
        free = self.ring.capacity - self.ring.used_bytes
        return self.pending() and free >= self.batch_chunks * self.chunk_bytes

    def rates(self, now: float) -> dict[Hashable, float]:
        demands = [Demand(t, p.nbytes - p.next_offset, p.deadline)
                   for t, p in self._plans.items() if p.next_offset < p.nbytes]
        return slo_rates(demands, self.capacity_gbps, now) if demands else {}

    def plan(self, now: float) -> list[ChunkOp]:
        """The next batch, each chunk with its slot and stream; ``[]`` if nothing can go now."""
        if not self.can_plan():
            return []
        ops = []
        for t, n in self.batcher.next_batch(self.rates(now)):
            p = self._plans[t]
            slot = self.ring.acquire(self.chunk_bytes)
            assert slot is not None  # can_plan checked room for the whole batch
            ops.append(ChunkOp(t, p.next_index, p.next_offset, n, slot, self._issued % self.streams))
            p.next_offset += n
            p.next_index += 1
            p.in_flight += 1
            self._issued += 1
        return ops

    def done(self, op: ChunkOp) -> bool:
        """A chunk finished and its slot is free again; True if that completed its transfer."""
        self.ring.release(op.slot)
        p = self._plans[op.transfer]
        p.in_flight -= 1
        if p.in_flight == 0 and p.next_offset >= p.nbytes:
            del self._plans[op.transfer]
            self.batcher.remove(op.transfer)
            return True
        return False


# ---- the modelled executor ----------------------------------------------------------------------
@dataclass(frozen=True)
class StagingModel:
    """Durations of the pipeline's steps: host memcpy into/out of the ring (``stage_gbps`` per
    staging thread, ``stagers`` threads), and the DMA (``link_gbps`` shared by all streams, plus
    ``launch_s`` per chunk)."""

    link_gbps: float = 25.0
    stage_gbps: float = 10.0
    stagers: int = 4
    launch_s: float = 5e-6

    def __post_init__(self) -> None:
        if not (self.link_gbps > 0 and self.stage_gbps > 0 and self.stagers >= 1 and self.launch_s >= 0):
            raise ConfigError(f"StagingModel{self!r}: rates must be > 0, stagers >= 1, launch_s >= 0")


@dataclass(frozen=True, slots=True)
class Step:
    """One chunk in a modelled timeline."""

    op: ChunkOp
    batch: int
    stage_start: float
    stage_end: float
    dma_start: float
    dma_end: float


def model_timeline(
    planner: StagingPlanner,
    kind: str,
    model: StagingModel,
    arrivals: list[tuple[float, Hashable, int, float]] | None = None,
    start: float = 0.0,
) -> tuple[list[Step], dict[Hashable, float]]:
    """Run ``planner`` against ``model``: returns every chunk's times and each transfer's finish.

    ``arrivals`` are ``(time, transfer, nbytes, deadline)`` added when the clock reaches them
    (transfers already in ``planner`` start at ``start``). H2D stages then copies a chunk; D2H
    copies then stages. Staging threads and the link are each first come, first served; a
    stream runs its chunks in order.
    """
    if kind not in (H2D, D2H):
        raise ConfigError(f"model_timeline: kind={kind!r}; use 'h2d' or 'd2h'")
    todo = deque(sorted(arrivals or [], key=lambda a: a[0]))
    now = start
    stagers = [start] * model.stagers
    link_free = start
    stream_free = [start] * planner.streams
    releases: list[tuple[float, ChunkOp]] = []  # (slot free time, op), not yet applied
    steps: list[Step] = []
    finish: dict[Hashable, float] = {}
    batch = 0
    bps = 1e9

    def stage(ready: float, n: int) -> tuple[float, float]:
        i = min(range(len(stagers)), key=stagers.__getitem__)
        s = max(ready, stagers[i])
        stagers[i] = s + n / (model.stage_gbps * bps)
        return s, stagers[i]

    while True:
        while todo and todo[0][0] <= now:
            _, t, n, d = todo.popleft()
            planner.add(t, n, d)
        ops = planner.plan(now)
        if ops:
            batch += 1
            for op in ops:
                if kind == H2D:
                    s0, s1 = stage(now, op.nbytes)
                    d0 = max(s1, link_free, stream_free[op.stream])
                    d1 = d0 + model.launch_s + op.nbytes / (model.link_gbps * bps)
                    link_free = stream_free[op.stream] = d1
                    end = d1
                else:
                    d0 = max(now, link_free, stream_free[op.stream])
                    d1 = d0 + model.launch_s + op.nbytes / (model.link_gbps * bps)
                    link_free = stream_free[op.stream] = d1
                    s0, s1 = stage(d1, op.nbytes)
                    end = s1
                steps.append(Step(op, batch, s0, s1, d0, d1))
                releases.append((end, op))
            continue
        # Nothing to plan now: move the clock to the next slot release or arrival.
        if not releases and not todo:
            break
        nxt = min([r[0] for r in releases] + ([todo[0][0]] if todo else []))
        now = max(now, nxt)
        for r in sorted([r for r in releases if r[0] <= now], key=lambda r: r[0]):
            releases.remove(r)
            if planner.done(r[1]):
                finish[r[1].transfer] = r[0]
    return steps, finish


# ---- the threaded executor ----------------------------------------------------------------------
class StagingOps(Protocol):
    """Mechanics of one device's staging pipeline (see :class:`EmulatedOps` for the contract)."""

    def stage_in(self, slot: int, src: memoryview) -> None: ...

    def stage_out(self, slot: int, dst: memoryview) -> None: ...

    def launch(self, kind: str, slot: int, device_addr: int, nbytes: int, stream: int) -> Any: ...

    def done(self, token: Any) -> bool: ...

    def wait(self, token: Any) -> None: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class _Job:
    kind: str
    device_addr: int
    host: memoryview
    future: Future[None]


class CopyEngine:
    """Runs every host<->device copy of one device through the planner, in one thread.

    :meth:`copy` blocks the caller until its transfer is done; many callers (the daemon's worker
    threads) may copy at once and share the ring and the link by the planner's SLO rates.
    """

    def __init__(self, planner: StagingPlanner, ops: StagingOps, now: Callable[[], float],
                 stagers: int = 4, name: str = "gfaas-copy") -> None:
        self.planner, self.ops, self._now = planner, ops, now
        self._cv = threading.Condition()
        self._new: list[tuple[Hashable, _Job, float]] = []
        self._jobs: dict[Hashable, _Job] = {}
        self._next = 0
        self._closed = False
        self._stagers = ThreadPoolExecutor(max(1, stagers), thread_name_prefix=f"{name}-stage")
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.batches = 0

    def copy(self, kind: str, device_addr: int, host: memoryview, deadline: float = math.inf) -> None:
        """Move ``host.nbytes`` bytes between ``host`` and the device address (``kind``: h2d/d2h)."""
        self.submit(kind, device_addr, host, deadline).result()

    def submit(self, kind: str, device_addr: int, host: memoryview, deadline: float = math.inf) -> Future[None]:
        if kind not in (H2D, D2H):
            raise ConfigError(f"CopyEngine: kind={kind!r}; use 'h2d' or 'd2h'")
        fut: Future[None] = Future()
        host = host.cast("B")
        if host.nbytes == 0:
            fut.set_result(None)
            return fut
        with self._cv:
            if self._closed:
                raise ConfigError("CopyEngine is closed; the backend was shut down")
            self._next += 1
            self._new.append((self._next, _Job(kind, device_addr, host, fut), deadline))
            self._cv.notify()
        return fut

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()
        self._stagers.shutdown()

    def _run(self) -> None:
        in_flight: deque[tuple[ChunkOp, Any, Future[None] | None]] = deque()
        while True:
            with self._cv:
                while not self._new and not in_flight and not self._closed and not self.planner.pending():
                    self._cv.wait()
                if self._closed and not self._new and not in_flight and not self.planner.pending():
                    return
                new, self._new = self._new, []
            for tid, job, deadline in new:
                self._jobs[tid] = job
                self.planner.add(tid, job.host.nbytes, deadline)
            try:
                ops = self.planner.plan(self._now())
                if ops:
                    self.batches += 1
                    self._issue(ops, in_flight)
                elif in_flight:
                    self._retire(in_flight)
            except BaseException as exc:  # a failed copy fails its callers, never hangs them
                log.exception("copy engine: a transfer failed")
                self._fail_all(exc, in_flight)

    def _issue(self, ops: list[ChunkOp], in_flight: deque[tuple[ChunkOp, Any, Future[None] | None]]) -> None:
        staged: list[Future[None] | None] = []
        for op in ops:
            job = self._jobs[op.transfer]
            if job.kind == H2D:
                src = job.host[op.offset : op.offset + op.nbytes]
                staged.append(self._stagers.submit(self.ops.stage_in, op.slot, src))
            else:
                staged.append(None)
        for op, st in zip(ops, staged, strict=True):
            job = self._jobs[op.transfer]
            if st is not None:
                st.result()  # the DMA of chunk i waits for its memcpy only, not for chunk i+1's
            tok = self.ops.launch(job.kind, op.slot, job.device_addr + op.offset, op.nbytes, op.stream)
            in_flight.append((op, tok, None))

    def _retire(self, in_flight: deque[tuple[ChunkOp, Any, Future[None] | None]]) -> None:
        """Wait for the oldest launched chunk, take every later one already landed with it, and give
        their slots back. A D2H chunk's slot comes back only once its bytes left the ring: those
        copies run on the stager threads at once, one per chunk, so the host side of a GPU -> host
        transfer is as parallel as its H2D staging (on the engine thread alone it was one memcpy
        at a time: the first H100 run had GPU -> host through the ring below pageable memory)."""
        ready = [in_flight.popleft()]
        self.ops.wait(ready[0][1])
        while in_flight and self.ops.done(in_flight[0][1]):  # landed meanwhile, in launch order
            ready.append(in_flight.popleft())
        outs = []
        for op, _tok, _ in ready:
            job = self._jobs[op.transfer]
            if job.kind == D2H:
                outs.append(self._stagers.submit(self.ops.stage_out, op.slot,
                                                 job.host[op.offset : op.offset + op.nbytes]))
        error: BaseException | None = None
        for fut in outs:
            exc = fut.exception()  # every copy out of the ring ends before any slot is reused
            error = error or exc
        if error is not None:
            raise error
        for op, _tok, _ in ready:
            job = self._jobs[op.transfer]
            if self.planner.done(op):
                del self._jobs[op.transfer]
                job.future.set_result(None)

    def _fail_all(self, exc: BaseException, in_flight: deque[Any]) -> None:
        # Chunks already launched still read or write their ring slots: let them land before the
        # fresh planner hands those slots to the next transfer (a stale D2H would overwrite its data).
        for _op, tok, _ in in_flight:
            try:
                self.ops.wait(tok)
            except Exception:  # the device may be gone too; nothing more to wait for then
                log.warning("copy engine: waiting for a launched chunk after a failure failed", exc_info=True)
        in_flight.clear()
        for job in self._jobs.values():
            if not job.future.done():
                job.future.set_exception(exc)
        self._jobs.clear()
        ring = self.planner.ring_bytes
        self.planner = StagingPlanner(ring, chunk_bytes=self.planner.chunk_bytes,
                                      batch_chunks=self.planner.batch_chunks, streams=self.planner.streams,
                                      capacity_gbps=self.planner.capacity_gbps)


class EmulatedOps:
    """Staging ops over host memory: ``device`` stands in for device memory (address = offset).

    Copies happen at :meth:`launch`; the token records them so tests can check the order in which
    chunks went and that no slot was reused while its chunk was in flight."""

    def __init__(self, device: bytearray | memoryview, ring_bytes: int) -> None:
        self.device = memoryview(device).cast("B")
        self.ring = memoryview(bytearray(ring_bytes))
        self.log: list[tuple[str, int, int, int, int]] = []  # (kind, slot, addr, nbytes, stream)
        self._lock = threading.Lock()

    def stage_in(self, slot: int, src: memoryview) -> None:
        self.ring[slot : slot + src.nbytes] = src

    def stage_out(self, slot: int, dst: memoryview) -> None:
        dst[:] = self.ring[slot : slot + dst.nbytes]

    def launch(self, kind: str, slot: int, device_addr: int, nbytes: int, stream: int) -> Any:
        with self._lock:
            self.log.append((kind, slot, device_addr, nbytes, stream))
        if kind == H2D:
            self.device[device_addr : device_addr + nbytes] = self.ring[slot : slot + nbytes]
        else:
            self.ring[slot : slot + nbytes] = self.device[device_addr : device_addr + nbytes]
        return len(self.log)

    def done(self, token: Any) -> bool:
        return True

    def wait(self, token: Any) -> None:
        return None

    def close(self) -> None:
        return None
