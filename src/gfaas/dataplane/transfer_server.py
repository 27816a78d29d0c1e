"""The transfer server: other nodes pull this node's objects from it over TCP.

Only peers that prove the cluster key get past :class:`~gfaas.dataplane.peer_gate.PeerGate`. On a
proven connection the owner serves pulls one after another: it checks against its own registry that
the named function of the named invocation may read the object, as a local ``get`` would, streams
the object in chunks and counts the read once the puller confirms every byte arrived (see
:mod:`gfaas.dataplane.transfer_wire`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from ..config import NodeConfig
from ..errors import AccessDenied, DataDeleted, GfaasError, ProtocolError, code_of
from .node_access import NodeAccess, pin_for_transfer, unpin
from .peer_auth import PeerKey
from .peer_control import ControlRelay
from .peer_gate import PeerGate
from .store import DENIED_MESSAGE, ObjectRecord, Segment
from .transfer_wire import (
    Chunk,
    Consumed,
    Control,
    ControlReply,
    Fail,
    Header,
    Pull,
    Received,
    encode_frame,
    read_frame,
    send_all,
    to_owner,
)

log = logging.getLogger("gfaas.dataplane.remote")

IDLE_S = 15.0  # a proven connection waiting for its next pull is closed after this long


class TransferServer:
    """Serves pulls of this node's objects. After :meth:`listen`, ``address`` is ``"host:port"``
    as other nodes should dial it (also written to ``<state_dir>/transfer.addr``)."""

    def __init__(self, config: NodeConfig, node: NodeAccess, key: PeerKey, relay: ControlRelay | None = None) -> None:
        self.config = config
        self._relay = relay  # a gateway's admin requests from another machine (peer_control)
        self.node_id = config.node_id
        self._node = node
        self._key = key
        self.address: str | None = None
        self.port: int | None = None
        self._listener: socket.socket | None = None
        self._gate: PeerGate | None = None
        self._thread: threading.Thread | None = None

    def listen(self) -> str:
        c = self.config
        host = c.transfer_host or ""
        try:
            infos = socket.getaddrinfo(host or None, c.transfer_port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
            family, _, _, _, sockaddr = infos[0]
            ls = socket.socket(family, socket.SOCK_STREAM)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(sockaddr)
            ls.listen(512)
        except OSError as exc:
            raise GfaasError(
                f"cannot listen for cross-node pulls on {host}:{c.transfer_port}: {exc}; choose another"
                " --transfer-host/--transfer-port"
            ) from None
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
        self._gate = PeerGate(c, self._key, ls, self._serve_connection)
        self._thread = threading.Thread(target=self._gate.run, name="gfaas-transfer", daemon=True)
        self._thread.start()
        log.info("node %s serves cross-node pulls on %s (advertised as %s)", self.node_id,
                 ls.getsockname()[:2], self.address)
        return self.address

    @property
    def active(self) -> int:
        """Proven connections being served now."""
        return self._gate.active if self._gate is not None else 0

    def stop(self) -> None:
        if self._gate is not None:
            self._gate.stop()
        if self._thread is not None:
            self._thread.join(1.0)
        if self._listener is not None:
            self._listener.close()
        try:
            os.unlink(os.path.join(self.config.state_dir, "transfer.addr"))
        except OSError:
            pass

    def _serve_connection(self, sock: socket.socket, peer: Any, node: str) -> None:
        """Serve pulls from the proven peer ``node`` until it closes, idles or a pull fails."""
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                sock.settimeout(IDLE_S)
                try:
                    msg = read_frame(sock, to_owner)
                except (TimeoutError, EOFError, ConnectionError):
                    return  # idle, or the puller closed its end: the normal end of a connection
                sock.settimeout(self.config.remote_timeout_s)
                try:
                    if isinstance(msg, Control):
                        if self._relay is None:
                            raise ProtocolError("this node takes no control requests from other machines")
                        sock.sendall(encode_frame(ControlReply(self._relay.handle(msg.request, node))))
                        continue
                    if not isinstance(msg, Pull):
                        raise ProtocolError(f"expected a Pull request, got {type(msg).__name__}")
                    self._stream(sock, msg, node)
                except GfaasError as exc:
                    log.debug("pull from node %s at %s refused: %s", node, peer, exc)
                    try:
                        sock.sendall(encode_frame(Fail(code_of(exc), str(exc))))
                    except OSError:
                        pass
                    return  # the stream may be anywhere: the puller opens a fresh connection
        except (OSError, EOFError) as exc:  # the puller went away or timed out: nothing to answer
            log.debug("pull connection from %s ended: %s", peer, exc)
        except Exception:
            log.exception("internal error serving a pull from %s", peer)
        finally:
            sock.close()

    def _stream(self, sock: socket.socket, msg: Pull, peer_node: str) -> None:
        d = self._node
        store = d.store
        staging: Segment | None = None
        with d.lock:
            # The peer proved the cluster key; the invocation and function it names are checked here,
            # against this node's own registry, exactly as for a local reader.
            inv = store.registry.get(msg.invocation)
            fn = msg.function
            if fn not in inv.functions:
                raise AccessDenied(DENIED_MESSAGE)
            rec = store.lookup(inv.id, fn, msg.id)
            seg = store.resident(rec)
            header = Header(rec.id, rec.invocation, rec.producer,
                            sorted(rec.consumers) if rec.consumers is not None else None,
                            rec.nbytes, rec.dtype, list(rec.shape))
            if seg.device >= 0 and rec.nbytes:
                # A GPU object leaves the machine through host memory: one copy into a warm host
                # segment (registered with the GPU once its reuse pays: one DMA), streamed from there.
                staging = store.staging(rec.invocation, rec.nbytes)
                store.hold(seg)  # its memory stays while the copy runs, whatever happens to the object
        try:
            if staging is not None:
                try:
                    self._stage(seg, rec, staging)
                finally:
                    with d.lock:
                        store.unhold(seg)
            src, offset = (staging, 0) if staging is not None else (seg, rec.offset)
            with d.lock:
                mapped = store.backend.host_view(src.handle) if rec.nbytes else None
                holder = pin_for_transfer(store, src, rec.invocation) if mapped is not None else None
            try:
                self._send_object(sock, header, rec, src, mapped, fn, offset)
            finally:
                if holder is not None:
                    with d.lock:
                        unpin(store, holder)
        finally:
            if staging is not None:
                with d.lock:
                    store.end_staging(staging)
        log.debug("served %s (%d bytes) to %s of %s on node %s", rec.id.hex(), rec.nbytes, fn, inv.id, peer_node)

    def _stage(self, seg: Segment, rec: ObjectRecord, staging: Segment) -> None:
        """Copy GPU object ``rec`` into host segment ``staging`` (outside the lock: both are held),
        after the producer's writes (its event)."""
        store = self._node.store
        dev = store.devices[seg.device]
        if rec.event:
            dev.wait_event(rec.event)
        view = store.backend.host_view(staging.handle)
        try:
            dev.copy_out(seg.handle, rec.offset, rec.nbytes,
                         memoryview(bytearray(rec.nbytes)) if view is None else view[: rec.nbytes])
        finally:
            if view is not None:
                view.release()

    def _send_object(self, sock: socket.socket, header: Header, rec: ObjectRecord, seg: Segment,
                     mapped: memoryview | None, fn: str, offset: int) -> None:
        """Stream ``rec``'s bytes from ``seg`` at ``offset`` (its own segment, or a staging copy)."""
        d = self._node
        store = d.store
        sock.sendall(encode_frame(header))
        chunk = self.config.chunk_bytes
        buf = memoryview(bytearray(0 if mapped is not None else min(chunk, rec.nbytes)))
        off = 0
        while off < rec.nbytes:
            n = min(chunk, rec.nbytes - off)
            if mapped is not None:  # straight from the segment (pinned: not reused meanwhile)
                data = mapped[offset + off : offset + off + n]
            else:
                with d.lock:  # the object may be freed meanwhile (delete, end of its invocation)
                    if store.objects.get(rec.id) is not rec:
                        raise DataDeleted(f"object {rec.id.hex()} was freed on node {self.node_id} during"
                                          " the transfer; it can no longer be read")
                    store.backend.copy_out(seg.handle, offset + off, n, buf[:n])
                data = buf[:n]
            send_all(sock, [encode_frame(Chunk(n)), data])
            off += n
        ack = read_frame(sock, to_owner)
        if not isinstance(ack, Received):
            raise ProtocolError(f"expected Received after the object's bytes, got {type(ack).__name__}")
        with d.lock:
            store.net_bytes["net-out"] += rec.nbytes  # sent and acknowledged; read by the stats stream
            if store.objects.get(rec.id) is rec:
                store.consumed(rec, fn)
        sock.sendall(encode_frame(Consumed()))
