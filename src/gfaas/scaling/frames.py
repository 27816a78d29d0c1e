"""Length-prefixed frames between the manager and its node processes, and between nodes.

One format for both channels (a node's stdin/stdout pipes and the TCP block links)::

    0   magic  b"GFSC"   4 bytes
    4   kind             u8   (an index into KINDS)
    5   reserved         3 bytes, zero
    8   meta length M    u32  (at most MAX_META)
    12  payload length P u64  (at most the reader's limit)
    20  M bytes of JSON (an object), then P payload bytes

The reader checks every field before it reads a payload byte, and lets the caller say where a
payload goes (``into``): a block lands straight in the buffer the node pre-allocated for it, and a
payload of any other size than the buffer's is refused before it is read. Peers are untrusted:
a malformed frame is a :class:`ProtocolError` naming the bad field.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from ..errors import ProtocolError

MAGIC = b"GFSC"
_HEAD = struct.Struct("<4sB3sIQ")
HEAD_BYTES = _HEAD.size
MAX_META = 1 << 20
#: Every message of the scaling protocol. Manager -> node: setup, multicast, start, fwd, export,
#: import, release, warm, stop; node -> manager: ready, armed, block, done, out, state, warmed,
#: error, log;
#: node <-> node: hello, challenge, proof, go, blk, got, pull, refused, hid (a stage's hidden states
#: for the next stage of a pipeline).
KINDS: tuple[str, ...] = (
    "setup", "multicast", "start", "fwd", "export", "import", "release", "warm", "stop",
    "ready", "armed", "block", "done", "out", "state", "warmed", "error", "log",
    "hello", "challenge", "proof", "blk", "pull", "refused", "go", "got", "hid",
)
_CODE = {k: i for i, k in enumerate(KINDS)}


@dataclass
class Frame:
    """One message: its ``kind``, a JSON object ``meta`` and the ``payload`` bytes."""

    kind: str
    meta: dict[str, Any] = field(default_factory=dict)
    payload: bytes | memoryview = b""


class Reader(Protocol):
    def readinto(self, b: Any, /) -> int | None: ...


def encode_head(kind: str, meta: dict[str, Any], payload_len: int) -> bytes:
    """The fixed header and the meta JSON of a frame (the payload follows separately)."""
    code = _CODE.get(kind)
    if code is None:
        raise ProtocolError(f"unknown frame kind {kind!r}; one of {', '.join(KINDS)}")
    body = json.dumps(meta, separators=(",", ":")).encode()
    if len(body) > MAX_META:
        raise ProtocolError(f"frame meta of {len(body)} bytes exceeds {MAX_META}")
    return _HEAD.pack(MAGIC, code, b"\0\0\0", len(body), payload_len) + body


def write_frame(out: IO[bytes], kind: str, meta: dict[str, Any] | None = None,
                payload: bytes | memoryview = b"") -> None:
    """Write one frame to a binary stream and flush it."""
    out.write(encode_head(kind, meta or {}, len(payload)))
    if len(payload):
        out.write(payload)
    out.flush()


def send_frame(sock: Any, kind: str, meta: dict[str, Any] | None = None,
               payload: bytes | memoryview = b"") -> None:
    """Send one frame on a socket (the payload without a copy)."""
    sock.sendall(encode_head(kind, meta or {}, len(payload)))
    if len(payload):
        sock.sendall(payload)


def read_exact_into(src: Reader, buf: memoryview, progress: Callable[[memoryview], object] | None = None) -> None:
    """Fill ``buf`` from ``src``; :class:`ProtocolError` if the stream ends first. ``progress`` sees
    each piece as it lands (a receiver hashes a block while the rest of it is still on the wire)."""
    got = 0
    n = len(buf)
    while got < n:
        k = src.readinto(buf[got:])
        if not k:
            raise ProtocolError(f"stream ended after {got} of {n} bytes")
        if progress is not None:
            progress(buf[got:got + k])
        got += k


def read_frame(src: Reader, max_payload: int,
               into: Callable[[str, dict[str, Any], int], memoryview | None] | None = None,
               progress: Callable[[memoryview], object] | None = None) -> Frame | None:
    """The next frame of ``src`` (None at a clean end of stream, between frames).

    ``into(kind, meta, length)`` may return a buffer of exactly ``length`` bytes to read the payload
    into (the frame's payload is then that buffer), or raise to refuse the frame before its payload
    is read. Payloads over ``max_payload`` are refused. ``progress`` sees the payload piece by piece.
    """
    head = bytearray(HEAD_BYTES)
    mv = memoryview(head)
    first = src.readinto(mv)
    if not first:
        return None
    if first < HEAD_BYTES:
        read_exact_into(src, mv[first:])
    magic, code, reserved, meta_len, payload_len = _HEAD.unpack(head)
    if magic != MAGIC:
        raise ProtocolError(f"frame magic {bytes(magic)!r}, expected {MAGIC!r}")
    if code >= len(KINDS):
        raise ProtocolError(f"frame kind code {code} is unknown (0..{len(KINDS) - 1})")
    if reserved != b"\0\0\0":
        raise ProtocolError(f"frame reserved bytes are {bytes(reserved).hex()}, must be zero")
    if meta_len > MAX_META:
        raise ProtocolError(f"frame meta length {meta_len} exceeds {MAX_META}")
    if payload_len > max_payload:
        raise ProtocolError(f"frame payload of {payload_len} bytes exceeds the limit {max_payload}")
    kind = KINDS[code]
    body = bytearray(meta_len)
    read_exact_into(src, memoryview(body))
    try:
        meta = json.loads(body) if meta_len else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"{kind} frame meta is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise ProtocolError(f"{kind} frame meta is a {type(meta).__name__}, expected a JSON object")
    buf = into(kind, meta, payload_len) if into is not None else None
    if buf is None:
        buf = memoryview(bytearray(payload_len))
    elif len(buf) != payload_len:
        raise ProtocolError(f"{kind} frame carries {payload_len} bytes, the receiver expects {len(buf)}")
    if payload_len:
        read_exact_into(src, buf, progress)
    return Frame(kind, meta, buf)


def need(meta: dict[str, Any], key: str, typ: type | tuple[type, ...]) -> Any:
    """``meta[key]`` if present and of type ``typ`` (bool is not an int), else ProtocolError."""
    v = meta.get(key)
    if not isinstance(v, typ) or (isinstance(v, bool) and typ is int):
        raise ProtocolError(f"frame field {key!r} is {v!r}, expected {typ}")
    return v
