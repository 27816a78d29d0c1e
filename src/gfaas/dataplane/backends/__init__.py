"""Storage backends: ``host`` (shared memory), ``null`` (records, moves nothing) and the device
backends, ``cuda`` (a GPU's memory pool, loaded lazily from the ``gpu`` extra) and ``null-gpu``
(fake addresses and modelled durations behind the same hooks)."""

from __future__ import annotations

from ...errors import ConfigError
from ...units import GiB
from .base import Backend
from .device import DEFAULT_TARGET_BYTES, DeviceBackend, DeviceSegment, NullDeviceBackend
from .host import HostBackend
from .null import LinkModel, NullBackend, Transfer


def make_backend(name: str) -> Backend:
    if name == "host":
        return HostBackend()
    if name == "null":
        return NullBackend()
    raise ConfigError(f"backend {name!r} is unknown: choose 'host' or 'null'")


def make_device_backends(kind: str, ordinals: tuple[int, ...] | None, cap_bytes: int = 0,
                         floor_bytes: int = DEFAULT_TARGET_BYTES) -> dict[int, DeviceBackend]:
    """One backend per GPU of a :meth:`NodeConfig.device_spec` (``kind`` ``""``: none)."""
    if not kind:
        return {}
    if kind == "null":
        return {i: NullDeviceBackend(i, cap_bytes=cap_bytes or 16 * GiB, target_bytes=floor_bytes)
                for i in ordinals or (0,)}
    from ..pinned import HostPins
    from .cuda import CudaBackend, runtime  # lazily: needs the gpu extra

    ids = ordinals if ordinals is not None else tuple(range(int(runtime().getDeviceCount())))
    pins = HostPins(runtime())  # one per process: a registration is portable across its GPUs
    return {i: CudaBackend(i, cap_bytes=cap_bytes, target_bytes=floor_bytes, pins=pins) for i in ids}


def pin_host_segments(host: Backend, devices: dict[int, DeviceBackend]) -> None:
    """Let the GPUs' registrations of host segments (``CudaBackend.pins``) end before a segment is
    unmapped: the host backend tells them first. A no-op without CUDA GPUs or host segments."""
    pins = next((p for d in devices.values() if (p := getattr(d, "pins", None)) is not None), None)
    if pins is not None and isinstance(host, HostBackend):
        host.before_unmap = pins.release


__all__ = ["Backend", "DeviceBackend", "DeviceSegment", "HostBackend", "LinkModel", "NullBackend",
           "NullDeviceBackend", "Transfer", "make_backend", "make_device_backends", "pin_host_segments"]
