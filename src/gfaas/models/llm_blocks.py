"""Tensor packing: a model block as one contiguous buffer, so it moves as one bulk transfer.

Layout (little-endian)::

    0   magic  b"GFLB"            4 bytes
    4   version                   u16 (1)
    6   reserved                  u16 (0)
    8   block index               u32
    12  block count B             u32
    16  config digest             32 bytes (LlamaConfig.digest())
    48  tensor count n            u32
    52  header length H           u32  (64 + n * 84 rounded up to 64)
    56  data length               u64  (buffer length - H)
    64  n table entries of 84 bytes: name (48 bytes, UTF-8, NUL-padded), dtype code u8, ndim u8,
        2 reserved bytes, 4 x u32 shape (unused dims 0), data offset u64, data bytes u64
    H   tensor data: each tensor at the first multiple of 64 after the previous one (the layout is
        canonical, so any other offset is corrupt); the buffer ends with the last tensor

Unpacking returns ``numpy.frombuffer`` views into the buffer (no copy; read-only when the buffer is
``bytes``). No header byte is ignored: a change to any of them is refused with a :class:`ProtocolError`
(or a :class:`ConfigError` when the block is well formed but of another model). A receiver that places
the buffer at a 64-byte-aligned address (:func:`aligned_buffer`, pre-allocated from
:func:`packed_size`) gets every tensor 64-byte aligned in memory.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import ConfigError, ProtocolError
from .llm_config import LlamaConfig, block_shapes

MAGIC = b"GFLB"
VERSION = 1
ALIGN = 64
_HEAD = struct.Struct("<4sHHII32sIIQ")  # 64 bytes
_ENTRY = struct.Struct("<48sBBH4IQQ")  # 84 bytes
_NAME_BYTES = 48
_MAX_DIMS = 4
_DTYPES: dict[int, np.dtype] = {1: np.dtype("<f4"), 2: np.dtype("<f2")}
_CODES = {dt: code for code, dt in _DTYPES.items()}
assert _HEAD.size == ALIGN and _ENTRY.size == 84


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def header_length(n_tensors: int) -> int:
    return _align(_HEAD.size + n_tensors * _ENTRY.size)


def packed_size(cfg: LlamaConfig, index: int, num_blocks: int) -> int:
    """Bytes of packed block ``index``: a receiver can pre-allocate its buffer before the first byte."""
    shapes = block_shapes(cfg, index, num_blocks)
    end = header_length(len(shapes))
    for shape in shapes.values():
        end = _align(end) + int(np.prod(shape)) * cfg.itemsize
    return end


def aligned_buffer(nbytes: int) -> memoryview:
    """A writable, zero-filled buffer of ``nbytes`` starting at a 64-byte-aligned address."""
    raw = np.zeros(nbytes + ALIGN, dtype=np.uint8)
    skip = (-raw.ctypes.data) % ALIGN
    return raw[skip:skip + nbytes].data


def pack_block(cfg: LlamaConfig, index: int, num_blocks: int, tensors: Mapping[str, np.ndarray]) -> bytes:
    """Pack block ``index`` of ``num_blocks``: exactly the tensors :func:`block_shapes` names, in that
    order, cast to the config's storage dtype."""
    shapes = block_shapes(cfg, index, num_blocks)
    if set(tensors) != set(shapes):
        missing, extra = sorted(set(shapes) - set(tensors)), sorted(set(tensors) - set(shapes))
        raise ConfigError(f"block {index}/{num_blocks}: tensors missing {missing}, unexpected {extra}")
    dtype = np.dtype(cfg.dtype).newbyteorder("<")
    head_len = header_length(len(shapes))
    entries, chunks, offset = [], [], head_len
    for name, shape in shapes.items():
        arr = np.ascontiguousarray(tensors[name], dtype=dtype)
        if arr.shape != shape:
            raise ConfigError(f"tensor {name!r} has shape {arr.shape}, the config needs {shape}")
        offset = _align(offset)
        dims = list(shape) + [0] * (_MAX_DIMS - len(shape))
        entries.append(_ENTRY.pack(name.encode(), _CODES[dtype], len(shape), 0, *dims, offset, arr.nbytes))
        chunks.append((offset, arr))
        offset += arr.nbytes
    buf = bytearray(offset)
    buf[:_HEAD.size] = _HEAD.pack(MAGIC, VERSION, 0, index, num_blocks, cfg.digest(), len(shapes), head_len,
                                  offset - head_len)
    table = b"".join(entries)
    buf[_HEAD.size:_HEAD.size + len(table)] = table
    for off, arr in chunks:
        buf[off:off + arr.nbytes] = arr.tobytes()
    return bytes(buf)


def read_header(buf: bytes | bytearray | memoryview) -> tuple[int, int, bytes]:
    """(block index, block count, config digest) of a packed block, after checking the fixed header."""
    mv = memoryview(buf).cast("B")
    if len(mv) < _HEAD.size:
        raise ProtocolError(f"packed block truncated: {len(mv)} bytes, the header alone needs {_HEAD.size}")
    magic, version, reserved, index, count, digest, n, head_len, data_len = _HEAD.unpack_from(mv, 0)
    if magic != MAGIC:
        raise ProtocolError(f"not a packed model block: magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise ProtocolError(f"packed block version {version}; this gfaas reads version {VERSION}")
    if reserved:
        raise ProtocolError(f"packed block reserved field is {reserved}, must be 0")
    if count < 1 or index >= count:
        raise ProtocolError(f"packed block index {index} of {count} blocks is out of range")
    if head_len != header_length(n):
        raise ProtocolError(f"packed block header length {head_len} does not match {n} tensors "
                            f"({header_length(n)} bytes)")
    if head_len + data_len != len(mv):
        raise ProtocolError(f"packed block is {len(mv)} bytes, its header says {head_len} + {data_len} "
                            f"(truncated or padded in transit)")
    return index, count, bytes(digest)


def unpack_block(buf: bytes | bytearray | memoryview, cfg: LlamaConfig,
                 num_blocks: int | None = None) -> tuple[int, dict[str, np.ndarray]]:
    """(block index, tensors) of a packed block for ``cfg``: zero-copy views into ``buf``.

    Checks every header field and every table entry against the layout ``cfg`` implies (and
    ``num_blocks`` when given) and raises :class:`ProtocolError` for a malformed buffer or
    :class:`ConfigError` for a well-formed block of another model or split.
    """
    mv = memoryview(buf).cast("B")
    index, count, digest = read_header(mv)
    if digest != cfg.digest():
        raise ConfigError(f"packed block {index}/{count} belongs to another model config "
                          f"(digest {digest.hex()[:12]}, expected {cfg.digest().hex()[:12]})")
    if num_blocks is not None and count != num_blocks:
        raise ConfigError(f"packed block {index} is from a split into {count} blocks, expected {num_blocks}")
    try:
        expected = block_shapes(cfg, index, count)
    except ConfigError as exc:
        raise ConfigError(f"packed block {index}/{count} cannot exist for this config: {exc}") from None
    n = _HEAD.unpack_from(mv, 0)[6]
    if n != len(expected):
        raise ProtocolError(f"packed block {index}/{count} lists {n} tensors, the config needs {len(expected)}")
    head_len = header_length(n)
    table_end = _HEAD.size + n * _ENTRY.size
    if any(mv[table_end:head_len]):
        raise ProtocolError(f"packed block {index}: header padding bytes {table_end}..{head_len} are not zero")
    out: dict[str, np.ndarray] = {}
    prev_end = head_len
    for i, (want_name, want_shape) in enumerate(expected.items()):
        raw_name, code, ndim, reserved, *rest = _ENTRY.unpack_from(mv, _HEAD.size + i * _ENTRY.size)
        dims, offset, nbytes = rest[:_MAX_DIMS], rest[_MAX_DIMS], rest[_MAX_DIMS + 1]
        if raw_name != want_name.encode().ljust(_NAME_BYTES, b"\0"):
            raise ProtocolError(f"packed block {index}: tensor {i} is named {raw_name.rstrip(bytes(1))!r}, "
                                f"expected {want_name!r}")
        name = want_name
        if reserved:
            raise ProtocolError(f"packed block {index}: tensor {name!r} has reserved field {reserved}, must be 0")
        dtype = _DTYPES.get(code)
        if dtype is None or dtype != np.dtype(cfg.dtype):
            raise ProtocolError(f"packed block {index}: tensor {name!r} has dtype code {code}, expected "
                                f"{_CODES[np.dtype(cfg.dtype).newbyteorder('<')]} ({cfg.dtype})")
        shape = tuple(dims[:ndim]) if ndim <= _MAX_DIMS else None
        if shape != want_shape or any(dims[ndim:]):
            raise ProtocolError(f"packed block {index}: tensor {name!r} has ndim {ndim} dims {tuple(dims)}, "
                                f"expected shape {want_shape}")
        if offset != _align(prev_end):
            # The layout is canonical (each tensor at the first 64-byte boundary after the previous one),
            # so an offset is either exactly right or corrupt.
            raise ProtocolError(f"packed block {index}: tensor {name!r} at offset {offset}, expected "
                                f"{_align(prev_end)} (the first multiple of {ALIGN} after the previous tensor)")
        if nbytes != int(np.prod(want_shape)) * dtype.itemsize or offset + nbytes > len(mv):
            raise ProtocolError(f"packed block {index}: tensor {name!r} spans bytes {offset}..{offset + nbytes}"
                                f" of a {len(mv)}-byte buffer; expected {int(np.prod(want_shape))} x "
                                f"{dtype.itemsize} bytes inside it")
        out[name] = np.frombuffer(mv, dtype=dtype, count=int(np.prod(want_shape)), offset=offset).reshape(want_shape)
        prev_end = offset + nbytes
    if prev_end != len(mv):
        raise ProtocolError(f"packed block {index}: {len(mv) - prev_end} bytes after the last tensor")
    return index, out


def unpack_blocks(buffers: Sequence[bytes | bytearray | memoryview], cfg: LlamaConfig
                  ) -> tuple[dict[int, dict[str, np.ndarray]], int]:
    """The blocks of one stage, ``({index: tensors}, num_blocks)``: every buffer from the same split
    (the first one's count), no block twice, at least one block. Both stage classes (numpy, torch)
    build from this."""
    blocks: dict[int, dict[str, np.ndarray]] = {}
    count = None
    for buf in buffers:
        if count is None:
            count = read_header(buf)[1]
        index, tensors = unpack_block(buf, cfg, count)
        if index in blocks:
            raise ConfigError(f"block {index} given twice")
        blocks[index] = tensors
    if count is None:
        raise ConfigError("a stage needs at least one packed block")
    return blocks, count
