"""The CUDA backend: a GPU's store memory, owned by the node daemon.

* Memory: a :class:`~gfaas.policy.pool.SegmentPool` over ``cudaMalloc`` arenas (64 MiB by
  default); an object's segment is a block of an arena, so a put costs no driver call once the
  pool is warm.
* Sharing: each arena's ``cudaIpcGetMemHandle`` is taken once and sent with the first reply naming
  one of its segments; a function process opens it once and keeps it (``device_client``), so a
  same-GPU get is an offset into memory it already mapped.
* Host<->GPU copies: a node segment registered with CUDA (``dataplane.pinned.HostPins``, once per
  warm segment, when its reuse pays) goes by one DMA from the segment itself, on the copying
  thread's own stream. Anything else goes through one :class:`~gfaas.dataplane.staging.CopyEngine`
  per GPU: 2 MiB chunks through a pinned ring (``cudaHostAlloc``) shared by every transfer, two or
  more streams, batches of 5 shared by SLO rates. The ring is never mapped into a function's process.
* GPU<->GPU: ``cudaMemcpyPeerAsync`` (peer access enabled where the hardware allows), waiting on
  that copy's stream only.
* Out of device memory: ``cudaMalloc`` failing with ``cudaErrorMemoryAllocation`` is a
  :class:`~gfaas.errors.CapacityError`, as a full pool is, so the tiers evict and retry.
* Producers' IPC events (from clients that send one) are polled, never synchronised on, and only
  on worker threads: an event whose process exited may never complete (``wait_event``).

Built on CuPy's runtime bindings (``cupy.cuda.runtime``): one dependency gives the IPC, event,
stream and pinned-memory calls and, on the function side, arrays with DLPack and
``__cuda_array_interface__`` (docs/design/gpu-storage.md says why not cuda-python).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
import time
from typing import Any

import numpy as np

from ...errors import CapacityError, ConfigError, DependencyMissing
from ...units import MiB
from ..pinned import HostPins
from ..staging import D2H, H2D, CopyEngine, StagingPlanner
from .device import DEFAULT_TARGET_BYTES, DeviceBackend

log = logging.getLogger("gfaas.dataplane.cuda")

OUT_OF_MEMORY = 2  # cudaErrorMemoryAllocation: CuPy's CUDARuntimeError carries it in .status


def runtime() -> Any:
    """``cupy.cuda.runtime``, or :class:`DependencyMissing` naming the extra."""
    try:
        from cupy.cuda import runtime as rt
    except ImportError as exc:
        raise DependencyMissing(
            "the cuda backend needs CuPy: install the extra that matches the driver's CUDA (nvidia-smi): pip install 'gfaas[gpu]' (CUDA 12) or 'gfaas[gpu-cuda13]' (CUDA 13)"
        ) from exc
    return rt


def gpu_status() -> tuple[int, str]:
    """``(number of CUDA GPUs, reason if none)``; never raises."""
    if os.environ.get("GFAAS_FORCE_NO_GPU"):
        return 0, "GFAAS_FORCE_NO_GPU is set"
    try:
        rt = runtime()
        n = int(rt.getDeviceCount())
    except DependencyMissing as exc:
        return 0, str(exc)
    except Exception as exc:  # CUDARuntimeError: no driver, no device
        return 0, f"no usable CUDA GPU: {exc}"
    return n, "" if n else "the CUDA runtime sees no GPU"


class _DeviceThread(threading.local):
    device: int = -1


_current = _DeviceThread()


def _on(rt: Any, device: int) -> None:
    """Make ``device`` current in this thread (the runtime's current device is per thread)."""
    if _current.device != device:
        rt.setDevice(device)
        _current.device = device


class CudaStagingOps:
    """Staging mechanics on one GPU: the pinned ring, its streams and one event per ring slot."""

    def __init__(self, device: int, ring_bytes: int, chunk_bytes: int, streams: int) -> None:
        self.rt = rt = runtime()
        self.device = device
        _on(rt, device)
        self.ring_ptr = int(rt.hostAlloc(ring_bytes, 0))
        self.ring = memoryview((ctypes.c_uint8 * ring_bytes).from_address(self.ring_ptr)).cast("B")
        self._ring_np = np.frombuffer(self.ring, np.uint8)
        self.streams = [int(rt.streamCreateWithFlags(rt.streamNonBlocking)) for _ in range(streams)]
        self.events = {slot: int(rt.eventCreateWithFlags(rt.eventDisableTiming))
                       for slot in range(0, ring_bytes, chunk_bytes)}

    def stage_in(self, slot: int, src: memoryview) -> None:
        n = src.nbytes
        np.copyto(self._ring_np[slot : slot + n], np.frombuffer(src, np.uint8))  # releases the GIL

    def stage_out(self, slot: int, dst: memoryview) -> None:
        n = dst.nbytes
        np.copyto(np.frombuffer(dst, np.uint8), self._ring_np[slot : slot + n])

    def launch(self, kind: str, slot: int, device_addr: int, nbytes: int, stream: int) -> Any:
        rt = self.rt
        _on(rt, self.device)
        s = self.streams[stream]
        if kind == H2D:
            rt.memcpyAsync(device_addr, self.ring_ptr + slot, nbytes, rt.memcpyHostToDevice, s)
        else:
            rt.memcpyAsync(self.ring_ptr + slot, device_addr, nbytes, rt.memcpyDeviceToHost, s)
        ev = self.events[slot]
        rt.eventRecord(ev, s)
        return ev

    def done(self, token: Any) -> bool:
        return int(self.rt.eventQuery(token)) == 0

    def wait(self, token: Any) -> None:
        self.rt.eventSynchronize(token)

    def close(self) -> None:
        rt = self.rt
        _on(rt, self.device)
        for s in self.streams:
            rt.streamSynchronize(s)
            rt.streamDestroy(s)
        for ev in self.events.values():
            rt.eventDestroy(ev)
        self._ring_np = np.empty(0, np.uint8)
        self.ring.release()
        rt.freeHost(self.ring_ptr)


class CudaBackend(DeviceBackend):
    """Store memory on GPU ``device``; see the module docstring.

    ``cap_bytes`` defaults to ``cap_fraction`` of the GPU's free memory when the daemon starts.
    """

    name = "cuda"

    def __init__(self, device: int = 0, *, cap_bytes: int = 0, cap_fraction: float = 0.5,
                 arena_bytes: int = 64 * MiB, target_bytes: int = DEFAULT_TARGET_BYTES,
                 ring_bytes: int = 32 * MiB, chunk_bytes: int = 2 * MiB, batch_chunks: int = 5,
                 streams: int = 2, stagers: int = 4, link_gbps: float = 50.0,
                 pins: HostPins | None = None) -> None:
        """``pins``: the process's registrations of node host segments (shared by its GPUs); None:
        every host copy goes through the ring."""
        self.rt = rt = runtime()
        n = int(rt.getDeviceCount())
        if not 0 <= device < n:
            raise ConfigError(f"GPU {device} does not exist: this machine has {n} (ordinals 0..{n - 1})")
        _on(rt, device)
        if cap_bytes <= 0:
            if not 0 < cap_fraction <= 1:
                raise ConfigError(f"cap_fraction={cap_fraction} must be in (0, 1]")
            free, _total = rt.memGetInfo()
            cap_bytes = int(free * cap_fraction) // (2 * MiB) * (2 * MiB)
        super().__init__(device, cap_bytes=cap_bytes, arena_bytes=arena_bytes, target_bytes=target_bytes)
        self.host_link_gbps = link_gbps  # peer links stay unknown (0): evictions go to host memory
        for peer in range(n):
            if peer != device and rt.deviceCanAccessPeer(device, peer):
                try:
                    rt.deviceEnablePeerAccess(peer)
                except Exception:  # already enabled
                    pass
        self.ops = CudaStagingOps(device, ring_bytes, chunk_bytes, streams)
        planner = StagingPlanner(ring_bytes, chunk_bytes=chunk_bytes, batch_chunks=batch_chunks, streams=streams,
                                 capacity_gbps=link_gbps)
        self.engine = CopyEngine(planner, self.ops, time.monotonic, stagers=stagers, name=f"gfaas-cuda{device}")
        self._xfer_stream = int(rt.streamCreateWithFlags(rt.streamNonBlocking))
        self._xfer_lock = threading.Lock()
        self._events: dict[bytes, int] = {}  # producers' IPC events, opened once
        self.pins = pins
        self._direct = threading.local()  # each copying thread's own stream for direct DMAs
        self._direct_streams: list[int] = []
        self.direct_copies = 0

    def _event_done(self, event: bytes) -> bool:
        rt = self.rt
        with self._xfer_lock:
            _on(rt, self.device)
            ev = self._events.get(event)
            if ev is None:
                ev = self._events[event] = int(rt.ipcOpenEventHandle(event))
        # Queried, not synchronised on: the base class polls with a bound (the exporter may be gone).
        return int(rt.eventQuery(ev)) == 0

    def _raw_alloc(self, nbytes: int) -> int:
        _on(self.rt, self.device)
        try:
            return int(self.rt.malloc(nbytes))
        except Exception as exc:
            if getattr(exc, "status", None) != OUT_OF_MEMORY:
                raise
            raise CapacityError(
                f"cuda:{self.device} is out of memory: cudaMalloc of {nbytes} bytes failed with"
                f" {self.pool.held} bytes held by the pool; free objects or lower cap_bytes") from exc

    def _raw_free(self, base: int) -> None:
        _on(self.rt, self.device)
        self.rt.free(base)

    def _ipc_handle(self, base: int) -> bytes:
        _on(self.rt, self.device)
        return bytes(self.rt.ipcGetMemHandle(base))

    def _copy_in(self, handle: Any, offset: int, src: memoryview, deadline: float = math.inf) -> None:
        if self._dma(H2D, handle.address + offset, src, src.nbytes):
            self.bytes_host_direct += src.nbytes
        else:
            self.engine.copy(H2D, handle.address + offset, src, deadline)
            self.bytes_host_ring += src.nbytes

    def _copy_out(self, handle: Any, offset: int, nbytes: int, dst: memoryview,
                  deadline: float = math.inf) -> None:
        dst = dst.cast("B")[:nbytes]
        if self._dma(D2H, handle.address + offset, dst, nbytes):
            self.bytes_host_direct += nbytes
        else:
            self.engine.copy(D2H, handle.address + offset, dst, deadline)
            self.bytes_host_ring += nbytes

    def _dma(self, kind: str, device_addr: int, host: memoryview, nbytes: int) -> bool:
        """One DMA between ``host`` and the device, if ``host`` is a registered node segment (see
        ``pins``); returns once it completed. False: not registered, the caller uses the ring."""
        pins = self.pins
        if pins is None or nbytes <= 0:
            return False
        addr = pins.direct(host, write=kind == D2H)
        if addr is None:
            return False
        rt = self.rt
        try:
            _on(rt, self.device)
            s = getattr(self._direct, "stream", None)
            if s is None:
                s = self._direct.stream = int(rt.streamCreateWithFlags(rt.streamNonBlocking))
                with self._xfer_lock:
                    self._direct_streams.append(s)
            try:
                if kind == H2D:
                    rt.memcpyAsync(device_addr, addr, nbytes, rt.memcpyHostToDevice, s)
                else:
                    rt.memcpyAsync(addr, device_addr, nbytes, rt.memcpyDeviceToHost, s)
            except Exception as exc:  # noqa: BLE001 - the copy was refused at launch: the ring still works
                pins.refuse(host, exc)
                return False
            rt.streamSynchronize(s)  # its bytes are in place before the caller publishes anything
        finally:
            pins.done(host)
        self.direct_copies += 1
        return True

    def _transfer(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        rt = self.rt
        with self._xfer_lock:
            _on(rt, self.device)
            d, s = dst.address + dst_offset, src.address + src_offset
            if src.device == dst.device:
                rt.memcpyAsync(d, s, nbytes, rt.memcpyDeviceToDevice, self._xfer_stream)
            else:
                rt.memcpyPeerAsync(d, dst.device, s, src.device, nbytes, self._xfer_stream)
            rt.streamSynchronize(self._xfer_stream)  # this copy's stream only, not the device

    def close(self) -> None:
        self.engine.close()
        self.ops.close()
        _on(self.rt, self.device)
        self.rt.streamDestroy(self._xfer_stream)
        for s in self._direct_streams:
            self.rt.streamSynchronize(s)
            self.rt.streamDestroy(s)
        self._direct_streams.clear()
        super().close()
