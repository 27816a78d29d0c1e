"""Cross-node data plane: the global directory in Redis and the TCP transfer server.

A two-level directory (FaaSTube §5.2, GROUTER §4.2): each node daemon answers from its own table
first (:class:`~gfaas.dataplane.store.Store`); only on a local miss does it consult the global table
in Redis, find the node that holds the object, and pull the bytes from that node's transfer server
into a local segment. The daemon calls this module only through the hooks of :class:`Remote`.

The parts: :mod:`~gfaas.dataplane.directory` (the Redis directory and its publisher thread),
:mod:`~gfaas.dataplane.transfer_server` (the owner side), :mod:`~gfaas.dataplane.puller` (the
reader's side) and :mod:`~gfaas.dataplane.transfer_wire` (their frames). They reach the daemon only
through :class:`~gfaas.dataplane.node_access.NodeAccess` (its lock and store).
"""

from __future__ import annotations

from ..config import NodeConfig
from . import protocol as P
from .directory import GlobalDirectory
from .node_access import NodeAccess
from .peer_auth import PeerKey
from .peer_control import ControlRelay
from .puller import Export, Puller
from .store import ObjectRecord, Session
from .transfer_server import TransferServer


class Remote:
    """Cross-node support of one node daemon: directory publication, transfer server, pulls.

    Created by :mod:`~gfaas.dataplane.node_main` when ``transfer_host`` or ``redis_url`` is set.
    After :meth:`start`, ``address`` is ``"host:port"`` of the transfer server (also written to
    ``<state_dir>/transfer.addr``) and ``port`` the port it listens on.
    """

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.key = PeerKey.from_file(config.cluster_key_file)  # ConfigError (unsafe or short) stops the start
        self.directory = GlobalDirectory(config, self.key) if config.redis_url else None
        self.server: TransferServer | None = None
        self.relay: ControlRelay | None = None
        self.puller: Puller | None = None
        self.address: str | None = None
        self.port: int | None = None
        self._stopped = False

    def start(self, node: NodeAccess) -> None:
        if self.config.transfer_host is not None:
            token = getattr(node, "relay_token", "")
            self.relay = ControlRelay(self.config.socket_path, token, self.key) if token else None
            self.server = TransferServer(self.config, node, self.key, self.relay)
            self.address = self.server.listen()
            self.port = self.server.port
        if self.directory is not None:
            self.directory.start(self.address)
            self.puller = Puller(self.config, self.directory, node, self.key)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.puller is not None:
            self.puller.stop()
        if self.directory is not None:
            self.directory.stop()
        if self.server is not None:
            self.server.stop()
        if self.relay is not None:
            self.relay.close()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued directory update was written (or dropped); False on timeout."""
        return self.directory.flush(timeout) if self.directory is not None else True

    # ---- hooks the daemon calls (loop thread, under its lock) --------------------------------------
    def publish(self, rec: ObjectRecord) -> None:
        if self.directory is not None:
            self.directory.publish(rec)

    def unpublish(self, rec: ObjectRecord) -> None:
        if self.directory is not None:
            self.directory.unpublish(rec)

    def on_end_invocation(self, invocation_id: str) -> None:
        if self.directory is not None:
            self.directory.on_end_invocation(invocation_id)

    def on_retire(self, segment_id: int) -> None:
        """Nothing to do: transfers re-check under the daemon lock that their object is still there."""

    def may_fetch(self, oid: object) -> bool:
        return self.puller is not None and self.puller.may_fetch(oid)

    def fetch(self, session: Session, oid: bytes, export: Export) -> tuple[P.Reply, list[int]]:
        """Pull ``oid`` from the node the directory names (on a daemon worker thread)."""
        assert self.puller is not None, "fetch without may_fetch"
        return self.puller.fetch(session, oid, export)
