"""A node process of the scaling testbed (``python -m gfaas.scaling.node``, inside its namespace).

The manager talks to it over stdin/stdout frames (:mod:`gfaas.scaling.frames`); blocks move between
nodes over TCP, each connection opened with the cluster key's mutual HMAC handshake
(:class:`gfaas.dataplane.peer_auth.PeerKey`), so an address without the key cannot feed a node a
byte.

Multicast: the manager gives each node its part of the schedule (what it sends and receives at
which step) and the SHA-256 of every block. There is no global barrier: a node's single sender
thread walks its sends in step order and starts step ``t``'s send as soon as it holds the block.
Since every node has one send and one receive port and each follows the order the schedule
gives its ports, a node waits only for what it needs; a barrier would add the slowest transfer
of each step to every step. A receiver pre-allocates every expected block's buffer
(:func:`~gfaas.models.llm_blocks.packed_size`), reads the payload straight into it, and counts it
as held only after :func:`~gfaas.models.llm_blocks.unpack_block` accepted its header and its
digest matched. A refused block (garbled, unexpected, or from a peer that fails the handshake) is
reported and pulled again from a source, so the node still completes.

Serving: ``fwd`` runs one forward pass of a block range over a request's next tokens (stages are
built on the held buffers without a copy). In a pipeline the manager sends ``fwd`` to every stage:
the first gets the tokens, each later one only what to expect (request, token step, block range,
rows, the node before it). A stage sends its hidden states straight to the next stage's node over
TCP (``hid`` frames on a connection opened with the same cluster-key handshake, so they share the
shaped links with the blocks); the receiver runs them only if they match an expectation the
manager announced (request id, step, first block, sending node, rows x width), and only the last
stage's token goes back to the manager. ``export``/``import`` move a request's KV cache when it
switches from a pipeline to local execution. An optional per-stage floor emulates an accelerator's
time per token, so concurrent instances do not just share the host's two CPUs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import sys
import threading
import time
from functools import partial
from io import BufferedReader
from typing import Any, BinaryIO, cast

import numpy as np

from ..dataplane.peer_auth import PeerKey
from ..errors import ConfigError, GfaasError, ProtocolError
from ..models.llm import (
    LlamaConfig,
    LlamaStage,
    RequestState,
    aligned_buffer,
    packed_size,
    random_blocks,
    unpack_block,
)
from . import frames as F
from .warm import WarmCache

log = logging.getLogger("gfaas.scaling")

HANDSHAKE_TIMEOUT_S = 10.0


def _digest(buf: bytes | memoryview) -> str:
    return hashlib.sha256(buf).hexdigest()


class Node:
    """One node's state: held blocks, the current multicast run, the model stages it serves."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._out_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self.recv_order: list[int] = []
        self.recv_pos = 0
        self._go = threading.Event()
        self.me = -1
        self.key: PeerKey | None = None
        self.addrs: list[str] = []
        self.port = 0
        self.held: dict[int, memoryview] = {}
        self.arrived: dict[int, threading.Event] = {}
        self.expect: dict[tuple[int, int], tuple[int, memoryview]] = {}  # (src, block) -> (step, buffer)
        self.digests: list[str] = []
        self.model_key = ""
        self.own: list[memoryview] = []  # the copy a hot node loaded at set-up
        self.stages: dict[tuple[int, int], LlamaStage] = {}
        self.run_id = -1
        self.repair_from = 0
        self._listener: socket.socket | None = None
        # The emulated accelerator runs one pass at a time; passes come from the control loop (first
        # stages, local nodes) and from peer threads (hidden states of a previous stage).
        self._compute = threading.Lock()
        self._hid_expect: dict[tuple[int, int, int], dict[str, Any]] = {}  # (rid, step, first) -> fwd meta
        self._hid_conns: dict[int, tuple[socket.socket, BufferedReader]] = {}
        self._hid_lock = threading.Lock()
        self.hidden_wait_s = HANDSHAKE_TIMEOUT_S  # how long hidden states may precede their announcement

    # ---- output ----------------------------------------------------------------------------------
    def emit(self, kind: str, meta: dict[str, Any] | None = None, payload: bytes | memoryview = b"") -> None:
        with self._out_lock:
            F.write_frame(self._out, kind, meta, payload)

    # ---- control ---------------------------------------------------------------------------------
    def setup(self, m: dict[str, Any]) -> None:
        self.me = F.need(m, "node", int)
        self.addrs = F.need(m, "addrs", list)
        self.port = F.need(m, "port", int)
        self.cfg = LlamaConfig(**F.need(m, "config", dict))
        self.blocks = F.need(m, "blocks", int)
        self.key = PeerKey(bytes.fromhex(F.need(m, "key", str)))
        self.sizes = [packed_size(self.cfg, b, self.blocks) for b in range(self.blocks)]
        self.floor_s = float(m.get("floor_s", 0.0))
        self.cache = WarmCache(int(m.get("cache_bytes", 4 * sum(self.sizes))), float(m.get("keep_alive_s", 60.0)))
        digests: list[str] = []
        if m.get("hot"):
            for b, blk in enumerate(random_blocks(self.cfg, F.need(m, "seed", int), self.blocks)):
                buf = aligned_buffer(len(blk))
                buf[:] = blk
                self._hold(b, buf)
                self.own.append(buf)
                digests.append(_digest(buf))
        srv = socket.create_server((self.addrs[self.me], self.port), backlog=64)
        self._listener = srv
        threading.Thread(target=self._accept, args=(srv,), daemon=True).start()
        self.emit("ready", {"node": self.me, "digests": digests, "pid": os.getpid()})

    def _hold(self, block: int, buf: memoryview) -> None:
        with self._lock:
            self.held[block] = buf
            ev = self.arrived.setdefault(block, threading.Event())
        ev.set()

    def multicast(self, m: dict[str, Any]) -> None:
        """Start this node's part of a multicast run (returns at once; ``done`` reports the end)."""
        run = F.need(m, "run", int)
        sends = [tuple(x) for x in F.need(m, "sends", list)]
        recvs = [tuple(x) for x in F.need(m, "recvs", list)]
        garble = {int(s): str(where) for s, where in m.get("garble", [])}
        with self._cv:
            self.digests = F.need(m, "digests", list)
            self.model_key = hashlib.sha256("".join(self.digests).encode()).hexdigest()
            self.repair_from = F.need(m, "repair_from", int)
            # Each run starts from scratch: a source of this run holds its loaded copy (hot tier), every
            # other node nothing (cold); what it served before stays in its warm cache.
            self.held.clear()
            self.arrived.clear()
            self.stages.clear()
            if m.get("hold"):
                if len(self.own) != self.blocks:
                    raise ConfigError(f"node {self.me} is a source but holds no loaded copy of the model")
                for b, buf in enumerate(self.own):
                    self.held[b] = buf
                    self.arrived[b] = threading.Event()
                    self.arrived[b].set()
            self.expect = {(src, blk): (step, aligned_buffer(self.sizes[blk])) for step, src, blk in recvs}
            self.recv_order = sorted(step for step, _, _ in recvs)
            self.recv_pos = 0
            for _, _, blk in recvs:
                self.arrived.setdefault(blk, threading.Event())
            self.run_id = run
            self._go = threading.Event()
            self._cv.notify_all()
        threading.Thread(target=self._run, args=(run, sends, recvs, garble, self._go), daemon=True).start()

    def _run(self, run: int, sends: list[tuple[int, ...]], recvs: list[tuple[int, ...]],
             garble: dict[int, str], go: threading.Event) -> None:
        sent: list[list[float]] = []
        conns: dict[int, tuple[socket.socket, BufferedReader]] = {}
        try:
            # Connect (and prove the key) to every destination up front, off the schedule's critical path.
            for dst in dict.fromkeys(d for _, d, _ in sorted(sends)):
                conns[dst] = self._connect(dst, "blocks", run)
            self.emit("armed", {"run": run})
            if not go.wait(300):
                raise ConfigError(f"node {self.me} armed for run {run} but never told to start")
            for step, dst, blk in sorted(sends):
                ev = self.arrived.setdefault(blk, threading.Event())
                if not ev.wait(300):
                    raise ConfigError(f"node {self.me} never got block {blk} it must send at step {step}")
                payload: bytes | memoryview = self.held[blk]
                if step in garble:
                    payload = _garbled(self.held[blk], garble[step])
                sock, f = conns[dst]
                ready = F.read_frame(f, 0)  # the receiver's port is free for this step
                if ready is None or ready.kind != "go" or ready.meta.get("step") != step:
                    raise ProtocolError(f"node {dst} answered step {step} with {ready and (ready.kind, ready.meta)}")
                t0 = time.monotonic()
                F.send_frame(sock, "blk", {"block": blk, "step": step}, payload)
                # sendall returns once the block is in the kernel's buffers; the send port is free only
                # when the receiver has it all, and a next send started earlier would share the port.
                ack = F.read_frame(f, 0)
                if ack is None or ack.kind != "got" or ack.meta.get("step") != step:
                    raise ProtocolError(f"node {dst} did not confirm step {step}: {ack and (ack.kind, ack.meta)}")
                sent.append([step, dst, blk, t0, time.monotonic()])
            for _, _, blk in recvs:
                if not self.arrived[blk].wait(300):
                    raise ConfigError(f"node {self.me} never got block {blk}")
            with self._lock:
                if len(self.held) == self.blocks:  # keep the model in host memory for a warm start
                    self.cache.put(self.model_key, [self.held[b] for b in range(self.blocks)], time.monotonic())
            self.emit("done", {"run": run, "sent": sent})
        except (OSError, GfaasError) as exc:
            self.emit("error", {"run": run, "message": f"node {self.me}: {exc}"})
        finally:
            for sock, f in conns.values():
                f.close()
                sock.close()

    # ---- peer connections ------------------------------------------------------------------------
    def _connect(self, dst: int, purpose: str, run: int) -> tuple[socket.socket, BufferedReader]:
        """A connection to node ``dst`` after the mutual cluster-key handshake."""
        assert self.key is not None
        sock = socket.create_connection((self.addrs[dst], self.port), timeout=HANDSHAKE_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = sock.makefile("rb")
        try:
            nonce = os.urandom(32)
            F.send_frame(sock, "hello", {"node": self.me, "to": dst, "nonce": nonce.hex(), "purpose": purpose,
                                         "run": run})
            ch = F.read_frame(f, 0)
            if ch is None or ch.kind != "challenge":
                raise ProtocolError(f"node {dst} answered the hello with {ch and ch.kind}")
            server_nonce = bytes.fromhex(F.need(ch.meta, "nonce", str))
            want = self.key.proof("server", str(self.me), str(dst), nonce, server_nonce)
            if not PeerKey.check(want, bytes.fromhex(F.need(ch.meta, "proof", str))):
                raise ProtocolError(f"node {dst} failed the cluster-key proof")
            F.send_frame(sock, "proof", {"proof": self.key.proof("client", str(self.me), str(dst), nonce,
                                                                 server_nonce).hex()})
        except BaseException:
            f.close()
            sock.close()
            raise
        sock.settimeout(None)
        return sock, f

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                sock, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_peer, args=(sock,), daemon=True).start()

    def _handshake(self, sock: socket.socket, f: BufferedReader) -> tuple[int, dict[str, Any]]:
        """The peer's node id and hello once it proved the cluster key (ProtocolError otherwise)."""
        assert self.key is not None
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        hello = F.read_frame(f, 0)
        if hello is None or hello.kind != "hello":
            raise ProtocolError(f"a peer opened with {hello and hello.kind}, not hello")
        peer = F.need(hello.meta, "node", int)
        if not 0 <= peer < len(self.addrs) or peer == self.me or hello.meta.get("to") != self.me:
            raise ProtocolError(f"a peer claims to be node {peer} calling node {hello.meta.get('to')}")
        client_nonce = bytes.fromhex(F.need(hello.meta, "nonce", str))
        if len(client_nonce) != 32:
            raise ProtocolError(f"peer claiming node {peer} sent a {len(client_nonce)}-byte nonce, expected 32")
        nonce = os.urandom(32)
        F.send_frame(sock, "challenge", {"nonce": nonce.hex(), "proof": self.key.proof(
            "server", str(peer), str(self.me), client_nonce, nonce).hex()})
        pr = F.read_frame(f, 0)
        want = self.key.proof("client", str(peer), str(self.me), client_nonce, nonce)
        if pr is None or pr.kind != "proof" or not PeerKey.check(want, bytes.fromhex(F.need(pr.meta, "proof", str))):
            raise ProtocolError(f"peer claiming node {peer} failed the cluster-key proof")
        sock.settimeout(None)
        return peer, hello.meta

    def _serve_peer(self, sock: socket.socket) -> None:
        f = sock.makefile("rb")
        peer = -1
        try:
            peer, hello = self._handshake(sock, f)
            if hello.get("purpose") == "pull":
                self._serve_pulls(sock, f, peer)
            elif hello.get("purpose") == "hidden":
                self._receive_hidden(f, peer)
            else:
                self._receive_from(sock, f, peer, F.need(hello, "run", int))
        except (OSError, GfaasError, ValueError) as exc:
            self.emit("log", {"message": f"node {self.me}: connection from node {peer} closed: {exc}"})
        finally:
            f.close()
            sock.close()

    def _serve_pulls(self, sock: socket.socket, f: BufferedReader, peer: int) -> None:
        while (fr := F.read_frame(f, 0)) is not None:
            if fr.kind != "pull":
                raise ProtocolError(f"unexpected {fr.kind} frame on a pull connection from node {peer}")
            blk = F.need(fr.meta, "block", int)
            buf = self.held.get(blk)
            if buf is None:
                F.send_frame(sock, "refused", {"block": blk, "why": f"node {self.me} lacks it"})
            else:
                F.send_frame(sock, "blk", {"block": blk, "step": -1}, buf)

    def _receive_from(self, sock: socket.socket, f: BufferedReader, peer: int, run: int) -> None:
        """Receive this run's blocks from ``peer`` in schedule order: the receive port takes one block
        at a time, so before each block the node waits until its earlier receives are complete and
        then tells the sender to go (one frame: a round trip, microseconds on these links)."""
        with self._cv:
            if not self._cv.wait_for(lambda: self.run_id >= run, timeout=HANDSHAKE_TIMEOUT_S) or self.run_id != run:
                raise ProtocolError(f"node {peer} sends for run {run}, node {self.me} is in run {self.run_id}")
            mine = sorted((step, blk) for (src, blk), (step, _) in self.expect.items() if src == peer)
        for step, blk in mine:
            with self._cv:
                self._cv.wait_for(partial(self._port_free, step))
                buf = self.expect[(peer, blk)][1]
            F.send_frame(sock, "go", {"step": step})
            h = hashlib.sha256()
            try:
                fr = F.read_frame(f, len(buf), partial(_slot, blk=blk, buf=buf), h.update)
            finally:
                with self._cv:
                    self.recv_pos += 1
                    self._cv.notify_all()
            if fr is None:
                raise ProtocolError(f"node {peer} closed before sending block {blk} of step {step}")
            F.send_frame(sock, "got", {"step": step})
            self._received(peer, blk, step, buf, h.hexdigest(), repaired=False)

    def _port_free(self, step: int) -> bool:
        return self.recv_order[self.recv_pos] == step

    def _verify(self, blk: int, buf: memoryview, digest: str) -> str | None:
        """Why the block is refused (None: accepted)."""
        try:
            index, _ = unpack_block(buf, self.cfg, self.blocks)
        except GfaasError as exc:
            return str(exc)
        if index != blk:
            return f"the frame names block {blk}, its header block {index}"
        if blk >= len(self.digests) or digest != self.digests[blk]:
            return f"block {blk} does not match its SHA-256"
        return None

    def _received(self, src: int, blk: int, step: int, buf: memoryview, digest: str, repaired: bool) -> None:
        why = self._verify(blk, buf, digest)
        t = time.monotonic()
        if why is not None:
            self.emit("log", {"refused": True, "block": blk, "src": src, "step": step, "message": why})
            threading.Thread(target=self._repair, args=(blk, buf), daemon=True).start()
            return
        with self._lock:
            if blk in self.held:
                return
        self._hold(blk, buf)
        self.emit("block", {"run": self.run_id, "block": blk, "src": src, "step": step, "t": t,
                            "repaired": repaired})

    def _repair(self, blk: int, buf: memoryview) -> None:
        """Pull a refused block again from a source."""
        try:
            sock, f = self._connect(self.repair_from, "pull", self.run_id)
            with sock, f:
                F.send_frame(sock, "pull", {"block": blk})
                h = hashlib.sha256()
                fr = F.read_frame(f, len(buf), partial(_slot, blk=blk, buf=buf), h.update)
                if fr is None:
                    raise ProtocolError(f"source {self.repair_from} closed before answering the pull of {blk}")
            self._received(self.repair_from, blk, -1, buf, h.hexdigest(), repaired=True)
        except (OSError, GfaasError) as exc:
            self.emit("error", {"run": self.run_id, "message": f"node {self.me}: repair of block {blk}: {exc}"})

    # ---- serving ---------------------------------------------------------------------------------
    def _stage(self, first: int, last: int) -> LlamaStage:
        st = self.stages.get((first, last))
        if st is None:
            missing = [b for b in range(first, last + 1) if b not in self.held]
            if missing:
                raise ConfigError(f"node {self.me} cannot run blocks {first}..{last}: lacks {missing}")
            st = LlamaStage.from_packed(self.cfg, [self.held[b] for b in range(first, last + 1)])
            self.stages[(first, last)] = st
        return st

    def fwd(self, m: dict[str, Any], payload: memoryview) -> None:
        """A pass over tokens (first stage, local node), or, with ``prev``, the announcement of the
        hidden states node ``prev`` will send for this request and step."""
        if "prev" in m:
            key = (F.need(m, "rid", int), F.need(m, "step", int), F.need(m, "first", int))
            F.need(m, "prev", int), F.need(m, "rows", int)
            with self._cv:
                self._hid_expect[key] = m
                self._cv.notify_all()
            return
        self._pass(m, np.frombuffer(payload, dtype="<i8"))

    def _pass(self, m: dict[str, Any], x: np.ndarray, via: int | None = None) -> None:
        """Run blocks first..last of ``m`` on ``x`` (tokens, or hidden states that came from node
        ``via``), then send the result on to the next stage or the token to the manager."""
        first, last, rid = F.need(m, "first", int), F.need(m, "last", int), F.need(m, "rid", int)
        with self._compute:
            t0 = time.monotonic()
            st = self._stage(first, last)
            if st.is_first != (x.dtype.kind == "i"):
                raise ProtocolError(f"node {self.me}: blocks {first}..{last} got {x.dtype} input")
            y = st.forward(rid, x, last_only=True)
            out = np.array([int(np.argmax(y[-1]))], dtype="<i8") if st.is_last else y.astype("<f4")
            # Emulated accelerator: a stage of s of the B blocks takes at least floor_s * s / B per pass.
            rest = self.floor_s * (last - first + 1) / self.blocks - (time.monotonic() - t0)
            if rest > 0:
                time.sleep(rest)
        nxt = m.get("next")
        if nxt is None:
            self.emit("out", {"rid": rid, "first": first, "last": last, "step": m.get("step"),
                              "seq": m.get("seq"), "via": via}, out.tobytes())
            return
        dst, nfirst = int(nxt[0]), int(nxt[1])
        self._send_hidden(dst, {"rid": rid, "step": F.need(m, "step", int), "first": nfirst,
                                "rows": int(out.shape[0])}, out.tobytes())

    def _send_hidden(self, dst: int, meta: dict[str, Any], payload: bytes) -> None:
        """Hidden states to the next stage's node, over the link (one connection per destination)."""
        if dst == self.me:
            self._on_hidden(self.me, meta, payload)
            return
        with self._hid_lock:
            conn = self._hid_conns.get(dst)
            if conn is None:
                conn = self._hid_conns[dst] = self._connect(dst, "hidden", self.run_id)
            F.send_frame(conn[0], "hid", meta, payload)

    def _receive_hidden(self, f: BufferedReader, peer: int) -> None:
        limit = self.cfg.max_seq * self.cfg.dim * 4
        while (fr := F.read_frame(f, limit)) is not None:
            if fr.kind != "hid":
                raise ProtocolError(f"unexpected {fr.kind} frame on a hidden-state connection from node {peer}")
            try:
                self._on_hidden(peer, fr.meta, fr.payload)
            except (GfaasError, ValueError) as exc:
                self.emit("error", {"message": f"node {self.me}: hidden states from node {peer}: {exc}",
                                    "rid": fr.meta.get("rid")})

    def _on_hidden(self, peer: int, meta: dict[str, Any], payload: bytes | memoryview) -> None:
        """Run a previous stage's hidden states if they are what the manager announced."""
        key = (F.need(meta, "rid", int), F.need(meta, "step", int), F.need(meta, "first", int))
        with self._cv:
            if not self._cv.wait_for(lambda: key in self._hid_expect, timeout=self.hidden_wait_s):
                raise ProtocolError(f"node {peer} sent hidden states for request {key[0]} step {key[1]} "
                                    f"blocks {key[2]}.. that node {self.me} was not told to expect")
            m = self._hid_expect.pop(key)
        rows = int(m["rows"])
        if m["prev"] != peer or meta.get("rows") != rows or len(payload) != rows * self.cfg.dim * 4:
            raise ProtocolError(f"hidden states for request {key[0]} step {key[1]}: expected {rows} x "
                                f"{self.cfg.dim} float32 from node {m['prev']}, got {len(payload)} bytes "
                                f"({meta.get('rows')} rows) from node {peer}")
        self._pass(m, np.frombuffer(payload, dtype="<f4").reshape(rows, self.cfg.dim), via=peer)

    def export(self, m: dict[str, Any]) -> None:
        rid = F.need(m, "rid", int)
        with self._compute:
            st = self._stage(F.need(m, "first", int), F.need(m, "last", int))
            state = RequestState([], st.export_kv(rid))
            st.release(rid)
        self.emit("state", {"rid": rid}, state.to_bytes(self.cfg))

    def import_(self, m: dict[str, Any], payload: memoryview) -> None:
        rid = F.need(m, "rid", int)
        with self._compute:
            st = self._stage(F.need(m, "first", int), F.need(m, "last", int))
            st.import_kv(rid, RequestState.from_bytes(bytes(payload), self.cfg))

    def warm(self, m: dict[str, Any] | None = None) -> None:
        """Start from the warm tier: copy the model's blocks from the host-memory cache into fresh
        serving buffers (the host-to-device copy of a GPU node), or report a miss. With ``run``,
        ``order`` and ``bytes_per_s`` it is a warm scale-out: the copy runs in the background at that
        emulated host-to-device rate, block by block in ``order``, each reported as a ``block`` event
        of the run (so the node serves pipeline stages while it loads), then ``done``."""
        if m and "run" in m:
            run, order = F.need(m, "run", int), [int(b) for b in F.need(m, "order", list)]
            rate = float(F.need(m, "bytes_per_s", (float, int)))
            if sorted(order) != list(range(self.blocks)) or not rate > 0:
                raise ConfigError(f"warm load order {order} / rate {rate}: pass every block once and a rate > 0")
            with self._cv:
                cached = self.cache.get(self.model_key, time.monotonic())
                if cached is None:
                    raise ConfigError(f"node {self.me} has no warm copy of the model; run a multicast first")
                self.held.clear()
                self.arrived.clear()
                self.stages.clear()
                self.run_id = run
            threading.Thread(target=self._warm_load, args=(run, order, cached, rate), daemon=True).start()
            return
        t0 = time.monotonic()
        with self._lock:
            cached = self.cache.get(self.model_key, t0)
            if cached is not None:
                self.held.clear()
                self.stages.clear()
                for b, src in enumerate(cached):
                    buf = aligned_buffer(len(src))
                    buf[:] = src
                    self.held[b] = buf
                    self.arrived[b] = threading.Event()
                    self.arrived[b].set()
        self.emit("warmed", {"hit": cached is not None, "seconds": time.monotonic() - t0})

    def _warm_load(self, run: int, order: list[int], cached: list[memoryview], rate: float) -> None:
        t0, copied = time.monotonic(), 0
        for i, b in enumerate(order):
            buf = aligned_buffer(len(cached[b]))
            buf[:] = cached[b]
            copied += len(buf)
            rest = t0 + copied / rate - time.monotonic()  # the emulated host-to-device link
            if rest > 0:
                time.sleep(rest)
            self._hold(b, buf)
            self.emit("block", {"run": run, "block": b, "src": self.me, "step": i, "t": time.monotonic(),
                                "repaired": False})
        self.emit("done", {"run": run, "sent": []})

    def release(self, m: dict[str, Any]) -> None:
        rid = F.need(m, "rid", int)
        with self._compute:
            for st in self.stages.values():
                st.release(rid)

    def serve(self, inp: F.Reader) -> None:
        while True:
            fr = F.read_frame(inp, 1 << 30)
            if fr is None or fr.kind == "stop":
                return
            try:
                if fr.kind == "setup":
                    self.setup(fr.meta)
                elif fr.kind == "multicast":
                    self.multicast(fr.meta)
                elif fr.kind == "start":
                    self._go.set()
                elif fr.kind == "fwd":
                    self.fwd(fr.meta, memoryview(fr.payload))
                elif fr.kind == "export":
                    self.export(fr.meta)
                elif fr.kind == "import":
                    self.import_(fr.meta, memoryview(fr.payload))
                    self.emit("out", {"rid": fr.meta["rid"], "imported": True})
                elif fr.kind == "release":
                    self.release(fr.meta)
                elif fr.kind == "warm":
                    self.warm(fr.meta)
                else:
                    raise ProtocolError(f"unexpected {fr.kind} frame from the manager")
            except (GfaasError, OSError, ValueError) as exc:
                self.emit("error", {"message": f"node {self.me}: {fr.kind}: {exc}", "rid": fr.meta.get("rid")})


def _slot(kind: str, meta: dict[str, Any], length: int, *, blk: int, buf: memoryview) -> memoryview:
    """The pre-allocated buffer for the block a frame must carry (ProtocolError for anything else)."""
    if kind != "blk":
        raise ProtocolError(f"expected block {blk}, got a {kind} frame ({meta.get('why', '')})")
    if meta.get("block") != blk:
        raise ProtocolError(f"expected block {blk}, the frame names block {meta.get('block')!r}")
    return buf


def _garbled(buf: memoryview, where: str) -> bytes:
    """A copy of a block with one byte flipped (fault injection for tests): in the header's block
    count (``header``: caught by the header check) or in the last tensor (``data``: caught by the
    digest only)."""
    out = bytearray(buf)
    pos = 12 if where == "header" else len(out) - 1
    out[pos] ^= 0x01
    return bytes(out)


def main() -> int:
    node = Node(sys.stdout.buffer)
    node.serve(cast(BufferedReader, sys.stdin.buffer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
