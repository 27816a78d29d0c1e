"""The global directory in Redis: where each object lives and how to reach each node.

A two-level directory (FaaSTube §5.2, GROUTER §4.2): each node daemon answers from its own table
first (:class:`~gfaas.dataplane.store.Store`); only on a local miss does it consult the global table
in Redis, find the node that holds the object, and pull the bytes from that node's transfer server
into a local segment. The daemon calls this module only through the hooks of :class:`Remote`.

Global directory (Redis keys, all strings)::

    gfaas:node:<node_id>            -> "host:port <mac>" of the node's transfer server (set on start, removed on stop)
    gfaas:nodeinfo:<node_id>        -> JSON {address, socket, mac}: how a gateway that joins finds the node
                                       and what socket path its workers use there (gfaas.runtime.cluster)
    gfaas:obj:<32 hex>              -> hash {node, invocation, producer, consumers, nbytes, dtype, shape[, freed], mac}
    gfaas:inv:<invocation>:<node>   -> set of <32 hex> the node published for the invocation

Each ``mac`` is an HMAC under a key derived from the cluster key (:mod:`gfaas.dataplane.peer_auth`):
an entry that someone without the key wrote is refused before any connection is made. The
connection itself authenticates with ``redis_password_file`` (and the user name of ``redis_url``
for an ACL user), over TLS for ``rediss://`` URLs.

Writes happen on one background thread that batches whatever is queued into one pipeline, so the
daemon's loop never waits for Redis. A deleted object keeps its entry with a ``freed`` field (so a
reader elsewhere gets ``DataDeleted`` at once, like a reader on the same node) until its invocation
ends; ending an invocation removes every entry the node published for it in one script.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Any

from ..config import NodeConfig
from ..errors import AuthenticationError, ConfigError, RemoteError
from .peer_auth import PeerKey, read_secret_file
from .store import ObjectRecord

log = logging.getLogger("gfaas.dataplane.remote")

PUBLISH_BATCH = 512
NODE_CACHE_S = 2.0  # how long a node's transfer address is reused without asking the directory

_STOP = object()


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



class GlobalDirectory:
    """One node's view of the global directory: it publishes this node's objects (on a background
    thread, in batches) and looks up other nodes' objects and addresses."""

    def __init__(self, config: NodeConfig, key: PeerKey) -> None:

        if not config.redis_url:
            raise ValueError("a global directory needs NodeConfig.redis_url")
        self.config = config
        self.node_id = config.node_id
        self.address: str | None = None  # this node's transfer address, once it serves pulls
        self._key = key
        t = config.remote_timeout_s
        self._redis: Any = redis_client(config, t)
        kw = self._redis.connection_pool.connection_kwargs
        self.name = f"{kw.get('host', '?')}:{kw.get('port', '?')}"  # never the password
        if not kw.get("password"):
            log.warning("the global directory at %s has no password (set redis_password_file): anyone who"
                        " reaches it can delete entries (forged ones are refused by their MAC)", self.name)
        self._stopping = threading.Event()
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._unwritten = 0
        self._thread: threading.Thread | None = None
        self._addresses: dict[str, tuple[str, float]] = {}  # node -> (transfer address, when read)

    def check(self) -> None:
        """Fail at start if the directory refuses our credentials (a transient outage only warns)."""
        import redis

        try:
            self._redis.ping()
        except redis.AuthenticationError as exc:
            raise AuthenticationError(f"the global directory at {self.name} refused node {self.node_id}: {exc};"
                                      " set redis_password_file (and the user in redis_url) to its"
                                      " credentials") from None
        except redis.ResponseError as exc:
            if "NOAUTH" not in str(exc) and "NOPERM" not in str(exc):
                raise
            raise AuthenticationError(f"the global directory at {self.name} requires a password: {exc};"
                                      " set redis_password_file") from None
        except redis.RedisError as exc:
            log.warning("the global directory at %s is not reachable yet: %s", self.name, exc)

    def start(self, address: str | None) -> None:
        """Start publishing; ``address`` (this node's transfer server, if any) is registered first."""
        self.check()
        self.address = address
        self._thread = threading.Thread(target=self._publisher, name="gfaas-directory", daemon=True)
        self._thread.start()
        if address is not None:
            self._enqueue(("node", address))

    def stop(self) -> None:
        self.flush(min(2.0, self.config.remote_timeout_s))
        self._stopping.set()
        if self.address is not None:
            try:
                if self._redis.get(node_key(self.node_id)) == self._node_value(self.address):
                    self._redis.delete(node_key(self.node_id), f"gfaas:nodeinfo:{self.node_id}")
            except Exception as exc:
                log.warning("could not remove node %s from the global directory: %s", self.node_id, exc)
        self._q.put(_STOP)
        if self._thread is not None:
            self._thread.join(1.0)
        try:
            self._redis.close()
        except Exception:
            pass

    # ---- publication (background thread) ------------------------------------------------------------
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
        if self.address is None:
            return
        self._enqueue(("pub", rec.id, self._fields(rec)))

    def unpublish(self, rec: ObjectRecord) -> None:
        if self.address is None:
            return
        fields = self._fields(rec)
        fields["freed"] = "deleted by its producer"
        self._enqueue(("pub", rec.id, fields))

    def on_end_invocation(self, invocation_id: str) -> None:
        if self.address is None:
            return
        self._enqueue(("end", invocation_id))

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

    def _node_value(self, address: str) -> str:
        return f"{address} {self._key.entry_mac('node', self.node_id, {'address': address})}"

    def _info_value(self, address: str) -> str:
        fields = {"address": address, "socket": self.config.socket_path}
        fields["mac"] = self._key.entry_mac("nodeinfo", self.node_id, fields)
        return json.dumps(fields, sort_keys=True)

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
                        # MACed here, off the daemon's loop; over every field, so no field of the
                        # entry can be swapped (a removed "freed" included).
                        fields["mac"] = self._key.entry_mac("obj", oid.hex(), fields)
                        pipe.hset(obj_key(oid), mapping=fields)
                        pipe.sadd(inv_key(fields["invocation"], self.node_id), oid.hex())
                    elif kind == "end":
                        pipe.eval(_END_SCRIPT, 1, inv_key(item[1], self.node_id), "gfaas:obj:")
                    elif kind == "node":
                        pipe.set(node_key(self.node_id), self._node_value(item[1]))
                        pipe.set(f"gfaas:nodeinfo:{self.node_id}", self._info_value(item[1]))
                pipe.execute()
                return
            except redis.RedisError as exc:
                if self._stopping.is_set() or time.monotonic() + delay > deadline:
                    log.error("dropping %d updates of the global directory at %s: %s", len(batch),
                              self.name, exc)
                    return
                log.warning("global directory at %s unreachable (%s); retrying", self.name, exc)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    # ---- look-ups (puller side) -------------------------------------------------------------------
    def lookup(self, oid: bytes, deadline: float) -> dict[str, str] | None:
        """The directory entry of ``oid``, retried with backoff (publication is asynchronous)."""
        import redis

        delay = 0.002
        while True:
            try:
                entry = self._redis.hgetall(obj_key(oid))
            except redis.RedisError as exc:
                raise RemoteError(f"the global directory at {self.name} is unreachable: {exc}") from None
            if entry and "node" in entry:
                if not self._key.entry_ok("obj", oid.hex(), entry):
                    raise AuthenticationError(
                        f"the global directory's entry for object {oid.hex()} failed its MAC check (written"
                        " by someone without the cluster key, or by a node with another key); not pulling it")
                return dict(entry)
            if time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def node_address(self, node: str, fresh: bool) -> str | None:
        """The transfer address of ``node``: cached for a moment unless ``fresh``."""
        import redis

        now = time.monotonic()
        hit = self._addresses.get(node)
        if hit is not None and not fresh and now - hit[1] < NODE_CACHE_S:
            return hit[0]
        try:
            addr = self._redis.get(node_key(node))
        except redis.RedisError as exc:
            raise RemoteError(f"the global directory at {self.name} is unreachable: {exc}") from None
        if addr:
            address, _, mac = str(addr).partition(" ")
            if not self._key.entry_ok("node", node, {"address": address, "mac": mac}):
                raise AuthenticationError(
                    f"the global directory's address of node {node} failed its MAC check (written by someone"
                    " without the cluster key); not connecting to it")
            self._addresses[node] = (address, now)
            return address
        self._addresses.pop(node, None)
        return None


def redis_client(config: NodeConfig, timeout: float) -> Any:
    """A client of the directory of ``config`` (connects lazily): timeouts, the password from
    ``redis_password_file`` (over one in the URL) and the CA of a TLS (``rediss://``) directory."""
    import redis

    kw: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "decode_responses": True}
    if config.redis_ca_file:
        if not (config.redis_url or "").startswith("rediss://"):
            raise ConfigError(f"redis_ca_file={config.redis_ca_file!r} needs a TLS directory URL (rediss://...)")
        kw["ssl_ca_certs"] = config.redis_ca_file
    r = redis.Redis.from_url(config.redis_url or "", **kw)
    if config.redis_password_file:  # from_url lets the URL's password win over a keyword: set it after
        r.connection_pool.connection_kwargs["password"] = read_secret_file(
            config.redis_password_file, "Redis password file").decode()
    return r
