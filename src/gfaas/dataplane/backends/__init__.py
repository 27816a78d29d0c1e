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
    from .cuda import CudaBackend, runtime  # lazily: needs the gpu extra

    ids = ordinals if ordinals is not None else tuple(range(int(runtime().getDeviceCount())))
    return {i: CudaBackend(i, cap_bytes=cap_bytes, target_bytes=floor_bytes) for i in ids}


__all__ = ["Backend", "DeviceBackend", "DeviceSegment", "HostBackend", "LinkModel", "NullBackend",
           "NullDeviceBackend", "Transfer", "make_backend", "make_device_backends"]
