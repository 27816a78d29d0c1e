"""The transfer server: other nodes pull this node's objects from it over TCP.

The owner authenticates the pulling function's token against its own registry, checks access as a
local ``get`` would, streams the object in chunks and counts the read once the puller confirms every
byte arrived (see :mod:`gfaas.dataplane.transfer_wire`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from ..config import NodeConfig
from ..errors import DataDeleted, GfaasError, ProtocolError, code_of
from .node_access import NodeAccess, pin_for_transfer, unpin
from .store import ObjectRecord, Segment
from .transfer_wire import (
    WIRE_VERSION,
    Chunk,
    Consumed,
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

MAX_SERVER_CONNECTIONS = 128


class TransferServer:
    """Serves pulls of this node's objects. After :meth:`listen`, ``address`` is ``"host:port"``
    as other nodes should dial it (also written to ``<state_dir>/transfer.addr``)."""

    def __init__(self, config: NodeConfig, node: NodeAccess) -> None:
        self.config = config
        self.node_id = config.node_id
        self._node = node
        self.address: str | None = None
        self.port: int | None = None
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._cv = threading.Condition()
        self._active = 0
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
        self._thread = threading.Thread(target=self._accept_loop, name="gfaas-transfer", daemon=True)
        self._thread.start()
        log.info("node %s serves cross-node pulls on %s (advertised as %s)", self.node_id,
                 ls.getsockname()[:2], self.address)
        return self.address

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()
        if self._thread is not None:
            self._thread.join(1.0)
        try:
            os.unlink(os.path.join(self.config.state_dir, "transfer.addr"))
        except OSError:
            pass

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
                msg = read_frame(sock, to_owner)
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
        d = self._node
        store = d.store
        with d.lock:
            inv, fn = store.registry.authenticate(msg.token)
            rec = store.lookup(inv.id, fn, msg.id)
            seg = store.resident(rec)
            header = Header(rec.id, rec.invocation, rec.producer,
                            sorted(rec.consumers) if rec.consumers is not None else None,
                            rec.nbytes, rec.dtype, list(rec.shape))
            mapped = store.backend.host_view(seg.handle) if rec.nbytes else None
            holder = pin_for_transfer(store, seg, rec.invocation) if mapped is not None else None
        try:
            self._send_object(sock, header, rec, seg, mapped, fn)
        finally:
            if holder is not None:
                with d.lock:
                    unpin(store, holder)
        log.debug("served %s (%d bytes) to %s of %s", rec.id.hex(), rec.nbytes, fn, inv.id)

    def _send_object(self, sock: socket.socket, header: Header, rec: ObjectRecord, seg: Segment,
                     mapped: memoryview | None, fn: str) -> None:
        d = self._node
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
            send_all(sock, [encode_frame(Chunk(n)), data])
            off += n
        ack = read_frame(sock, to_owner)
        if not isinstance(ack, Received):
            raise ProtocolError(f"expected Received after the object's bytes, got {type(ack).__name__}")
        with d.lock:
            if store.objects.get(rec.id) is rec:
                store.consumed(rec, fn)
        sock.sendall(encode_frame(Consumed()))
