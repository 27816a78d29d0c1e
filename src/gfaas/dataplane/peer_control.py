"""The gateway's control of node daemons on other machines, over the transfer port.

A node's admin socket is a Unix socket: only a process on the same machine reaches it. A gateway
that runs workflows across machines must still open and end invocations on every node, send queue
hints and read statistics. It does so over the node's transfer server
(:mod:`gfaas.dataplane.transfer_server`): after the same mutual proof of the cluster key as a pull,
it sends :class:`~gfaas.dataplane.transfer_wire.Control` frames, each carrying one admin request.

The node's side (:class:`ControlRelay`) accepts a short list of requests, checked like any request
(:func:`gfaas.dataplane.protocol.decode_request`), and passes them to its own daemon on a private
admin connection (proved with a secret that lives only in the daemon's memory). Tokens never cross
the network: an :class:`~gfaas.dataplane.protocol.OpenInvocation` arrives without them, the relay
derives them from the cluster key (:meth:`~gfaas.dataplane.peer_auth.PeerKey.function_tokens`), as
the gateway did, and the reply goes back without them.

:class:`PeerAdmin` is the gateway's end, with the methods of :class:`~gfaas.dataplane.client.Admin`
the runtime uses for a node it cannot reach through a socket.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterable
from typing import Any

import msgspec

from ..errors import AccessDenied, DaemonUnavailable, ProtocolError, RemoteError, error_from_code
from . import protocol as P
from .channel import Channel
from .peer_auth import PeerKey
from .puller import prove_to_owner
from .transfer_wire import Control, ControlReply, Fail, encode_frame, read_frame, split_address, to_controller

log = logging.getLogger("gfaas.dataplane.remote")

#: What a peer may ask of a node's daemon: invocations' lifetimes, queue hints, figures. Nothing
#: that reads or writes objects, attaches connections or touches page merging.
RELAYED = (P.OpenInvocation, P.EndInvocations, P.QueueState, P.Stats, P.Snapshot)
_END_BATCH = 1024
_HINT_BATCH = 128  # queue entries per frame: each frame stays well under the 64 KiB limit


class ControlRelay:
    """The node's side: one admin connection to its own daemon, shared by the transfer threads."""

    def __init__(self, socket_path: str, relay_token: str, key: PeerKey) -> None:
        self._path, self._token, self._key = socket_path, relay_token, key
        self._lock = threading.Lock()
        self._ch: Channel | None = None
        self._welcome: P.AdminWelcome | None = None

    def _channel(self) -> tuple[Channel, P.AdminWelcome]:
        if self._ch is None or self._welcome is None:
            ch = Channel(self._path, 60.0)
            w = ch.handshake(P.AdminHello(self._token))
            assert isinstance(w, P.AdminWelcome)
            self._ch, self._welcome = ch, w
        return self._ch, self._welcome

    def handle(self, request: bytes, peer_node: str) -> bytes:
        """Answer one relayed request (an encoded reply); gfaas errors propagate (a Fail frame)."""
        with self._lock:
            ch, welcome = self._channel()
            if not request:
                return P.encode(welcome)
            msg = P.decode_request(request)
            if not isinstance(msg, RELAYED):
                raise AccessDenied(f"{type(msg).__name__} is not accepted from another node (node {peer_node!r}); "
                                   f"a peer may send {', '.join(t.__name__ for t in RELAYED)}")
            if isinstance(msg, P.OpenInvocation):
                if msg.tokens is not None or not msg.invocation_id:
                    raise ProtocolError("an invocation opened from another node names its ID and no tokens: "
                                        "every node derives them from the cluster key")
                msg = P.OpenInvocation(msg.workflow, msg.functions, msg.invocation_id,
                                       self._key.function_tokens(msg.invocation_id, msg.functions))
            try:
                reply, fds = ch.call(msg)
            except DaemonUnavailable:
                self._ch = None
                raise
            for fd in fds:  # none are expected; never keep one open
                os.close(fd)
            if isinstance(reply, P.InvocationOpened):
                reply = P.InvocationOpened(reply.invocation_id, {})
            log.debug("relayed %s from node %s", type(msg).__name__, peer_node)
            return P.encode(reply)

    def close(self) -> None:
        with self._lock:
            if self._ch is not None:
                self._ch.close()
                self._ch = None


class PeerAdmin:
    """The gateway's handle on a node on another machine (the subset of ``Admin`` the runtime uses).

    ``address``: the node's transfer address (``host:port``, from the global directory); ``node``:
    its node ID, which it must prove it is; ``me``: the ID this side presents."""

    def __init__(self, address: str, node: str, key: PeerKey, me: str = "gateway", timeout: float = 30.0) -> None:
        self.address, self.node, self.me = address, node, me
        self._key, self._timeout = key, timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        w = self._call(b"")
        assert isinstance(w, P.AdminWelcome)
        self.node_id = w.node_id
        self.devices: tuple[int, ...] = tuple(w.devices)
        self.device_kind = w.device_kind

    def _connect(self) -> socket.socket:
        try:
            sock = socket.create_connection(split_address(self.address), timeout=self._timeout)
        except OSError as exc:
            raise RemoteError(f"cannot reach node {self.node} at {self.address}: {exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            prove_to_owner(sock, self._key, self.me, self.node, self.address)
        except BaseException:
            sock.close()
            raise
        return sock

    def _call(self, request: bytes) -> Any:
        with self._lock:
            for attempt in (0, 1):  # a kept connection the node closed while idle: dial once more
                fresh = self._sock is None
                if self._sock is None:
                    self._sock = self._connect()
                try:
                    self._sock.sendall(encode_frame(Control(request)))
                    r = read_frame(self._sock, to_controller)
                    break
                except (OSError, EOFError) as exc:
                    self._drop()
                    if fresh or attempt:
                        raise RemoteError(f"node {self.node} at {self.address} stopped answering: {exc}") from None
            if isinstance(r, Fail):
                self._drop()  # the node closes the connection after a failure
                raise error_from_code(r.code, f"node {self.node}: {r.message[:500]}")
            assert isinstance(r, ControlReply)
        rep = P.decode_reply(r.reply)
        if isinstance(rep, P.Error):
            raise error_from_code(rep.code, rep.message)
        return rep

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def open_invocation(self, workflow: str, functions: list[str], invocation_id: str,
                        tokens: dict[str, str] | None = None) -> None:
        """Open ``invocation_id`` on the node; it derives the functions' tokens from the cluster key.
        ``tokens`` (what a local node is given) are never sent: the node's own derivation must match
        them, which holds when they are :meth:`~gfaas.dataplane.peer_auth.PeerKey.function_tokens`."""
        if tokens is not None and tokens != self._key.function_tokens(invocation_id, functions):
            raise ValueError("tokens for a node on another machine must be the cluster key's function_tokens")
        r = self._call(P.encode(P.OpenInvocation(workflow, list(functions), invocation_id, None)))
        assert isinstance(r, P.InvocationOpened)

    def end_invocations(self, invocation_ids: Iterable[str]) -> dict[str, int]:
        ids = list(invocation_ids)
        freed: dict[str, int] = {}
        for k in range(0, len(ids), _END_BATCH):
            r = self._call(P.encode(P.EndInvocations(ids[k : k + _END_BATCH])))
            assert isinstance(r, P.EndedMany)
            freed.update(r.freed)
        return freed

    def end_invocation(self, invocation_id: str) -> int:
        return self.end_invocations([invocation_id]).get(invocation_id, 0)

    def queue_state(self, entries: Iterable[P.QueueEntry], heads: dict[str, int]) -> None:
        batch = list(entries)
        for k in range(0, max(len(batch), 1), _HINT_BATCH):
            r = self._call(P.encode(P.QueueState(batch[k : k + _HINT_BATCH], dict(heads) if k == 0 else {})))
            assert isinstance(r, P.Ok)

    def stats(self) -> dict[str, Any]:
        r = self._call(P.encode(P.Stats()))
        assert isinstance(r, P.StatsReply)
        return msgspec.structs.asdict(r)

    def snapshot(self) -> dict[str, Any]:
        r = self._call(P.encode(P.Snapshot()))
        assert isinstance(r, P.SnapshotReply)
        return {"node_id": r.node_id, "time": r.time, "tiers": [msgspec.structs.asdict(t) for t in r.tiers],
                "counters": dict(r.counters), "links": dict(r.links)}

    def close(self) -> None:
        with self._lock:
            self._drop()

    def __enter__(self) -> PeerAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
