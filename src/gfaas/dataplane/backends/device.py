"""What every device backend shares: a :class:`~gfaas.policy.pool.SegmentPool` per device,
segments as blocks of its arenas, and exports as :class:`~gfaas.dataplane.protocol.DeviceRef`.

:class:`DeviceBackend` leaves four things to its subclass: the raw allocation of an arena, its
IPC handle, the host<->device copies and device<->device copies.

*Arenas other processes may have open.* ``cudaFree`` of memory another process still has mapped
through CUDA IPC is undefined, so an arena the pool returns (``free``, ``trim``, ``set_target``,
an eviction emptying it, ``close``) is only *retired*: announced in :meth:`collect_gone` and freed
by :meth:`release_arena` once the daemon knows every process it was sent to closed it. One whose
handle was never exported is freed at once. :class:`NullDeviceBackend` does
them with fake addresses and modelled durations (CPU tests, simulator); ``cuda.CudaBackend`` with
CUDA.
"""

from __future__ import annotations

import hashlib
import math
import threading
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from ...policy.pool import Block, SegmentPool
from ...units import MiB
from ..device_client import EVENT_TIMEOUT_S, wait_until
from ..protocol import DeviceRef
from ..staging import D2H, H2D, StagingModel, StagingPlanner, model_timeline
from .base import Backend
from .null import Transfer

DEFAULT_TARGET_BYTES = 300 * 1000 * 1000  # the papers' pool floor (seed 001 §4.4.1)


@dataclass(slots=True)
class DeviceSegment:
    device: int
    block: Block
    size: int

    @property
    def address(self) -> int:
        return self.block.address


class DeviceBackend(Backend):
    """A device's store memory: blocks of a pool of raw arenas; see the module docstring."""

    name = "device"
    #: Link speeds the eviction policy compares (``migration_target``): a GPU's host link, and its
    #: link to a peer GPU (0: none known, so evicted objects go to host memory).
    host_link_gbps: float = 25.0
    peer_link_gbps: float = 0.0
    #: How long :meth:`wait_event` polls a producer's event before failing (it may never complete).
    event_timeout_s: float = EVENT_TIMEOUT_S
    #: Bytes copied between host memory and this device, by route: one DMA from a registered node
    #: segment, or staged through the pinned ring (a backend without routes counts neither). They say
    #: where a run's host <-> GPU time went (daemon stats, ``gfaas demo --gpu``'s node counters).
    bytes_host_direct: int = 0
    bytes_host_ring: int = 0

    def __init__(self, device: int, *, cap_bytes: int, arena_bytes: int = 64 * MiB,
                 target_bytes: int = DEFAULT_TARGET_BYTES) -> None:
        if device < 0:
            raise ConfigError(f"device={device}: GPU ordinals are >= 0")
        self.device = device
        self.gone: list[int] = []  # arenas retired since the daemon last collected them
        self.retired: dict[int, int] = {}  # arena serial -> base: returned by the pool, not freed yet
        self._dropped_base = -1
        self.pool = SegmentPool(self._raw_alloc, self._retire_base, cap_bytes=cap_bytes, arena_bytes=arena_bytes,
                                serial_base=device << 32,
                                target_bytes=min(target_bytes, cap_bytes), name=f"{self.name}:{device}",
                                on_arena_freed=self._arena_returned)
        self._handles: dict[int, bytes] = {}
        # Bytes moved over this GPU's links, for the node's stats stream (Daemon Snapshot): copies run
        # on worker threads outside the daemon's lock, so the adds take a lock of their own (one
        # uncontended acquire per copy, nothing per byte).
        self._moved_lock = threading.Lock()
        self.bytes_h2d = 0
        self.bytes_d2h = 0
        self.bytes_peer_in: dict[int, int] = {}  # source GPU -> bytes it sent here (this GPU's own: on-device)

    # ---- public wrappers, counting what crossed a link ------------------------------------------
    def copy_in(self, handle: Any, offset: int, src: memoryview, deadline: float = math.inf) -> None:
        super().copy_in(handle, offset, src, deadline)
        with self._moved_lock:
            self.bytes_h2d += src.nbytes

    def copy_out(self, handle: Any, offset: int, nbytes: int, dst: memoryview, deadline: float = math.inf) -> None:
        super().copy_out(handle, offset, nbytes, dst, deadline)
        with self._moved_lock:
            self.bytes_d2h += nbytes

    def transfer(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        super().transfer(src, src_offset, dst, dst_offset, nbytes)
        source = getattr(src, "device", self.device)
        with self._moved_lock:
            self.bytes_peer_in[source] = self.bytes_peer_in.get(source, 0) + nbytes

    def moved(self) -> tuple[int, int, dict[int, int]]:
        """Bytes copied host -> this GPU, this GPU -> host, and into it per source GPU, since start."""
        with self._moved_lock:
            return self.bytes_h2d, self.bytes_d2h, dict(self.bytes_peer_in)

    # ---- Backend hooks -----------------------------------------------------------------------
    def _alloc(self, nbytes: int, owner: str = "") -> Any:
        # An IPC handle maps its whole arena: the pool keeps each arena to one owner (policy.pool).
        block = self.pool.alloc(nbytes, owner)
        return DeviceSegment(self.device, block, block.size)

    def _free(self, handle: Any) -> None:
        self.pool.free(handle.block)

    def export(self, handle: Any, writable: bool) -> DeviceRef:
        b = handle.block
        h = self._handles.get(b.arena)
        if h is None:
            h = self._handles[b.arena] = self._ipc_handle(b.base)
        return DeviceRef(self.device, b.arena, h, b.offset, handle.size)

    def _retire_base(self, base: int) -> None:
        self._dropped_base = base  # the pool names the arena's serial next (_arena_returned)

    def _arena_returned(self, serial: int) -> None:
        base, self._dropped_base = self._dropped_base, -1
        if self._handles.pop(serial, None) is None:
            self._raw_free(base)  # never exported: no other process can have it open
        else:
            self.retired[serial] = base
            self.gone.append(serial)

    def collect_gone(self) -> list[int]:
        """Arenas retired since the last call: each holder must close its handle, then the daemon
        calls :meth:`release_arena`."""
        out, self.gone[:] = list(self.gone), []
        return out

    def release_arena(self, serial: int) -> None:
        """Free a retired arena: no process has it open any more."""
        base = self.retired.pop(serial, None)
        if base is not None:
            self._raw_free(base)

    def wait_event(self, event: bytes) -> None:
        """Block this thread (only) until a producer's IPC event has completed, polling, for at
        most :attr:`event_timeout_s` (:class:`~gfaas.errors.DataPlaneError` then)."""
        wait_until(lambda: self._event_done(event), self.event_timeout_s,
                   f"producer event {event[:8].hex()} on GPU {self.device}")

    def _event_done(self, event: bytes) -> bool:
        """Whether a producer's IPC event has completed (``cudaEventQuery``)."""
        return True

    def free_bytes(self) -> int | None:
        """Free memory of the device for the pool target's cap (``None``: the pool's cap bounds it)."""
        return None

    def close(self) -> None:
        """Free everything, retired arenas too: the daemon is going away."""
        self.pool.close()
        for serial in list(self.retired):
            self.release_arena(serial)
        self.gone.clear()

    # ---- subclass mechanics ----------------------------------------------------------------
    @abstractmethod
    def _raw_alloc(self, nbytes: int) -> int: ...

    @abstractmethod
    def _raw_free(self, base: int) -> None: ...

    @abstractmethod
    def _ipc_handle(self, base: int) -> bytes: ...


class NullDeviceBackend(DeviceBackend):
    """A device that holds no bytes: fake addresses, fake IPC handles, modelled copy durations.

    Copies go through the same :class:`~gfaas.dataplane.staging.StagingPlanner` the CUDA backend
    uses, timed by :func:`~gfaas.dataplane.staging.model_timeline`; ``log`` records each with its
    modelled duration (the null backend's :class:`~gfaas.dataplane.backends.null.Transfer`)."""

    name = "null-gpu"

    def __init__(self, device: int = 0, *, cap_bytes: int = 16 * 1024 * MiB, model: StagingModel | None = None,
                 peer_gbps: float = 25.0, ring_bytes: int = 20 * MiB, **kw: Any) -> None:
        self._next_base = (device + 1) << 44
        super().__init__(device, cap_bytes=cap_bytes, **kw)
        self.model = model or StagingModel()
        self.peer_gbps = peer_gbps
        self.ring_bytes = ring_bytes
        self.log: list[Transfer] = []
        self.raw: dict[int, int] = {}
        self.events_waited: list[bytes] = []
        self.host_link_gbps = self.model.link_gbps
        self.peer_link_gbps = peer_gbps

    @classmethod
    def from_topology(cls, topology: Any, device: int = 0, **kw: Any) -> NullDeviceBackend:
        """A null GPU whose host link is ``gpu<device>``'s PCIe link in ``topology`` (a
        :class:`~gfaas.topology.Topology`) and whose peer rate is its fastest NVLink."""
        name = f"gpu{device}"
        mine = [lk for lk in topology.links if name in (lk.a, lk.b)]
        pcie = [lk.gbps for lk in mine if lk.kind == "pcie"]
        if not pcie:
            raise ConfigError(f"topology {topology.name!r} has no PCIe link to {name}; pick a GPU it has")
        nvl = [lk.gbps for lk in mine if lk.kind == "nvlink"]
        return cls(device, model=StagingModel(link_gbps=min(pcie)), peer_gbps=max(nvl, default=topology.pcie_p2p_gbps),
                   **kw)

    def _raw_alloc(self, nbytes: int) -> int:
        base = self._next_base
        self._next_base += nbytes + (1 << 32)  # gaps: an overrun would not alias the next arena
        self.raw[base] = nbytes
        return base

    def _raw_free(self, base: int) -> None:
        del self.raw[base]

    def _ipc_handle(self, base: int) -> bytes:
        return hashlib.blake2b(f"{self.device}:{base}".encode(), digest_size=64).digest()

    def wait_event(self, event: bytes) -> None:
        self.events_waited.append(event)
        super().wait_event(event)

    def staged_seconds(self, kind: str, nbytes: int) -> float:
        """Modelled time of one host<->device copy of ``nbytes`` through the ring, alone on the link."""
        planner = StagingPlanner(self.ring_bytes, capacity_gbps=self.model.link_gbps)
        planner.add(0, nbytes)
        _, finish = model_timeline(planner, kind, self.model)
        return finish[0]

    def _copy_in(self, handle: Any, offset: int, src: memoryview, deadline: float = math.inf) -> None:
        self.log.append(Transfer("copy_in", handle.block.arena, src.nbytes, self.staged_seconds(H2D, src.nbytes),
                                 deadline))

    def _copy_out(self, handle: Any, offset: int, nbytes: int, dst: memoryview,
                  deadline: float = math.inf) -> None:
        self.log.append(Transfer("copy_out", handle.block.arena, nbytes, self.staged_seconds(D2H, nbytes),
                                 deadline))

    def _transfer(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        # Another GPU's segment arrives over the peer link; one on this GPU is a device-memory copy.
        gbps = self.peer_gbps if src.device != dst.device else 1000.0
        self.log.append(Transfer("transfer", dst.block.arena, nbytes, self.model.launch_s + nbytes / (gbps * 1e9)))
