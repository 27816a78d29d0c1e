"""The transfer server's front door: accepts connections and admits only peers that prove the cluster key.

One thread multiplexes every connection that has not proved the key yet (non-blocking sockets, one
selector), so slow or silent connections cost a file descriptor and a few bytes each, never a thread.
Bounds (``NodeConfig.peer_*``):

* a connection must complete the handshake within ``peer_handshake_timeout_s`` of its accept;
* at most ``peer_max_pending_per_ip`` unproven connections per source address and
  ``peer_max_pending`` in all; beyond either, the *oldest* unproven one is dropped. A real peer
  proves the key within a round trip, so a flood of slow connections (even from the peer's own
  address) keeps pushing out only itself;
* at most ``peer_max_connections`` proven connections are served at once (others are told to retry).

Reads take only the bytes of the frame being read, so whatever the peer sends after its proof (its
first pull) stays in the socket for the thread that serves it.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import NodeConfig
from ..errors import AuthenticationError, GfaasError, ProtocolError, RemoteError, code_of
from .peer_auth import NONCE_BYTES, PeerKey
from .transfer_wire import (
    MAX_HANDSHAKE_FRAME,
    WIRE_VERSION,
    Challenge,
    Fail,
    Hello,
    Proof,
    decode_body,
    encode_frame,
    handshake_to_owner,
)

log = logging.getLogger("gfaas.dataplane.remote")

_LEN = struct.Struct(">I")
_LOG_EVERY_S = 10.0  # refused handshakes are logged at most this often (with a count)

#: Called with (socket, peer address, peer node ID) on a new thread once a peer proved the key.
Serve = Callable[[socket.socket, Any, str], None]


@dataclass(eq=False)
class _Pending:
    sock: socket.socket
    peer: Any
    ip: str
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    hello: Hello | None = None
    nonce: bytes = b""


class PeerGate:
    """Accept loop and handshakes of the transfer server (see the module docstring)."""

    def __init__(self, config: NodeConfig, key: PeerKey, listener: socket.socket, serve: Serve) -> None:
        self.config = config
        self.node_id = config.node_id
        self._key = key
        self._listener = listener
        self._serve = serve
        self._sel = selectors.DefaultSelector()
        self._pending: OrderedDict[socket.socket, _Pending] = OrderedDict()  # oldest first
        self._per_ip: dict[str, int] = {}
        self._cv = threading.Condition()
        self.active = 0  # proven connections being served
        self._stopping = threading.Event()
        self._refused = 0
        self._last_log = 0.0

    # ---- the loop (one thread) -----------------------------------------------------------------------
    def run(self) -> None:
        self._listener.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ)
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                wait = 0.25
                if self._pending:
                    wait = min(wait, max(0.0, next(iter(self._pending.values())).deadline - now))
                for k, _ in self._sel.select(wait):
                    if k.fileobj is self._listener:
                        self._accept()
                    else:
                        p = self._pending.get(k.fileobj)  # type: ignore[call-overload]
                        if p is not None:
                            self._advance(p)
                self._expire(time.monotonic())
        finally:
            for p in list(self._pending.values()):
                self._drop(p)
            self._sel.close()

    def stop(self) -> None:
        self._stopping.set()

    def _accept(self) -> None:
        for _ in range(64):  # several per wake-up, but the loop keeps serving handshakes
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: shed the oldest unproven connection, back off
                log.warning("transfer server accept failed: %s", exc)
                if self._pending:
                    self._drop(next(iter(self._pending.values())))
                time.sleep(0.05)
                return
            ip = str(peer[0]) if isinstance(peer, tuple) else str(peer)
            sock.setblocking(False)
            p = _Pending(sock, peer, ip, time.monotonic() + self.config.peer_handshake_timeout_s)
            if self._per_ip.get(ip, 0) >= self.config.peer_max_pending_per_ip:
                self._drop(next(q for q in self._pending.values() if q.ip == ip))
            if len(self._pending) >= self.config.peer_max_pending:
                self._drop(next(iter(self._pending.values())))
            self._pending[sock] = p
            self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
            self._sel.register(sock, selectors.EVENT_READ)

    def _expire(self, now: float) -> None:
        while self._pending:
            p = next(iter(self._pending.values()))
            if p.deadline > now:
                return
            self._refuse(p, AuthenticationError(
                f"node {self.node_id}: no proof of the cluster key within"
                f" {self.config.peer_handshake_timeout_s} s; connection closed"))

    def _drop(self, p: _Pending) -> None:
        if self._pending.pop(p.sock, None) is None:
            return
        n = self._per_ip.get(p.ip, 1) - 1
        if n:
            self._per_ip[p.ip] = n
        else:
            self._per_ip.pop(p.ip, None)
        try:
            self._sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass
        p.sock.close()

    def _refuse(self, p: _Pending, exc: GfaasError) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            log.warning("transfer server refused %d connection(s) (last from %s): %s", self._refused, p.ip, exc)
            self._refused, self._last_log = 0, now
        try:
            p.sock.send(encode_frame(Fail(code_of(exc), str(exc))))
        except OSError:
            pass
        self._drop(p)

    # ---- the handshake -------------------------------------------------------------------------------
    def _read_frame(self, p: _Pending) -> bytes | None:
        """The next frame's body once complete; reads never go past its end."""
        while True:
            need = 4 - len(p.buf) if len(p.buf) < 4 else 4 + _LEN.unpack_from(p.buf)[0] - len(p.buf)
            if len(p.buf) >= 4 and _LEN.unpack_from(p.buf)[0] > MAX_HANDSHAKE_FRAME:
                raise ProtocolError(f"handshake frame of {_LEN.unpack_from(p.buf)[0]} bytes exceeds the"
                                    f" {MAX_HANDSHAKE_FRAME}-byte limit")
            if need == 0:
                body = bytes(p.buf[4:])
                p.buf.clear()
                return body
            try:
                got = p.sock.recv(need)
            except (BlockingIOError, InterruptedError):
                return None
            if not got:
                raise ConnectionError("closed during the handshake")
            p.buf += got

    def _advance(self, p: _Pending) -> None:
        try:
            body = self._read_frame(p)
            if body is None:
                return
            msg = decode_body(body, handshake_to_owner)
            if p.hello is None:
                self._on_hello(p, msg)
            else:
                self._on_proof(p, msg)
        except GfaasError as exc:
            self._refuse(p, exc)
        except OSError:  # gone, or reset: nothing to answer
            self._drop(p)

    def _on_hello(self, p: _Pending, msg: object) -> None:
        if not isinstance(msg, Hello):
            raise ProtocolError(f"expected Hello to open a transfer connection, got {type(msg).__name__}")
        if msg.version != WIRE_VERSION:
            raise ProtocolError(f"transfer protocol version {msg.version} is not {WIRE_VERSION};"
                                " run the same gfaas version on every node")
        if len(msg.nonce) != NONCE_BYTES or not 0 < len(msg.node) <= 64:
            raise ProtocolError("malformed Hello (nonce or node ID)")
        if msg.server_node != self.node_id:
            raise AuthenticationError(f"this is node {self.node_id}, not {msg.server_node[:64]!r}")
        p.hello, p.nonce = msg, os.urandom(NONCE_BYTES)
        proof = self._key.proof("server", msg.node, self.node_id, msg.nonce, p.nonce)
        p.sock.send(encode_frame(Challenge(self.node_id, p.nonce, proof)))  # tiny: fits the empty buffer

    def _on_proof(self, p: _Pending, msg: object) -> None:
        hello = p.hello
        assert hello is not None
        if not isinstance(msg, Proof):
            raise ProtocolError(f"expected Proof, got {type(msg).__name__}")
        want = self._key.proof("client", hello.node, self.node_id, hello.nonce, p.nonce)
        if not PeerKey.check(want, msg.proof):
            raise AuthenticationError(f"node {self.node_id}: the peer did not prove the cluster key;"
                                      " give every node the same cluster_key_file")
        with self._cv:
            busy = self.active >= self.config.peer_max_connections
            if not busy:
                self.active += 1
        if busy:
            raise RemoteError(f"node {self.node_id} is serving too many pulls at once; retry")
        # Proven: hand the socket (and whatever the peer sent after its proof) to a serving thread.
        self._pending.pop(p.sock)
        n = self._per_ip[p.ip] - 1
        if n:
            self._per_ip[p.ip] = n
        else:
            del self._per_ip[p.ip]
        self._sel.unregister(p.sock)
        p.sock.setblocking(True)
        threading.Thread(target=self._run_serve, args=(p.sock, p.peer, hello.node), name="gfaas-serve-pull",
                         daemon=True).start()

    def _run_serve(self, sock: socket.socket, peer: Any, node: str) -> None:
        try:
            self._serve(sock, peer, node)
        finally:
            with self._cv:
                self.active -= 1
