"""Validation of object metadata (dtype, shape, size, consumers) shared by client and daemon."""

from __future__ import annotations

import re

from ..errors import ConfigError, ProtocolError

RAW = "raw"  # dtype of objects stored from bytes / memoryview
_DTYPE = re.compile(r"^[<>|=](b1|i1|u1|i2|u2|i4|u4|i8|u8|f2|f4|f8|c8|c16)$")
MAX_NDIM = 32
MAX_CONSUMERS = 256
ALIGN = 64


# Every accepted dtype string and its item size, so the hot path is one dict lookup.
_ITEMSIZE = {
    f"{order}{kind}": (1 if kind == "b1" else int(kind[1:]))
    for order in "<>|="
    for kind in ("b1", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "c16")
}
_ITEMSIZE[RAW] = 1
assert all(_DTYPE.fullmatch(k) for k in _ITEMSIZE if k != RAW)


def itemsize(dtype: str) -> int:
    size = _ITEMSIZE.get(dtype) if isinstance(dtype, str) else None
    if size is None:
        raise ProtocolError(
            f"dtype {dtype!r} is not supported; use a numeric or bool numpy dtype (e.g. '<f4') or 'raw' for bytes"
        )
    return size


def check_meta(nbytes: int, dtype: str, shape: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """Check that ``shape`` and ``dtype`` describe exactly ``nbytes``; return the shape as a tuple."""
    size = itemsize(dtype)
    if not isinstance(nbytes, int) or nbytes < 0:
        raise ProtocolError(f"object size {nbytes!r} is invalid; it must be an integer >= 0")
    if len(shape) > MAX_NDIM or any((not isinstance(d, int)) or d < 0 for d in shape):
        raise ProtocolError(f"shape {list(shape)[:40]} is invalid: at most {MAX_NDIM} non-negative integers")
    n = size
    for d in shape:
        n *= d
    if n != nbytes or (dtype == RAW and len(shape) != 1):
        raise ProtocolError(f"shape {list(shape)} of dtype {dtype} holds {n} bytes, but the object has {nbytes}")
    return tuple(shape)


def check_consumers(consumers: list[str] | None, functions: tuple[str, ...]) -> frozenset[str] | None:
    """``None`` means every function of the invocation may read; otherwise names must be functions."""
    if consumers is None:
        return None
    if len(consumers) > MAX_CONSUMERS:
        raise ConfigError(f"{len(consumers)} consumers given; at most {MAX_CONSUMERS} are allowed")
    unknown = [c for c in consumers if c not in functions]
    if unknown:
        raise ConfigError(
            f"consumers {unknown} are not functions of this invocation; choose from {list(functions)}"
        )
    return frozenset(consumers)


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
