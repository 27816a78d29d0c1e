"""Cross-node data plane: the global directory in Redis and the TCP transfer server.

A two-level directory (FaaSTube §5.2, GROUTER §4.2): each node daemon answers from its own table
first (:class:`~gfaas.dataplane.store.Store`); only on a local miss does it consult the global table
in Redis, find the node that holds the object, and pull the bytes from that node's transfer server
into a local segment. The daemon calls this module only through the hooks of :class:`Remote`.

Global directory (Redis keys, all strings)::

    gfaas:node:<node_id>            -> "host:port" of the node's transfer server (set on start, removed on stop)
    gfaas:obj:<32 hex>              -> hash {node, invocation, producer, consumers, nbytes, dtype, shape[, freed]}
    gfaas:inv:<invocation>:<node>   -> set of <32 hex> the node published for the invocation

Writes happen on one background thread that batches whatever is queued into one pipeline, so the
daemon's loop never waits for Redis. A deleted object keeps its entry with a ``freed`` field (so a
reader elsewhere gets ``DataDeleted`` at once, like a reader on the same node) until its invocation
ends; ending an invocation removes every entry the node published for it in one script.

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

import json
import logging
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ..config import MiB, NodeConfig
from ..errors import (
    AccessDenied,
    DataDeleted,
    DataLost,
    GfaasError,
    ObjectStateError,
    ProtocolError,
    RemoteError,
    code_of,
    error_from_code,
)
from . import protocol as P
from .auth import may_read
from .ids import ID_BYTES
from .meta import check_meta
from .store import DENIED_MESSAGE, SEALED, WRITING, ObjectRecord, Segment, Session

log = logging.getLogger("gfaas.dataplane.remote")

WIRE_VERSION = 1
MAX_CONTROL_FRAME = 64 * 1024
MAX_CHUNK = 64 * MiB  # the most raw bytes a puller accepts behind one Chunk frame
MAX_SERVER_CONNECTIONS = 128
PUBLISH_BATCH = 512
MAX_PULL_ROUNDS = 8
NODE_CACHE_S = 2.0  # how long a node's transfer address is reused without asking the directory
ASSUMED_MIN_BANDWIDTH = 50e6  # bytes/s: how long a get waits for a copy another pull is writing
LOOKUP_WAIT_S = 1.0  # how long a missing directory entry is waited for


def obj_key(oid: bytes) -> str:
    return f"gfaas:obj:{oid.hex()}"


def node_key(node_id: str) -> str:
    return f"gfaas:node:{node_id}"


def inv_key(invocation: str, node_id: str) -> str:
    return f"gfaas:inv:{invocation}:{node_id}"


# Delete every object entry a node published for an invocation, and the set itself, in one go.
_END_SCRIPT = """
local ids = redis.call('SMEMBERS', KEYS[1])
for i = 1, #ids do redis.call('DEL', ARGV[1] .. ids[i]) end
redis.call('DEL', KEYS[1])
return #ids
"""


# ---- wire messages -------------------------------------------------------------------------------
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
_to_owner = msgspec.msgpack.Decoder(Pull | Received | Fail)
_to_puller = msgspec.msgpack.Decoder(Header | Chunk | Consumed | Fail)
_LEN = struct.Struct(">I")


class _Closed(ConnectionError):
    """The peer closed the connection (possibly in the middle of a frame)."""


def encode_frame(msg: _Wire) -> bytes:
    body = _enc.encode(msg)
    return _LEN.pack(len(body)) + body


def _recv_exact(sock: socket.socket, mv: memoryview) -> None:
    got, n = 0, len(mv)
    while got < n:
        k = sock.recv_into(mv[got:])
        if k == 0:
            raise _Closed(f"connection closed after {got} of {n} bytes")
        got += k


def read_frame(sock: socket.socket, decoder: msgspec.msgpack.Decoder[Any]) -> Any:
    """Read one length-prefixed control frame; :class:`ProtocolError` if oversize or malformed."""
    head = bytearray(4)
    _recv_exact(sock, memoryview(head))
    (n,) = _LEN.unpack(head)
    if n > MAX_CONTROL_FRAME:
        raise ProtocolError(f"control frame of {n} bytes exceeds the {MAX_CONTROL_FRAME}-byte limit")
    body = bytearray(n)
    _recv_exact(sock, memoryview(body))
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"malformed transfer frame ({n} bytes): {exc}") from None


def _send_all(sock: socket.socket, parts: list[bytes | memoryview]) -> None:
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


def _split_address(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise RemoteError(f"malformed transfer address {addr!r} in the global directory")
    return host.strip("[]"), int(port)


_STOP = object()


class _Arriving(Exception):
    """Another pull on this node is writing the object's local copy."""


class Remote:
    """Cross-node support of one node daemon: directory publication, transfer server, pulls.

    Created by :mod:`~gfaas.dataplane.node_main` when ``transfer_host`` or ``redis_url`` is set.
    After :meth:`start`, ``address`` is ``"host:port"`` of the transfer server (also written to
    ``<state_dir>/transfer.addr``) and ``port`` the port it listens on.
    """

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.address: str | None = None
        self.port: int | None = None
        self._daemon: Any = None
        self._redis: Any = None
        self._dir_name = "-"
        if config.redis_url:
            import redis

            t = config.remote_timeout_s
            self._redis = redis.Redis.from_url(
                config.redis_url, socket_timeout=t, socket_connect_timeout=t, decode_responses=True
            )
            kw = self._redis.connection_pool.connection_kwargs
            self._dir_name = f"{kw.get('host', '?')}:{kw.get('port', '?')}"  # never the password
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._stopped = False
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._unwritten = 0
        self._active = 0
        self._threads: list[threading.Thread] = []
        self._addresses: dict[str, tuple[str, float]] = {}  # node -> (transfer address, when read)

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self, daemon: Any) -> None:
        self._daemon = daemon
        if self.config.transfer_host is not None:
            self._listen()
        if self._redis is not None:
            self._spawn(self._publisher, "gfaas-directory")
            if self.address is not None:
                self._enqueue(("node", self.address))

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _listen(self) -> None:
        c = self.config
        host = c.transfer_host or ""
        try:
            infos = socket.getaddrinfo(host or None, c.transfer_port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
            family, _, _, _, sockaddr = infos[0]
            ls = socket.socket(family, socket.SOCK_STREAM)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(sockaddr)
            ls.listen(128)
        except OSError as exc:
            raise GfaasError(
                f"cannot listen for cross-node pulls on {host}:{c.transfer_port}: {exc}; choose another"
                " --transfer-host/--transfer-port"
            ) from None
        ls.settimeout(0.25)  # the accept loop polls the stop flag
        self._listener = ls
        self.port = int(ls.getsockname()[1])
        adv = c.advertise_host or host
        if adv in ("", "0.0.0.0", "::"):
            adv = socket.gethostbyname(socket.gethostname())
            log.warning("transfer server listens on all addresses; advertising %s (set advertise_host)", adv)
        self.address = f"[{adv}]:{self.port}" if ":" in adv else f"{adv}:{self.port}"
        try:
            with open(os.path.join(c.state_dir, "transfer.addr"), "w") as f:
                f.write(self.address + "\n")
        except OSError as exc:
            log.warning("cannot write transfer.addr: %s", exc)
        self._spawn(self._accept_loop, "gfaas-transfer")
        log.info("node %s serves cross-node pulls on %s (advertised as %s)", self.node_id,
                 ls.getsockname()[:2], self.address)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._redis is not None:
            self.flush(min(2.0, self.config.remote_timeout_s))
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()
        if self._redis is not None:
            if self.address is not None:
                try:
                    if self._redis.get(node_key(self.node_id)) == self.address:
                        self._redis.delete(node_key(self.node_id))
                except Exception as exc:
                    log.warning("could not remove node %s from the global directory: %s", self.node_id, exc)
            self._q.put(_STOP)
        for t in self._threads:
            t.join(1.0)
        if self._redis is not None:
            try:
                self._redis.close()
            except Exception:
                pass
        try:
            os.unlink(os.path.join(self.config.state_dir, "transfer.addr"))
        except OSError:
            pass

    # ---- directory publication (background thread) -------------------------------------------------
    def _enqueue(self, item: tuple[Any, ...]) -> None:
        with self._cv:
            self._unwritten += 1
        self._q.put(item)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued directory update was written (or dropped); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._unwritten > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def publish(self, rec: ObjectRecord) -> None:
        """An object was sealed here (loop thread, under the daemon lock): queue its entry."""
        if self._redis is None or self.address is None:
            return
        self._enqueue(("pub", rec.id, self._fields(rec)))

    def unpublish(self, rec: ObjectRecord) -> None:
        if self._redis is None or self.address is None:
            return
        fields = self._fields(rec)
        fields["freed"] = "deleted by its producer"
        self._enqueue(("pub", rec.id, fields))

    def on_end_invocation(self, invocation_id: str) -> None:
        if self._redis is None or self.address is None:
            return
        self._enqueue(("end", invocation_id))

    def on_retire(self, segment_id: int) -> None:
        """Nothing to do: transfers re-check under the daemon lock that their object is still there."""

    def _fields(self, rec: ObjectRecord) -> dict[str, str]:
        return {
            "node": self.node_id,
            "invocation": rec.invocation,
            "producer": rec.producer,
            "consumers": json.dumps(sorted(rec.consumers) if rec.consumers is not None else None),
            "nbytes": str(rec.nbytes),
            "dtype": rec.dtype,
            "shape": json.dumps(list(rec.shape)),
        }

    def _publisher(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            batch, stop = [item], False
            while len(batch) < PUBLISH_BATCH:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            try:
                self._write(batch)
            except Exception:
                log.exception("directory publication failed")
            with self._cv:
                self._unwritten -= len(batch)
                self._cv.notify_all()
            if stop:
                return

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        import redis

        delay, deadline = 0.05, time.monotonic() + max(30.0, self.config.remote_timeout_s)
        while True:
            try:
                pipe = self._redis.pipeline(transaction=False)
                for item in batch:
                    kind = item[0]
                    if kind == "pub":
                        _, oid, fields = item
                        pipe.hset(obj_key(oid), mapping=fields)
                        pipe.sadd(inv_key(fields["invocation"], self.node_id), oid.hex())
                    elif kind == "end":
                        pipe.eval(_END_SCRIPT, 1, inv_key(item[1], self.node_id), "gfaas:obj:")
                    elif kind == "node":
                        pipe.set(node_key(self.node_id), item[1])
                pipe.execute()
                return
            except redis.RedisError as exc:
                if self._stopping.is_set() or time.monotonic() + delay > deadline:
                    log.error("dropping %d updates of the global directory at %s: %s", len(batch),
                              self._dir_name, exc)
                    return
                log.warning("global directory at %s unreachable (%s); retrying", self._dir_name, exc)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    # ---- transfer server (owner side) -------------------------------------------------------------
    def _accept_loop(self) -> None:
        ls = self._listener
        assert ls is not None
        while not self._stopping.is_set():
            try:
                sock, peer = ls.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stopping.is_set():
                    return
                log.warning("transfer server accept failed: %s", exc)
                time.sleep(0.05)
                continue
            with self._cv:
                busy = self._active >= MAX_SERVER_CONNECTIONS
                if not busy:
                    self._active += 1
            if busy:
                try:
                    sock.settimeout(0.5)
                    sock.sendall(encode_frame(Fail("RemoteError", f"node {self.node_id} is serving too many"
                                                   " pulls at once; retry")))
                except OSError:
                    pass
                sock.close()
                continue
            threading.Thread(target=self._serve_pull, args=(sock, peer), name="gfaas-serve-pull",
                             daemon=True).start()

    def _serve_pull(self, sock: socket.socket, peer: Any) -> None:
        try:
            sock.settimeout(self.config.remote_timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                msg = read_frame(sock, _to_owner)
                if not isinstance(msg, Pull):
                    raise ProtocolError(f"expected a Pull request, got {type(msg).__name__}")
                if msg.version != WIRE_VERSION:
                    raise ProtocolError(f"transfer protocol version {msg.version} is not {WIRE_VERSION};"
                                        " run the same gfaas version on every node")
                self._stream(sock, msg)
            except GfaasError as exc:
                log.debug("pull from %s refused: %s", peer, exc)
                try:
                    sock.sendall(encode_frame(Fail(code_of(exc), str(exc))))
                except OSError:
                    pass
        except (OSError, EOFError) as exc:  # the puller went away or timed out: nothing to answer
            log.debug("pull connection from %s ended: %s", peer, exc)
        except Exception:
            log.exception("internal error serving a pull from %s", peer)
        finally:
            sock.close()
            with self._cv:
                self._active -= 1

    def _stream(self, sock: socket.socket, msg: Pull) -> None:
        d = self._daemon
        store = d.store
        with d.lock:
            inv, fn = store.registry.authenticate(msg.token)
            rec = store.lookup(inv.id, fn, msg.id)
            seg = store.resident(rec)
            header = Header(rec.id, rec.invocation, rec.producer,
                            sorted(rec.consumers) if rec.consumers is not None else None,
                            rec.nbytes, rec.dtype, list(rec.shape))
            mapped = store.backend.host_view(seg.handle) if rec.nbytes else None
            holder = _pin(store, seg, rec.invocation) if mapped is not None else None
        try:
            self._send_object(sock, header, rec, seg, mapped, fn)
        finally:
            if holder is not None:
                with d.lock:
                    _unpin(store, holder)
        log.debug("served %s (%d bytes) to %s of %s", rec.id.hex(), rec.nbytes, fn, inv.id)

    def _send_object(self, sock: socket.socket, header: Header, rec: ObjectRecord, seg: Segment,
                     mapped: memoryview | None, fn: str) -> None:
        d = self._daemon
        store = d.store
        sock.sendall(encode_frame(header))
        chunk = self.config.chunk_bytes
        buf = memoryview(bytearray(0 if mapped is not None else min(chunk, rec.nbytes)))
        off = 0
        while off < rec.nbytes:
            n = min(chunk, rec.nbytes - off)
            if mapped is not None:  # straight from the segment (pinned: not reused meanwhile)
                data = mapped[rec.offset + off : rec.offset + off + n]
            else:
                with d.lock:  # the object may be freed meanwhile (delete, end of its invocation)
                    if store.objects.get(rec.id) is not rec:
                        raise DataDeleted(f"object {rec.id.hex()} was freed on node {self.node_id} during"
                                          " the transfer; it can no longer be read")
                    store.backend.copy_out(seg.handle, rec.offset + off, n, buf[:n])
                data = buf[:n]
            _send_all(sock, [encode_frame(Chunk(n)), data])
            off += n
        ack = read_frame(sock, _to_owner)
        if not isinstance(ack, Received):
            raise ProtocolError(f"expected Received after the object's bytes, got {type(ack).__name__}")
        with d.lock:
            if store.objects.get(rec.id) is rec:
                store.consumed(rec, fn)
        sock.sendall(encode_frame(Consumed()))

    # ---- pulls (puller side, on a daemon worker thread) -------------------------------------------
    def may_fetch(self, oid: object) -> bool:
        return (self._redis is not None and isinstance(oid, bytes) and len(oid) == ID_BYTES
                and not self._stopping.is_set())

    def fetch(self, daemon: Any, conn: Any, session: Session, oid: bytes) -> tuple[P.Reply, list[int]]:
        """Find ``oid`` in the global directory, pull it into a local segment, answer ``Located``."""

        def export(rec: ObjectRecord, seg: Segment) -> tuple[P.Reply, list[int]]:
            return daemon._located(conn, rec, seg)

        for _ in range(MAX_PULL_ROUNDS):
            try:
                return self._fetch_once(daemon, session, oid, export)
            except _Arriving:
                continue  # another pull here placed it first: wait for that copy, then look again
        raise ObjectStateError(f"object {oid.hex()} keeps arriving from another node for other readers; try again")

    def _fetch_once(self, daemon: Any, session: Session, oid: bytes,
                    export: Callable[..., Any]) -> tuple[P.Reply, list[int]]:
        t = self.config.remote_timeout_s
        deadline = time.monotonic() + t
        hexid = oid.hex()
        local = self._local(daemon, session, oid, export, deadline)
        if local is not None:
            return local
        # Publication is asynchronous but takes milliseconds; waiting longer only delays the
        # refusal of forged or foreign IDs.
        entry = self._lookup(oid, min(deadline, time.monotonic() + LOOKUP_WAIT_S))
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
            token = daemon.store.registry.get(session.invocation).tokens[session.function]
        sock, addr = self._connect(node, hexid)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(t)
            return self._pull(daemon, sock, session, oid, token, node, export, deadline)
        except TimeoutError:
            raise RemoteError(f"node {node} at {addr} stopped answering while sending object {hexid}"
                              f" (nothing for {t} s)") from None
        except OSError as exc:
            raise RemoteError(f"the connection to node {node} at {addr} broke while pulling object {hexid}:"
                              f" {exc}") from None
        finally:
            sock.close()

    def _local(self, daemon: Any, session: Session, oid: bytes, export: Callable[..., Any],
               deadline: float) -> tuple[P.Reply, list[int]] | None:
        """The local store's answer if it has one (the object, or a precise error); None on a miss.

        A copy that another pull is still writing is waited for (longer for larger objects)."""
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

    def _lookup(self, oid: bytes, deadline: float) -> dict[str, str] | None:
        """The directory entry of ``oid``, retried with backoff (publication is asynchronous)."""
        import redis

        delay = 0.002
        while True:
            try:
                entry = self._redis.hgetall(obj_key(oid))
            except redis.RedisError as exc:
                raise RemoteError(f"the global directory at {self._dir_name} is unreachable: {exc}") from None
            if entry and "node" in entry:
                return dict(entry)
            if time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _node_address(self, node: str, fresh: bool) -> str | None:
        """The transfer address of ``node``: cached for a moment unless ``fresh``."""
        import redis

        now = time.monotonic()
        hit = self._addresses.get(node)
        if hit is not None and not fresh and now - hit[1] < NODE_CACHE_S:
            return hit[0]
        try:
            addr = self._redis.get(node_key(node))
        except redis.RedisError as exc:
            raise RemoteError(f"the global directory at {self._dir_name} is unreachable: {exc}") from None
        if addr:
            self._addresses[node] = (str(addr), now)
            return str(addr)
        self._addresses.pop(node, None)
        return None

    def _connect(self, node: str, hexid: str) -> tuple[socket.socket, str]:
        """A connection to ``node``'s transfer server; a refused cached address is looked up again."""
        t = self.config.remote_timeout_s
        tried: str | None = None
        for fresh in (False, True):
            addr = self._node_address(node, fresh)
            if addr is None:
                raise DataLost(f"object {hexid} was held by node {node}, which has left the cluster; re-run"
                               " the function that produced it")
            if addr == tried:
                break
            tried = addr
            try:
                return socket.create_connection(_split_address(addr), timeout=t), addr
            except ConnectionRefusedError:
                continue
            except OSError as exc:
                raise RemoteError(f"cannot reach node {node} at {addr} to pull object {hexid}: {exc}") from None
        raise DataLost(f"object {hexid} is held by node {node} at {tried}, which refuses connections (its"
                       " daemon is gone); the object is lost unless the node comes back")

    def _pull(self, daemon: Any, sock: socket.socket, session: Session, oid: bytes, token: str, node: str,
              export: Callable[..., Any], deadline: float) -> tuple[P.Reply, list[int]]:
        store = daemon.store
        hexid = oid.hex()
        sock.sendall(encode_frame(Pull(oid, token)))
        h = read_frame(sock, _to_puller)
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
                    return daemon.store.get(session, oid, export)
                raise _Arriving()
            rec, seg = store.place(session.invocation, h.producer, cons, pending, oid, h.nbytes, h.dtype, shape)
            mapped = store.backend.host_view(seg.handle) if h.nbytes else None
            holder = _pin(store, seg, session.invocation) if mapped is not None else None
        try:
            got, buf = 0, memoryview(bytearray(0))
            while got < h.nbytes:
                m = read_frame(sock, _to_puller)
                if isinstance(m, Fail):
                    raise error_from_code(m.code, m.message)
                if not isinstance(m, Chunk) or not 0 < m.nbytes <= min(h.nbytes - got, MAX_CHUNK):
                    raise ProtocolError(f"node {node} sent a bad chunk frame for object {hexid}")
                n = m.nbytes
                if mapped is not None:  # straight into the segment; checked once at the end
                    _recv_exact(sock, mapped[rec.offset + got : rec.offset + got + n])
                else:
                    if len(buf) < n:
                        buf = memoryview(bytearray(n))
                    _recv_exact(sock, buf[:n])
                    with daemon.lock:
                        if store.objects.get(oid) is not rec:
                            store.check_live(session)
                            raise DataDeleted(f"the copy of object {hexid} was freed during the pull")
                        store.backend.copy_in(seg.handle, rec.offset + got, buf[:n])
                got += n
            sock.sendall(encode_frame(Received()))
            try:
                ack = read_frame(sock, _to_puller)
                if isinstance(ack, Fail):
                    log.warning("node %s could not count the read of %s: %s", node, hexid, ack.message)
            except (OSError, GfaasError) as exc:  # the bytes are here; the owner frees it at the end
                log.warning("no confirmation from node %s for the read of %s: %s", node, hexid, exc)
            with daemon.lock:
                store.check_live(session)
                if store.objects.get(oid) is not rec:
                    raise DataDeleted(f"the copy of object {hexid} was freed during the pull")
                store.seal(None, oid)
                out = export(rec, seg)
                if rec.pending is not None:
                    # Read by the one function it was pulled for. Freed without a tombstone: this node's
                    # copy is not the object, whose owner answers any later read.
                    store.forget(rec)
                log.debug("pulled %s (%d bytes) from %s", hexid, h.nbytes, node)
                return out
        except BaseException:
            with daemon.lock:
                if store.objects.get(oid) is rec and rec.state == WRITING:
                    store.forget(rec)
            raise
        finally:
            if holder is not None:
                with daemon.lock:
                    _unpin(store, holder)


def _pin(store: Any, seg: Segment, invocation: str) -> Session:
    """Pin ``seg`` for a transfer that reads or writes it through a view (call under the daemon lock),
    so that it is not handed to another object meanwhile; :func:`_unpin` when done."""
    holder = Session(-1, invocation, "<transfer>", ())
    store.pin(holder, seg)
    return holder


def _unpin(store: Any, holder: Session) -> None:
    store.release_all(holder)
