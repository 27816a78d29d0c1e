"""The cross-node pull protocol's frames (owner <-> puller), and the socket helpers both ends use.

Pull protocol on TCP: frames of a 4-byte big-endian length and a MessagePack-encoded msgspec struct
(at most 64 KiB; never pickle). The puller sends :class:`Pull` (object ID + the reading function's
token); the owner authenticates the token against its own registry (the platform opens a multi-node
invocation on every node with the same ID and tokens), checks access exactly as a local ``get``
would, and answers :class:`Header` followed by :class:`Chunk` frames, each followed by that many raw
bytes, sent back to back (pipelined). The puller answers :class:`Received` once every byte is in; only
then does the owner count the read as a consumption (freeing the object once all its declared
consumers have read it) and confirm with :class:`Consumed`. Errors travel as :class:`Fail` frames and
are raised on the puller as the same gfaas error class.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgspec

from ..errors import ProtocolError, RemoteError
from ..units import MiB

WIRE_VERSION = 1
MAX_CONTROL_FRAME = 64 * 1024
MAX_CHUNK = 64 * MiB  # the most raw bytes a puller accepts behind one Chunk frame


class _Wire(msgspec.Struct, tag=True, array_like=True, frozen=True):
    pass


class Pull(_Wire, frozen=True):
    """Puller -> owner: send me this object; I am the function holding ``token``."""

    id: bytes
    token: str
    version: int = WIRE_VERSION


class Received(_Wire, frozen=True):
    """Puller -> owner: every byte arrived; count the read."""


class Header(_Wire, frozen=True):
    """Owner -> puller: the object's metadata; ``nbytes`` raw bytes follow in :class:`Chunk` frames."""

    id: bytes
    invocation: str
    producer: str
    consumers: list[str] | None
    nbytes: int
    dtype: str
    shape: list[int]


class Chunk(_Wire, frozen=True):
    """Owner -> puller: ``nbytes`` raw bytes follow this frame."""

    nbytes: int


class Consumed(_Wire, frozen=True):
    """Owner -> puller: the read was counted."""


class Fail(_Wire, frozen=True):
    """Either way: the request failed with the gfaas error ``code``."""

    code: str
    message: str


_enc = msgspec.msgpack.Encoder()
to_owner = msgspec.msgpack.Decoder(Pull | Received | Fail)
to_puller = msgspec.msgpack.Decoder(Header | Chunk | Consumed | Fail)
_LEN = struct.Struct(">I")


class Closed(ConnectionError):
    """The peer closed the connection (possibly in the middle of a frame)."""


def encode_frame(msg: _Wire) -> bytes:
    body = _enc.encode(msg)
    return _LEN.pack(len(body)) + body


def recv_exact(sock: socket.socket, mv: memoryview) -> None:
    got, n = 0, len(mv)
    while got < n:
        k = sock.recv_into(mv[got:])
        if k == 0:
            raise Closed(f"connection closed after {got} of {n} bytes")
        got += k


def read_frame(sock: socket.socket, decoder: msgspec.msgpack.Decoder[Any]) -> Any:
    """Read one length-prefixed control frame; :class:`ProtocolError` if oversize or malformed."""
    head = bytearray(4)
    recv_exact(sock, memoryview(head))
    (n,) = _LEN.unpack(head)
    if n > MAX_CONTROL_FRAME:
        raise ProtocolError(f"control frame of {n} bytes exceeds the {MAX_CONTROL_FRAME}-byte limit")
    body = bytearray(n)
    recv_exact(sock, memoryview(body))
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed transfer frame ({n} bytes): {exc}") from None


def send_all(sock: socket.socket, parts: list[bytes | memoryview]) -> None:
    """``sendall`` of several buffers with as few system calls as possible (partial sends handled)."""
    bufs = [memoryview(p).cast("B") for p in parts if len(p)]
    while bufs:
        sent = sock.sendmsg(bufs)
        while sent:
            if sent >= len(bufs[0]):
                sent -= len(bufs[0])
                bufs.pop(0)
            else:
                bufs[0] = bufs[0][sent:]
                sent = 0


def split_address(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise RemoteError(f"malformed transfer address {addr!r} in the global directory")
    return host.strip("[]"), int(port)
