"""Storage backends by convention: ``null`` (records, moves nothing), ``host`` (shared memory);
``cuda`` comes later behind the same hooks."""

from __future__ import annotations

from ...errors import ConfigError
from .base import Backend
from .host import HostBackend
from .null import LinkModel, NullBackend, Transfer


def make_backend(name: str) -> Backend:
    if name == "host":
        return HostBackend()
    if name == "null":
        return NullBackend()
    raise ConfigError(f"backend {name!r} is unknown: choose 'host' or 'null'")


__all__ = ["Backend", "HostBackend", "LinkModel", "NullBackend", "Transfer", "make_backend"]
