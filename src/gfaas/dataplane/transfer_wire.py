"""The cross-node pull protocol's frames (owner <-> puller), and the socket helpers both ends use.

Pull protocol on TCP: frames of a 4-byte big-endian length and a MessagePack-encoded msgspec struct
(at most 64 KiB; never pickle). A connection starts with a mutual proof of the cluster key
(:mod:`gfaas.dataplane.peer_auth`): the puller sends :class:`Hello` (its node ID, the node it means to
reach, a fresh nonce); the owner answers :class:`Challenge` (its own nonce and its proof over both
nonces and node IDs); only if that proof holds does the puller send :class:`Proof` (its own proof).
The owner drops a connection that has not proved the key within ``peer_handshake_timeout_s``.

Then, any number of times on the same connection: the puller sends :class:`Pull` (object ID, the
invocation and the reading function; never a token); the owner checks against its own registry that
the function may read the object, exactly as a local ``get`` would, and answers :class:`Header`
followed by :class:`Chunk` frames, each followed by that many raw bytes, sent back to back
(pipelined). The puller answers :class:`Received` once every byte is in; only then does the owner
count the read as a consumption (freeing the object once all its declared consumers have read it)
and confirm with :class:`Consumed`. Errors travel as :class:`Fail` frames and are raised on the
puller as the same gfaas error class.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgspec

from ..errors import ProtocolError, RemoteError
from ..units import MiB

WIRE_VERSION = 2
MAX_HANDSHAKE_FRAME = 512  # Hello and Proof are far smaller; the owner reads them before any trust
MAX_CONTROL_FRAME = 64 * 1024
MAX_CHUNK = 64 * MiB  # the most raw bytes a puller accepts behind one Chunk frame


class _Wire(msgspec.Struct, tag=True, array_like=True, frozen=True):
    pass


class Hello(_Wire, frozen=True):
    """Puller -> owner, first: who is asking, whom it means to reach, and its nonce."""

    node: str
    server_node: str
    nonce: bytes
    version: int = WIRE_VERSION


class Challenge(_Wire, frozen=True):
    """Owner -> puller: the owner's nonce and its proof of the cluster key."""

    node: str
    nonce: bytes
    proof: bytes


class Proof(_Wire, frozen=True):
    """Puller -> owner: the puller's proof of the cluster key."""

    proof: bytes


class Pull(_Wire, frozen=True):
    """Puller -> owner: send this object to ``function`` of ``invocation`` (running on the puller)."""

    id: bytes
    invocation: str
    function: str


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


class Control(_Wire, frozen=True):
    """Gateway -> node, instead of a pull: one admin request (a :mod:`~gfaas.dataplane.protocol`
    message, encoded; ``b""``: who are you) for the node's control relay (:mod:`~gfaas.dataplane.peer_control`)."""

    request: bytes


class ControlReply(_Wire, frozen=True):
    """Node -> gateway: the relay's answer (an encoded protocol reply)."""

    reply: bytes


class Fail(_Wire, frozen=True):
    """Either way: the request failed with the gfaas error ``code``."""

    code: str
    message: str


_enc = msgspec.msgpack.Encoder()
to_owner = msgspec.msgpack.Decoder(Pull | Received | Control | Fail)
to_puller = msgspec.msgpack.Decoder(Header | Chunk | Consumed | Fail)
handshake_to_owner = msgspec.msgpack.Decoder(Hello | Proof)
handshake_to_puller = msgspec.msgpack.Decoder(Challenge | Fail)
to_controller = msgspec.msgpack.Decoder(ControlReply | Fail)
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


def read_frame(sock: socket.socket, decoder: msgspec.msgpack.Decoder[Any],
               limit: int = MAX_CONTROL_FRAME) -> Any:
    """Read one length-prefixed control frame; :class:`ProtocolError` if oversize or malformed."""
    head = bytearray(4)
    recv_exact(sock, memoryview(head))
    (n,) = _LEN.unpack(head)
    if n > limit:
        raise ProtocolError(f"control frame of {n} bytes exceeds the {limit}-byte limit")
    body = bytearray(n)
    recv_exact(sock, memoryview(body))
    return decode_body(body, decoder)


def decode_body(body: bytes | bytearray, decoder: msgspec.msgpack.Decoder[Any]) -> Any:
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed transfer frame ({len(body)} bytes): {exc}") from None


def split_frame(buf: bytearray, limit: int) -> bytes | None:
    """Take one complete frame's body off the front of ``buf`` (None while incomplete)."""
    if len(buf) < 4:
        return None
    (n,) = _LEN.unpack_from(buf)
    if n > limit:
        raise ProtocolError(f"control frame of {n} bytes exceeds the {limit}-byte limit")
    if len(buf) < 4 + n:
        return None
    body = bytes(buf[4 : 4 + n])
    del buf[: 4 + n]
    return body


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
