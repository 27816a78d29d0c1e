"""The node daemons a runtime uses, and what it asks of them: :class:`Nodes`.

It starts the runtime's own node daemon (or takes the running ones it is given, or joins a cluster's
directory and finds the others, then follows the nodes that join or leave it while it runs), keeps one control connection to each (``Admin``, shared under one
lock), opens invocations on every node (tokens drawn by the first, or derived from the cluster key),
frees what ended in batches on a thread of its own, lends the gateway's attached connections for the
request inputs and results that go through the data plane, and starts the Redis server of the
baseline transport when an invocation first asks for it. Nothing here knows about workflows or
workers beyond names.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..dataplane.peer_auth import PeerKey
from ..dataplane.protocol import QueueEntry
from ..errors import ConfigError, DaemonUnavailable, GfaasError, NotFound, RemoteError
from .cluster import MEMBERSHIP_S, RETRY_JOIN_S, Cluster, discover, membership_changes
from .config import NodeEndpoint, RuntimeConfig
from .gpus import node_devices
from .hints import Batch as HintBatch
from .scratch import Scratch
from .transport import AttachedPool, RedisTransport, Transport, TransportConfig, open_transport
from .worker import GATEWAY

if TYPE_CHECKING:
    from ..dataplane.client import Binder

log = logging.getLogger("gfaas.runtime")

OPEN_WAIT_S = 10.0  # the longest the ender waits for an invocation's open on a node to land before ending it


class Ending(Protocol):
    """What the ender frees of an ended invocation."""

    id: str
    kind: str
    refs: dict[tuple[str, str], str]


class Nodes:
    """The runtime's node daemons (see the module docstring). ``closers`` collects what the runtime
    closes when it closes (in reverse)."""

    def __init__(self, config: RuntimeConfig, closers: list[Callable[[], None]]) -> None:
        self.config = config
        self._closers = closers
        self.nodes: dict[str, NodeEndpoint] = {}
        self.admins: dict[str, Any] = {}  # node -> Admin; the first is the gateway's node
        self.admin: Any = None
        self.lock = threading.Lock()  # Admin connections are shared by many threads
        self.gateway_pool: AttachedPool | None = None  # attached connections for request inputs and results
        self.redis_url = config.redis_url
        self._redis_lock = threading.Lock()
        self.cluster = self._cluster_view()
        self.locality = False
        self.lazy = False
        self._hint_admins: dict[str, Any] = {}  # node -> the hinter's own Admin connection
        self._ending: deque[Ending] = deque()  # invocations whose data the ender frees
        self._end_cv = threading.Condition()
        self._ender_stop = False
        self._ender_thread: threading.Thread | None = None
        # Membership (join): the nodes found in the directory, the invocations open now (a node that
        # joins opens them too, so a call of one may run there), and when a listed node last failed.
        self.on_change: Callable[[list[str], list[str]], None] | None = None  # (added, removed): the runtime's
        self._joined: set[str] = set()
        self._opened: dict[str, tuple[str, tuple[str, ...]]] = {}  # kept only under join
        self._track = bool(config.join)
        self._join_failed: dict[str, float] = {}
        self._member_stop = threading.Event()
        self._member_thread: threading.Thread | None = None

    # -- start
    def _cluster_view(self) -> Cluster:
        c = self.config
        key = PeerKey.from_file(c.cluster_key_file) if c.cluster_key_file else None
        redis = None
        if c.join:
            from ..config import NodeConfig
            from ..dataplane.directory import redis_client

            redis = redis_client(NodeConfig(node_id="gateway", redis_url=c.join, cluster_key_file=c.cluster_key_file,
                                            redis_password_file=c.redis_password_file), 5.0)
            self._closers.append(redis.close)
        return Cluster(key, redis)

    def start(self) -> None:
        """Reach (or start) the daemons; then the ender thread."""
        cfg = self.config
        if cfg.transport == "redis":
            self.ensure_redis()
        nodes = list(cfg.nodes)
        if not nodes:
            from ..config import NodeConfig
            from ..dataplane.local import LocalNode

            scratch = Scratch("gfaas-rt-", "/tmp")  # removed by the next runtime if this one is killed
            self._closers.append(scratch.remove)
            run_dir = str(scratch.path)
            joined: dict[str, Any] = {}
            if cfg.join:  # the gateway's node is a node of the cluster: peers pull requests from it
                joined = {"redis_url": cfg.join, "redis_password_file": cfg.redis_password_file,
                          "cluster_key_file": cfg.cluster_key_file, "transfer_host": cfg.transfer_host or "127.0.0.1"}
            node_cfg = NodeConfig(node_id="gateway" if cfg.join else "rt0",
                                  socket_path=os.path.join(run_dir, "node.sock"),
                                  state_dir=os.path.join(run_dir, "state"), capacity_bytes=cfg.node_capacity_bytes,
                                  devices=node_devices(cfg.gpus), **joined)
            node = LocalNode(node_cfg).__enter__()
            self._closers.append(lambda: node.__exit__(None, None, None))
            nodes = [NodeEndpoint(node_cfg.node_id, node_cfg.socket_path, node_cfg.state_dir)]
        if cfg.join:
            nodes += self._joined_nodes({n.name for n in nodes})
        from_directory = {n.name for n in nodes[len(cfg.nodes) or 1:]} if cfg.join else set()
        for n in nodes:
            try:
                admin = self.connect_admin(n)
            except (RemoteError, DaemonUnavailable) as exc:
                if n.name not in from_directory:
                    raise
                # A node registered in the directory but not answering (a dead machine's entry stays
                # until it restarts): the cluster is served without it (tried again: membership).
                log.warning("joined node %s at %s does not answer (%s); left out", n.name, n.address, exc)
                self._join_failed[n.name] = time.monotonic()
                continue
            self._closers.append(admin.close)
            self.nodes[n.name], self.admins[n.name] = n, admin
        self._joined = from_directory & set(self.nodes)
        self.cluster.node_ids = {a.node_id: name for name, a in self.admins.items()}
        self.cluster.probe = self.probe
        self.admin = self.admins[nodes[0].name]
        # Under join, nodes may come later: locality from the start, so pools may place workers on them.
        self.locality = cfg.locality if cfg.locality is not None else \
            (cfg.executor == "ray" and (len(self.nodes) > 1 or bool(cfg.join)))
        # One node and worker processes with an attached connection each: an invocation is opened on
        # the node only when a value too large to carry is stored, and a task binds its worker's
        # connection only when it asks (NeedData). Several nodes, Ray and in-process: opened at submit.
        self.lazy = cfg.executor == "process" and len(self.admins) == 1 and self.cluster.key is None
        self.gateway_pool = AttachedPool(self.admin.attach)
        self._closers.append(self.gateway_pool.close)  # (before the node connections: closers run in reverse)
        self._ender_thread = threading.Thread(target=self._ender, name="gfaas-ender", daemon=True)
        self._ender_thread.start()
        if cfg.join:
            self._member_thread = threading.Thread(target=self._membership, name="gfaas-membership", daemon=True)
            self._member_thread.start()

    # -- membership (join)
    def _membership(self) -> None:
        while not self._member_stop.wait(MEMBERSHIP_S):
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - the directory may be briefly away: next round
                log.warning("could not look for nodes that joined or left %s: %s", self.config.join, exc)

    def refresh(self, now: float | None = None) -> tuple[list[str], list[str]]:
        """Look at the directory once (the membership thread does every ``MEMBERSHIP_S``): a node that
        registered since is connected (its daemon must answer and prove the key), opens the invocations
        open now (unless they open lazily: :attr:`opens_lazily`), and is used from then on; a node that joined through the directory and whose entry is
        gone is left out for good (its idle workers retired: ``on_change``). Returns (added, removed)."""
        if self.cluster.redis is None or self.cluster.key is None:
            return [], []
        now = time.monotonic() if now is None else now
        listed = {n["node"]: n for n in discover(self.cluster.redis, self.cluster.key, skip_bad=True)}
        add, remove = membership_changes(set(self.nodes), self._joined, set(listed), self._join_failed, now)
        added: list[str] = []
        for name in add:
            info = listed[name]
            n = NodeEndpoint(name, info["socket"], address=info["address"])
            try:
                admin = self.connect_admin(n)
                admin.snapshot()  # it answers (and, over the network, proved the key)
            except (GfaasError, OSError) as exc:
                log.warning("node %s at %s joined the directory but does not answer (%s); tried again in %.0f s",
                            name, n.address, exc, RETRY_JOIN_S)
                self._join_failed[name] = now
                continue
            with self.lock:  # no invocation opens meanwhile: each is open on the new node or opens there
                try:  # (opened lazily, an invocation opens there with its first task: Invoker._open_on)
                    for inv_id, (workflow, functions) in [] if self.opens_lazily else list(self._opened.items()):
                        tokens = self.cluster.key.function_tokens(inv_id, list(functions))
                        admin.open_invocation(workflow, list(functions), inv_id, tokens)
                except (GfaasError, OSError) as exc:
                    log.warning("node %s could not open the invocations in flight (%s); tried again later", name, exc)
                    self._join_failed[name] = now
                    admin.close()
                    continue
                # New dicts, not changed ones: other threads iterate these without the lock.
                self.nodes = {**self.nodes, name: n}
                self.admins = {**self.admins, name: admin}
                self.cluster.node_ids = {a.node_id: nm for nm, a in self.admins.items()}
            self._closers.append(admin.close)
            self._joined.add(name)
            self._join_failed.pop(name, None)
            self.cluster.left.discard(name)
            added.append(name)
            log.warning("node %s at %s joined; it is used from now on", name, n.address)
        for name in remove:
            self.cluster.left.add(name)  # before it goes: pools stop its workers as they finish
            with self.lock:
                self.nodes = {k: v for k, v in self.nodes.items() if k != name}
                admin = self.admins.get(name)
                self.admins = {k: v for k, v in self.admins.items() if k != name}
            self._joined.discard(name)
            if admin is not None:
                admin.close()
            log.warning("node %s left the directory; its workers are retired", name)
        if (added or remove) and self.on_change is not None:
            self.on_change(added, remove)
        return added, remove

    def _joined_nodes(self, have: set[str]) -> list[NodeEndpoint]:
        """The nodes registered in ``join``'s directory (other than ``have``)."""
        assert self.cluster.redis is not None and self.cluster.key is not None
        found = discover(self.cluster.redis, self.cluster.key)
        out = [NodeEndpoint(n["node"], n["socket"], address=n["address"]) for n in found if n["node"] not in have]
        log.info("joined %s: nodes %s", self.config.join, [n.name for n in out])
        return out

    def connect_admin(self, n: NodeEndpoint) -> Any:
        """A control connection to ``n``: its Unix socket, or its transfer port for a node elsewhere."""
        from ..dataplane.client import Admin

        if n.address and not n.state_dir:
            from ..dataplane.peer_control import PeerAdmin

            if self.cluster.key is None:
                raise ConfigError(f"node {n.name!r} at {n.address} is on another machine: set cluster_key_file")
            return PeerAdmin(n.address, n.name, self.cluster.key)
        return Admin(n.socket_path, state_dir=n.state_dir or None)

    def ensure_redis(self) -> None:
        """Start the baseline's throwaway Redis the first time an invocation needs it."""
        with self._redis_lock:
            if self.redis_url:
                return
            from ..dataplane.redis_server import RedisServer

            # With a password: other local users must not read or rewrite the baseline's objects. The
            # URL carrying it travels to workers over their control socket only, never in argv.
            srv = RedisServer(password=True, lifeline=True).__enter__()
            self._closers.append(lambda: srv.__exit__(None, None, None))
            self.redis_url = f"redis://:{srv.password}@127.0.0.1:{srv.port}/0"

    # -- what the runtime asks
    def first(self) -> str:
        return next(iter(self.nodes), "")

    def transport_settings(self, node: str = "", kind: str = "") -> dict[str, str]:
        if (kind or self.config.transport) == "redis":
            return {"kind": "redis", "redis_url": self.redis_url}
        endpoint = self.nodes[node] if node else next(iter(self.nodes.values()))
        return {"kind": "gfaas", "socket_path": endpoint.socket_path}

    def binder(self, node: str) -> Binder | None:
        """An attached connection to ``node``'s daemon for a new worker process, which serves all of its
        tasks there (bound per task; no connection, Hello or token per task). None: connect per task."""
        from ..dataplane.client import Binder

        admin = self.admins.get(node) or self.admin
        if admin is None:
            return None
        try:
            sock, welcome = admin.attach_socket()
        except GfaasError as exc:
            log.warning("no attached daemon connection for a new worker (it connects per task): %s", exc)
            return None
        return Binder(sock, welcome, self.transport_settings(node, "gfaas")["socket_path"])

    @property
    def opens_lazily(self) -> bool:
        """Whether an invocation is opened on the gateway's node at submit and on each other node only
        when a task first goes there (:meth:`open_on`): with a cluster key (each node derives the
        tokens) and locality (tasks go where their inputs are, often to one machine). Each open on
        another machine is a network round trip, paid per node per invocation."""
        return self.cluster.key is not None and self.locality

    def open(self, workflow: str, functions: list[str], inv_id: str) -> dict[str, str]:
        """Open the invocation on every node (that is up) with the same tokens: drawn by the first node,
        or, with a cluster key, derived from it (each node on another machine derives its own). When
        :attr:`opens_lazily`, only on the gateway's node: the others open as tasks reach them."""
        key = self.cluster.key
        lazily = self.opens_lazily
        # Before the lock: a node due for a probe is probed here, on an admin connection (under the lock).
        down = {name for name in self.admins if not self.cluster.up(name)} \
            if len(self.admins) > 1 and not lazily else set()
        with self.lock:
            if key is None:
                tokens: dict[str, str] = self.admin.open_invocation(workflow, functions, inv_id).tokens
            else:
                tokens = key.function_tokens(inv_id, functions)
                self.admin.open_invocation(workflow, functions, inv_id, tokens)
            if self._track and not lazily:  # (a lazily opened one opens on a joining node with its task)
                self._opened[inv_id] = (workflow, tuple(functions))
            if lazily:
                return tokens
            for name, admin in self.admins.items():
                if admin is self.admin or name in down:
                    continue
                try:  # (a node on another machine is sent no tokens: PeerAdmin drops them, it derives its own)
                    admin.open_invocation(workflow, functions, inv_id, tokens)
                except (RemoteError, DaemonUnavailable) as exc:
                    if not self.locality:
                        raise
                    self.cluster.mark_down(name, str(exc))  # its workers get no calls of this invocation
        return tokens

    def open_on(self, node: str, workflow: str, functions: list[str], inv_id: str) -> None:
        """Open an invocation opened lazily (:meth:`open`) on ``node`` too, before a task goes there; the
        node derives the tokens from the key. Raises (``RemoteError``, ``DaemonUnavailable``) when the node
        does not answer, after marking it down."""
        admin = self.admins.get(node)
        if admin is None or admin is self.admin:
            return
        key = self.cluster.key
        assert key is not None
        try:
            with self.lock:
                admin.open_invocation(workflow, functions, inv_id, key.function_tokens(inv_id, functions))
        except (RemoteError, DaemonUnavailable) as exc:
            self.cluster.mark_down(node, str(exc))
            raise

    def gateway_transport(self, inv_id: str, kind: str, tokens: dict[str, str]) -> Transport:
        """The platform's side of an invocation (its request inputs, its results): on the data plane,
        a long-lived connection from the pool bound to the invocation's gateway credentials."""
        if kind == "gfaas" and self.gateway_pool is not None:
            return self.gateway_pool.transport(tokens.get(GATEWAY, ""))
        cfg = TransportConfig(**self.transport_settings("", kind))  # type: ignore[arg-type]
        return open_transport(cfg, inv_id, GATEWAY, tokens.get(GATEWAY, ""))

    def probe(self, node: str) -> None:
        with self.lock:
            admin = self.admins.get(node)
            if admin is None:
                raise NotFound(f"node {node!r} is not one of the runtime's nodes any more")
            admin.snapshot()

    def check(self, node: str) -> None:
        """A worker on ``node`` died: if its daemon does not answer either, leave the node out."""
        admin = self.admins.get(node)
        if admin is None or admin is self.admin:
            return
        try:
            with self.lock:
                admin.snapshot()
        except GfaasError as exc:
            self.cluster.mark_down(node, f"its daemon does not answer ({exc})")

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each node daemon's ``Admin.stats()``, by node name."""
        with self.lock:
            return {name: admin.stats() for name, admin in self.admins.items()}

    def snapshots(self) -> list[dict[str, Any]]:
        """Each node daemon's live figures (``Admin.snapshot()``: counters only, cheap enough to poll),
        in the order of the runtime's nodes; each carries its ``node_id`` and the runtime's ``node`` name."""
        with self.lock:
            return [{**admin.snapshot(), "node": name} for name, admin in self.admins.items()]

    def object_info(self, node: str, ref: Any) -> dict[str, Any]:
        """``Admin.object_info(ref)`` on ``node`` (the runtime's name for it, or the daemon's node_id)."""
        admin = self.admins.get(node) or next((a for a in self.admins.values() if a.node_id == node), None)
        if admin is None:
            raise NotFound(f"no node {node!r} is used by this runtime; its nodes: {sorted(self.admins)}")
        with self.lock:
            out: dict[str, Any] = admin.object_info(ref)
        return out

    def queue_state(self, entries: list[QueueEntry], heads: dict[str, int]) -> None:
        """Queue hints to every node now, on the shared connections."""
        with self.lock:
            for admin in self.admins.values():
                admin.queue_state(entries, heads)

    def send_hints(self, batch: HintBatch) -> None:
        """The hinter's round: one ``QueueState`` per node, on the hinter's own connections."""
        entries = [QueueEntry(*e) for e in batch[0]]
        self._drop_left(self._hint_admins)
        for node in list(self.nodes):
            if not self.cluster.up(node):
                continue
            try:
                self._own_admin(self._hint_admins, node).queue_state(entries, batch[1])
            except Exception:
                stale = self._hint_admins.pop(node, None)
                if stale is not None:  # perhaps broken mid-call: a fresh connection next round
                    stale.close()
                raise

    # -- freeing what ended
    def end(self, inv: Ending) -> None:
        """Free ``inv``'s data on the nodes (or the Redis server), soon, on the ender's thread: its daemon
        round trips are off every caller's path and hold no lock the next submit waits for."""
        self._opened.pop(inv.id, None)
        with self._end_cv:
            self._ending.append(inv)
            self._end_cv.notify()

    def _ender(self) -> None:
        """Free what ended, in batches: one ``EndInvocations`` round trip per node for all the
        invocations that ended since the last one, on connections of this thread's own."""
        own: dict[str, Any] = {}  # node -> this thread's Admin connection
        try:
            while True:
                with self._end_cv:
                    while not self._ending and not self._ender_stop:
                        self._end_cv.wait()
                    if not self._ending:
                        return
                    batch = list(self._ending)
                    self._ending.clear()
                self._free(batch, own)
        finally:
            for admin in own.values():
                admin.close()

    def close(self) -> None:
        """Free what is still pending, stop the ender, and close the hinter's connections (before the
        node connections close: the runtime's closers do that)."""
        self._member_stop.set()
        if self._member_thread is not None:
            self._member_thread.join(30)
        if self._ender_thread is not None:
            with self._end_cv:
                self._ender_stop = True
                self._end_cv.notify()
            self._ender_thread.join(30)
        for admin in self._hint_admins.values():
            admin.close()

    def _drop_left(self, own: dict[str, Any]) -> None:
        """Close a background thread's connections to nodes that left."""
        for node in [n for n in own if n not in self.nodes]:
            own.pop(node).close()

    def _own_admin(self, own: dict[str, Any], node: str) -> Any:
        """A background thread's own Admin connection to ``node`` (made on first use)."""
        admin = own.get(node)
        if admin is None:
            from ..dataplane.client import Admin

            n = self.nodes[node]
            admin = own[node] = Admin(n.socket_path, state_dir=n.state_dir or None) if n.state_dir or not n.address \
                else self.connect_admin(n)
        return admin

    def _free(self, invs: list[Ending], own: dict[str, Any]) -> None:
        for inv in invs:  # an open still on its way to a node (opened ahead of tasks) lands before the end
            for once in (getattr(inv, "on_nodes", None) or {}).values():
                once.wait(OPEN_WAIT_S)
        ids = [inv.id for inv in invs if inv.kind == "gfaas"]
        self._drop_left(own)
        if ids:
            for node in list(self.nodes):
                if not self.cluster.up(node):
                    continue  # a node that is down lost its objects; it is not waited for
                try:
                    self._own_admin(own, node).end_invocations(ids)
                except Exception:  # noqa: BLE001 - the results stand; leftovers go with the node
                    log.exception("could not free the data of %d invocations on node %s", len(ids), node)
                    stale = own.pop(node, None)
                    if stale is not None:  # perhaps broken mid-call: a fresh connection next time
                        stale.close()
        for inv in invs:
            if inv.kind == "gfaas":
                continue
            try:
                keys = [r.removeprefix("redis:").split("|")[0] for r in inv.refs.values()]
                if keys:
                    RedisTransport(TransportConfig("redis", redis_url=self.redis_url), inv.id, GATEWAY)._r.delete(*keys)
            except Exception:  # noqa: BLE001 - the result stands; leftovers go with the server
                log.exception("could not free the data of invocation %s", inv.id)
