"""The puller: fetches an object another node holds into a local segment, for a local reader.

On a local miss the daemon asks the global directory (:mod:`gfaas.dataplane.directory`) where the
object lives (refusing an entry whose MAC fails), refuses what the owner would refuse without
contacting it, connects to the owner's transfer server, checks that it proves the cluster key before
telling it anything, and streams the bytes straight into a segment of its own store
(:mod:`gfaas.dataplane.transfer_wire` has the protocol). Proven connections are kept for a few
seconds and reused by later pulls from the same node, so the handshake is paid once per connection.

The owner confirms that it counted a read (``Consumed``) after the puller said the bytes arrived
(``Received``). Nothing the reader gets depends on that confirmation, so a pull answers its reader
without waiting for it: the connection goes back to the pool owing one frame, which the next pull on
it reads first (:meth:`Puller._settle`). That takes a network round trip off every pull.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from ..config import NodeConfig
from ..errors import (
    AccessDenied,
    AuthenticationError,
    DataDeleted,
    DataLost,
    GfaasError,
    ObjectStateError,
    ProtocolError,
    RemoteError,
    error_from_code,
)
from . import protocol as P
from .auth import may_read
from .directory import GlobalDirectory
from .ids import ID_BYTES
from .meta import check_meta
from .node_access import NodeAccess, pin_for_transfer, unpin
from .peer_auth import NONCE_BYTES, PeerKey
from .store import DENIED_MESSAGE, SEALED, WRITING, ObjectRecord, Segment, Session
from .transfer_wire import (
    MAX_CHUNK,
    MAX_HANDSHAKE_FRAME,
    Chunk,
    Consumed,
    Fail,
    Header,
    Hello,
    Proof,
    Pull,
    Received,
    encode_frame,
    handshake_to_puller,
    read_frame,
    recv_exact,
    split_address,
    to_puller,
)

log = logging.getLogger("gfaas.dataplane.remote")

MAX_PULL_ROUNDS = 8
ASSUMED_MIN_BANDWIDTH = 50e6  # bytes/s: how long a get waits for a copy another pull is writing
LOOKUP_WAIT_S = 1.0  # how long a missing directory entry is waited for
POOL_PER_NODE = 8  # idle proven connections kept per owner
POOL_IDLE_S = 5.0  # ... for at most this long (the owner closes idle ones after transfer_server.IDLE_S)

#: What the daemon turns a local object into for its reply (the get's ``Located`` and descriptors).
Export = Callable[[ObjectRecord, Segment], tuple[P.Reply, list[int]]]


class _Arriving(Exception):
    """Another pull on this node is writing the object's local copy."""


class _Stale(Exception):
    """A reused connection turned out closed by the owner before it answered."""


class Puller:
    """Pulls objects from other nodes for this node's readers (on daemon worker threads)."""

    def __init__(self, config: NodeConfig, directory: GlobalDirectory, node: NodeAccess, key: PeerKey) -> None:
        self.config = config
        self.node_id = config.node_id
        self._directory = directory
        self._node = node
        self._key = key
        self.stopping = False
        # idle proven connections per owner: (socket, since, the object whose Consumed it still owes)
        self._pool: dict[tuple[str, str], list[tuple[socket.socket, float, str]]] = {}
        self._pool_lock = threading.Lock()

    def stop(self) -> None:
        self.stopping = True
        with self._pool_lock:
            conns = [c for lst in self._pool.values() for c, _, _ in lst]
            self._pool.clear()
        for c in conns:
            c.close()

    def may_fetch(self, oid: object) -> bool:
        return isinstance(oid, bytes) and len(oid) == ID_BYTES and not self.stopping

    def fetch(self, session: Session, oid: bytes, export: Export) -> tuple[P.Reply, list[int]]:
        """Find ``oid`` in the global directory, pull it into a local segment, answer with
        ``export`` (the daemon's reply for a local object)."""
        for _ in range(MAX_PULL_ROUNDS):
            try:
                return self._fetch_once(session, oid, export)
            except _Arriving:
                continue  # another pull here placed it first: wait for that copy, then look again
        raise ObjectStateError(f"object {oid.hex()} keeps arriving from another node for other readers; try again")

    def _fetch_once(self, session: Session, oid: bytes, export: Export) -> tuple[P.Reply, list[int]]:
        t = self.config.remote_timeout_s
        deadline = time.monotonic() + t
        hexid = oid.hex()
        daemon = self._node
        local = self._local(session, oid, export, deadline)
        if local is not None:
            return local
        # Publication is asynchronous but takes milliseconds; waiting longer only delays the
        # refusal of forged or foreign IDs.
        entry = self._directory.lookup(oid, min(deadline, time.monotonic() + LOOKUP_WAIT_S))
        if entry is None:
            raise AccessDenied(DENIED_MESSAGE)
        try:
            consumers = json.loads(entry["consumers"])
            cons = frozenset(consumers) if consumers is not None else None
            node, invocation, producer = entry["node"], entry["invocation"], entry["producer"]
        except (KeyError, ValueError, TypeError):
            raise AccessDenied(DENIED_MESSAGE) from None  # a damaged entry is no entry
        # Refuse here what the owner would refuse, without telling anything about the object.
        if not may_read(invocation, producer, cons, session.invocation, session.function):
            raise AccessDenied(DENIED_MESSAGE)
        if entry.get("freed"):
            raise DataDeleted(f"object {hexid} was freed ({entry['freed']}); it can no longer be read")
        if node == self.node_id:  # ours, and no longer here: the store has the precise answer
            with daemon.lock:
                return daemon.store.get(session, oid, export)
        with daemon.lock:
            daemon.store.check_live(session)
        for _ in range(2):
            sock, addr, reused = self._connect(node, hexid)
            keep = False  # kept: it owes the owner's confirmation of this pull (the module docstring)
            try:
                out, keep = self._pull(sock, session, oid, node, export, reused)
                return out
            except _Stale:  # the owner closed its idle end: every pooled one is likely gone too
                self._discard(node)
            except TimeoutError:
                raise RemoteError(f"node {node} at {addr} stopped answering while sending object {hexid}"
                                  f" (nothing for {t} s)") from None
            except OSError as exc:
                raise RemoteError(f"the connection to node {node} at {addr} broke while pulling object {hexid}:"
                                  f" {exc}") from None
            finally:
                if keep:
                    self._checkin(node, addr, sock, hexid)
                else:
                    sock.close()
        raise RemoteError(f"node {node} at {addr} keeps closing connections before answering a pull of {hexid}")

    def _local(self, session: Session, oid: bytes, export: Export,
               deadline: float) -> tuple[P.Reply, list[int]] | None:
        """The local store's answer if it has one (the object, or a precise error); None on a miss.

        A copy that another pull is still writing is waited for (longer for larger objects)."""
        daemon = self._node
        store = daemon.store
        while True:
            with daemon.lock:
                rec = store.objects.get(oid)
                if rec is None or rec.state != WRITING or rec.writer is not None:
                    try:
                        return daemon.store.get(session, oid, export)
                    except AccessDenied:
                        return None
                limit = deadline + rec.nbytes / ASSUMED_MIN_BANDWIDTH
            if time.monotonic() > limit:
                raise ObjectStateError(f"object {oid.hex()} is still arriving from another node; try again")
            time.sleep(0.002)

    def _connect(self, node: str, hexid: str) -> tuple[socket.socket, str, bool]:
        """A proven connection to ``node``'s transfer server (pooled if one is idle, else new), its
        address and whether it was reused; a refused cached address is looked up again."""
        tried: str | None = None
        for fresh in (False, True):
            addr = self._directory.node_address(node, fresh)
            if addr is None:
                raise DataLost(f"object {hexid} was held by node {node}, which has left the cluster; re-run"
                               " the function that produced it")
            if addr == tried:
                break
            tried = addr
            pooled = self._checkout(node, addr)
            if pooled is not None:
                return pooled, addr, True
            try:
                return self._dial(node, addr), addr, False
            except ConnectionRefusedError:
                continue
        raise DataLost(f"object {hexid} is held by node {node} at {tried}, which refuses connections (its"
                       " daemon is gone); the object is lost unless the node comes back")

    def _dial(self, node: str, addr: str) -> socket.socket:
        """A new connection to ``addr`` that proved the cluster key both ways. A connection the owner
        drops before the handshake ends (it sheds the oldest unproven ones under a flood) is dialled
        again until ``remote_timeout_s`` has passed."""
        t = self.config.remote_timeout_s
        deadline = time.monotonic() + t
        while True:
            try:
                sock = socket.create_connection(split_address(addr), timeout=t)
            except ConnectionRefusedError:
                raise
            except OSError as exc:
                raise RemoteError(f"cannot reach node {node} at {addr}: {exc}") from None
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._handshake(sock, node, addr)
                return sock
            except ConnectionError as exc:
                sock.close()
                if time.monotonic() + 0.01 > deadline:
                    raise RemoteError(f"node {node} at {addr} kept closing the handshake: {exc}") from None
                time.sleep(0.01)
            except TimeoutError:
                sock.close()
                raise RemoteError(f"node {node} at {addr} did not answer the handshake within {t} s") from None
            except OSError as exc:
                sock.close()
                raise RemoteError(f"the handshake with node {node} at {addr} broke: {exc}") from None
            except BaseException:
                sock.close()
                raise

    def _handshake(self, sock: socket.socket, node: str, addr: str) -> None:
        prove_to_owner(sock, self._key, self.node_id, node, addr)

    def _checkout(self, node: str, addr: str) -> socket.socket | None:
        """An idle pooled connection to ``node`` whose owed confirmation came, or None."""
        while True:
            now = time.monotonic()
            with self._pool_lock:
                lst = self._pool.get((node, addr))
                if not lst:
                    return None
                sock, since, owed = lst.pop()
            if now - since < POOL_IDLE_S and self._settle(sock, node, owed):
                return sock
            sock.close()

    def _settle(self, sock: socket.socket, node: str, hexid: str) -> bool:
        """Read the confirmation ``sock`` owes for the pull of ``hexid``; whether it may be reused
        (a refusal to count the read is logged, as it always was, and the connection dropped)."""
        try:
            sock.settimeout(self.config.remote_timeout_s)
            ack = read_frame(sock, to_puller)
        except (OSError, GfaasError) as exc:  # the bytes were delivered; the owner frees it at the end
            log.warning("no confirmation from node %s for the read of %s: %s", node, hexid, exc)
            return False
        if isinstance(ack, Fail):
            log.warning("node %s could not count the read of %s: %s", node, hexid, ack.message)
        return isinstance(ack, Consumed)

    def _checkin(self, node: str, addr: str, sock: socket.socket, owed: str) -> None:
        with self._pool_lock:
            lst = self._pool.setdefault((node, addr), [])
            if not self.stopping and len(lst) < POOL_PER_NODE:
                lst.append((sock, time.monotonic(), owed))
                return
        sock.close()

    def _discard(self, node: str) -> None:
        with self._pool_lock:
            stale = [c for (n, _), lst in self._pool.items() if n == node for c, _, _ in lst]
            for k in [k for k in self._pool if k[0] == node]:
                del self._pool[k]
        for c in stale:
            c.close()

    def _pull(self, sock: socket.socket, session: Session, oid: bytes, node: str, export: Export,
              reused: bool) -> tuple[tuple[P.Reply, list[int]], bool]:
        """Pull ``oid`` over ``sock``: the reply, and whether the connection may be reused."""
        daemon = self._node
        store = daemon.store
        hexid = oid.hex()
        sock.settimeout(self.config.remote_timeout_s)
        try:
            sock.sendall(encode_frame(Pull(oid, session.invocation, session.function)))
            h = read_frame(sock, to_puller)
        except TimeoutError:
            raise
        except OSError:
            if reused:
                raise _Stale() from None
            raise
        if isinstance(h, Fail):
            raise error_from_code(h.code, h.message)
        if not isinstance(h, Header) or h.id != oid or h.invocation != session.invocation:
            raise ProtocolError(f"node {node} answered a pull of {hexid} with a wrong header")
        shape = check_meta(h.nbytes, h.dtype, h.shape)
        cons = frozenset(h.consumers) if h.consumers is not None else None
        # The local copy serves the function that pulled it: freed right after its read when the object
        # has declared consumers (each other consumer pulls, and is counted, on its own), kept for the
        # invocation otherwise (the owner keeps its own copy as long, and other functions here reuse it).
        pending = {session.function} if cons is not None else None
        with daemon.lock:
            store.check_live(session)
            cur = store.objects.get(oid)
            if cur is not None:
                if cur.state == SEALED:  # another pull finished meanwhile: read its copy
                    return daemon.store.get(session, oid, export), False
                raise _Arriving()
            rec, seg = store.place(session.invocation, h.producer, cons, pending, oid, h.nbytes, h.dtype, shape)
            mapped = store.backend.host_view(seg.handle) if h.nbytes else None
            holder = pin_for_transfer(store, seg, session.invocation) if mapped is not None else None
        try:
            got, buf = 0, memoryview(bytearray(0))
            while got < h.nbytes:
                m = read_frame(sock, to_puller)
                if isinstance(m, Fail):
                    raise error_from_code(m.code, m.message)
                if not isinstance(m, Chunk) or not 0 < m.nbytes <= min(h.nbytes - got, MAX_CHUNK):
                    raise ProtocolError(f"node {node} sent a bad chunk frame for object {hexid}")
                n = m.nbytes
                if mapped is not None:  # straight into the segment; checked once at the end
                    recv_exact(sock, mapped[rec.offset + got : rec.offset + got + n])
                else:
                    if len(buf) < n:
                        buf = memoryview(bytearray(n))
                    recv_exact(sock, buf[:n])
                    with daemon.lock:
                        if store.objects.get(oid) is not rec:
                            store.check_live(session)
                            raise DataDeleted(f"the copy of object {hexid} was freed during the pull")
                        store.backend.copy_in(seg.handle, rec.offset + got, buf[:n])
                got += n
            # The owner's Consumed is read by the next pull on this connection (_settle), not waited for.
            try:
                sock.sendall(encode_frame(Received()))
                keep = True
            except OSError as exc:  # the bytes are here; the owner frees it at the end
                log.warning("could not confirm the read of %s to node %s: %s", hexid, node, exc)
                keep = False
            with daemon.lock:
                store.check_live(session)
                if store.objects.get(oid) is not rec:
                    raise DataDeleted(f"the copy of object {hexid} was freed during the pull")
                store.seal(None, oid)
                store.net_bytes["net-in"] += h.nbytes  # under the lock the stats stream reads it with
                out = export(rec, seg)
                if rec.pending is not None:
                    # Read by the one function it was pulled for. Freed without a tombstone: this node's
                    # copy is not the object, whose owner answers any later read.
                    store.forget(rec)
                log.debug("pulled %s (%d bytes) from %s", hexid, h.nbytes, node)
                return out, keep
        except BaseException:
            with daemon.lock:
                if store.objects.get(oid) is rec and rec.state == WRITING:
                    store.forget(rec)
            raise
        finally:
            if holder is not None:
                with daemon.lock:
                    unpin(store, holder)


def prove_to_owner(sock: socket.socket, key: PeerKey, self_node: str, node: str, addr: str) -> None:
    """Mutual proof of the cluster key on a new connection to ``node``'s transfer server: the owner
    must prove it before we prove ours or name anything."""
    nonce = os.urandom(NONCE_BYTES)
    sock.sendall(encode_frame(Hello(self_node, node, nonce)))
    ch = read_frame(sock, handshake_to_puller, MAX_HANDSHAKE_FRAME)
    if isinstance(ch, Fail):
        raise error_from_code(ch.code, f"node {node} at {addr} refused the connection: {ch.message[:500]}")
    if ch.node != node or not PeerKey.check(key.proof("server", self_node, node, nonce, ch.nonce), ch.proof):
        raise AuthenticationError(
            f"the server at {addr}, listed as node {node} in the global directory, did not prove the cluster"
            " key; nothing was sent to it or accepted from it")
    sock.sendall(encode_frame(Proof(key.proof("client", self_node, node, nonce, ch.nonce))))
