"""The node daemon: serves a :class:`~gfaas.dataplane.store.Store` on a Unix socket.

One thread runs an ``epoll`` loop over ``SOCK_SEQPACKET`` connections (one message per datagram,
so a request costs one ``recv`` and one ``send``). Cross-node pulls run on worker threads and post
their replies back to the loop through a wake-up pipe; every touch of the store happens under
``self.lock``.

Puts are asynchronous at their end: the client writes into its slab and sends ``Seal`` without
waiting (a small put), or writes what it allocated and sends ``SealWritten`` (a larger one). Because
the client's ``send`` has completed before the put returns, the seal is already queued on the
daemon's socket when any consumer can know the ID; so when a ``Get`` misses, or finds the object
still being written, the loop first drains every other connection's queued messages and only then
answers.
"""

from __future__ import annotations

import array
import errno
import hmac
import logging
import math
import os
import queue
import resource
import secrets
import select
import signal
import socket
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..config import NodeConfig
from ..errors import (
    AuthenticationError,
    CapacityError,
    ConfigError,
    DataPlaneError,
    GfaasError,
    ProtocolError,
    code_of,
)
from ..secfiles import create_file, load_or_create, private_dir, read_private_file
from . import nodestats
from . import protocol as P
from .auth import Registry, token_hash
from .backends import make_backend, make_device_backends, pin_host_segments
from .ids import ID_BYTES
from .invlog import InvocationLog
from .journal import Journal
from .slabindex import ReadLog
from .spill import SpillDir
from .store import WRITING, ObjectRecord, Segment, Session, Store
from .threads import ReusedThreads
from .tiers import SpillJob

log = logging.getLogger("gfaas.dataplane")


_ASYNC = (P.Seal, P.SealWritten, P.Release, P.Consumed, P.Unbind)  # requests that get no reply
# Requests that change an attached connection's credentials: an error held from the credentials they
# end belongs to those, never to the next ones (see _end_binding).
_BINDING = (P.Bind, P.Unbind)
# Requests that only read counters (the stats stream): no settling after them, so a poller never
# makes the daemon do tier work it would not have done anyway (see nodestats.py).
_READ_ONLY = (P.Snapshot, P.ObjectInfo)
_EARLY_MAX = 65536  # local reads noted before their object's seal arrived (see _consumed)
# How often the loop looks for seals and reads written to shared memory when no message wakes it:
# soon after work was found, backing off while there is none.
_SCAN_MIN_S = 0.002
_SCAN_MAX_S = 0.25
# Out of descriptors (EMFILE: this process; ENFILE: the system): refuse the connection or request, never exit.
_FD_ERRNOS = (errno.EMFILE, errno.ENFILE)
_ACCEPT_PAUSE_S = 0.1  # how long the listener rests when not even a refusal can be accepted
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(eq=False)
class Conn:
    sock: socket.socket
    session: Session | None = None
    admin: bool = False
    sent_rw: set[int] = field(default_factory=set)
    sent_ro: set[int] = field(default_factory=set)
    retired: list[int] = field(default_factory=list)
    arenas: set[int] = field(default_factory=set)  # device arenas whose IPC handle it was sent
    gone: list[int] = field(default_factory=list)  # of those, retired since its last device reply
    closing: list[int] = field(default_factory=list)  # gone arenas sent: closed once it sends again
    pending_error: GfaasError | None = None
    read_log: ReadLog | None = None  # where it notes its local reads (slabindex.py)
    busy: bool = False  # a deferred or parked reply is outstanding: read nothing more from it yet
    uid: int = -1  # the connecting process's user (SO_PEERCRED), for the per-user connection cap
    # Opened by the platform with the admin token (Attach): function credentials come and go with
    # Bind/Unbind, one (invocation, function) at a time; mappings and the read log stay.
    attached: bool = False
    # Objects the current binding was handed located (Bind.prefetch): read at its end if not before.
    prefetched: set[bytes] = field(default_factory=set)


class Daemon:
    """A node daemon. ``serve_forever()`` blocks; ``stop()`` may be called from any thread."""

    def __init__(self, config: NodeConfig, remote: Any = None) -> None:
        self.config = config
        self.lock = threading.RLock()
        self.remote = remote
        # What this process's own control relay (gfaas.dataplane.peer_control) proves itself with: the
        # gateway's requests from another machine arrive there. Never written anywhere; dies with us.
        self.relay_token = secrets.token_hex(16)
        self._ep = select.epoll()
        self._conns: dict[int, Conn] = {}
        self._seg_holders: dict[int, set[Conn]] = {}
        # Retired device arenas -> (their backend, the connections that may still have them open).
        self._arena_holders: dict[int, tuple[Any, set[Conn]]] = {}
        self._done: queue.SimpleQueue[tuple[Conn, P.Reply, list[int]]] = queue.SimpleQueue()
        # Evictions to disk are written by one worker thread; the loop finishes them (see _start_spill).
        self._spilled: queue.SimpleQueue[tuple[SpillJob, Exception | None]] = queue.SimpleQueue()
        self._spill_futures: set[Future[None]] = set()
        self._spill_pool: ThreadPoolExecutor | None = None
        self._pullers = ReusedThreads("gfaas-pull")  # deferred work (cross-node pulls): threads reused
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping = False
        self._draining = False
        self._parked: list[tuple[Conn, P.Get]] = []
        self._listener: socket.socket | None = None
        # Connection limits (see _accept): per-user counts, the Hello deadlines in accept order, a
        # spare descriptor freed to accept-and-refuse when the process has none left.
        self._per_uid: dict[int, int] = {}
        self._hello_due: deque[tuple[float, Conn]] = deque()
        self._reserve_fd = -1
        self._listen_paused_until = 0.0
        self._refused = 0
        self._refusal_logged = 0.0
        self._max_conns = config.max_connections
        self._setup_state()
        # Page merging (gfaas.dedup): created here, so settings a crashed run left in KSM are restored
        # at the next start even if no hint ever comes.
        self.dedup = None
        if config.dedup:
            from ..dedup.node import NodeDedup

            self.dedup = NodeDedup(config.state_dir, config.ksm_lock_dir)
            self.dedup.start()
        self.store = Store(
            config,
            make_backend(config.backend),
            registry=self._load_registry(),
            journal=self.journal,
            lost=self._lost,
            on_retire=self._on_retire,
            devices=make_device_backends(*config.device_spec(), config.device_capacity_bytes,
                                         config.device_pool_floor_bytes),
            spill=SpillDir(config.spill_dir, config.spill_capacity_bytes, config.capacity_bytes)
            if config.spill_capacity_bytes != 0
            else None,
            local_reads=config.backend == "host",
        )
        pin_host_segments(self.store.backend, self.store.devices)
        # Objects read locally whose Consumed arrived before their Seal: id -> sessions that read it.
        self._early: OrderedDict[bytes, list[Session]] = OrderedDict()
        # Small puts are sealed from slab directories (no Seal message) unless objects are published
        # to other nodes, which should hear of a seal as soon as it is made.
        self.directory_seals = self.store.local_reads and remote is None
        self._scan_every = _SCAN_MIN_S
        self._next_scan = 0.0
        if self.store.spill is not None:
            self._spill_pool = ThreadPoolExecutor(1, thread_name_prefix="gfaas-spill")
            self.store.spill_runner = self._start_spill
        self._handlers: dict[type, Callable[[Conn, Any], tuple[P.Reply, list[int]] | None]] = {
            P.Hello: self._hello,
            P.AdminHello: self._admin_hello,
            P.Attach: self._attach,
            P.Bind: self._bind,
            P.Unbind: self._unbind,
            P.OpenInvocation: self._open,
            P.EndInvocation: self._end,
            P.EndInvocations: self._end_many,
            P.Stats: self._stats,
            P.Snapshot: self._snapshot,
            P.ObjectInfo: self._object_info,
            P.QueueHint: self._queue_hint,
            P.QueueState: self._queue_state,
            P.DedupHint: self._dedup_hint,
            P.DedupForget: self._dedup_forget,
            P.DedupStatus: self._dedup_status,
            P.Lease: self._lease,
            P.MoreIds: self._more_ids,
            P.Seal: self._seal_small,
            P.Allocate: self._allocate,
            P.SealAllocated: self._seal_allocated,
            P.SealWritten: self._seal_written,
            P.Derive: self._derive,
            P.Get: self._get,
            P.Delete: self._delete,
            P.Release: self._release,
            P.Consumed: self._consumed,
            P.Sync: self._sync,
        }

    # ---- state on disk -------------------------------------------------------------------------
    def _setup_state(self) -> None:
        """Check (or create) the private directories, then load the node's key, admin token hash and
        journal. Every file is created without following symlinks (gfaas.secfiles)."""
        c = self.config
        private_dir(c.state_dir, "state directory")
        private_dir(os.path.dirname(os.path.abspath(c.socket_path)), "socket directory")
        self.node_key, self._new_key = self._token_key()
        self._admin_hash = self._admin_token_hash()
        self.journal = Journal(os.path.join(c.state_dir, "objects.journal"))
        self._lost = self.journal.load()
        self.invocations = InvocationLog(os.path.join(c.state_dir, "invocations.journal"))

    def _token_key(self) -> tuple[bytes, bool]:
        """The key token hashes are made with (``token.key``, created once), and whether it is new."""
        path = os.path.join(self.config.state_dir, "token.key")
        key, new = load_or_create(path, "key file", secrets.token_bytes(32))
        if len(key) < 16:
            raise ConfigError(f"key file {path} holds {len(key)} bytes, too few for a key; remove it and restart"
                              " the node (open invocations' tokens then stop working)")
        return key, new

    def _admin_token_hash(self) -> str:
        """The keyed hash the admin token is checked against (``admin.hash``).

        ``admin.token`` is the operator's credential (0600 in the private state directory); the
        daemon never takes its content as the verifier. A new token is made at the first start,
        and when the operator removes ``admin.token`` to rotate it."""
        sd = self.config.state_dir
        tok_path, hash_path = os.path.join(sd, "admin.token"), os.path.join(sd, "admin.hash")
        if os.path.lexists(tok_path) and not self._new_key:
            try:
                return read_private_file(hash_path, "admin token hash", must_exist=False).decode().strip()
            except FileNotFoundError:
                pass  # written by a version that kept no hash: make a new token
        for p in (tok_path, hash_path):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        token = secrets.token_hex(16)
        digest = token_hash(self.node_key, token)
        create_file(hash_path, digest.encode())
        create_file(tok_path, token.encode())
        return digest

    def _load_registry(self) -> Registry:
        """The invocations open when the daemon last stopped (or crashed), from the invocation journal
        (``invocations.json`` of earlier versions, without one)."""
        reg = self.invocations.load(self.node_key, os.path.join(self.config.state_dir, "invocations.json"))
        if self._new_key and len(reg):
            log.warning("the token key was missing and is new: the %d open invocations' tokens no longer"
                        " authenticate", len(reg))
        # Objects from before a restart are lost; keep only those of invocations still open.
        self._lost = {k: v for k, v in self._lost.items() if v in reg}
        self.journal.rewrite(self._lost)
        if self._lost:
            log.warning("%d objects of %d open invocations were lost in a restart", len(self._lost), len(reg))
        return reg

    def _record_ended(self, ids: list[str]) -> None:
        """Append the ends to the invocation journal, then let both journals drop the records of ended
        invocations once those outnumber the open ones (O(1) per end, amortised: invlog.py, journal.py)."""
        reg = self.store.registry
        try:
            if self.invocations.ended(ids, reg):
                log.info("compacted the invocation journal to %d records", self.invocations.records)
        except GfaasError as exc:  # the ends stand; a restart would take them for open until the next record
            log.warning("%s", exc)
        for inv in ids:
            if self.journal.ended(inv, reg):
                log.info("compacted the object journal to %d records", self.journal.records)

    # ---- lifecycle -----------------------------------------------------------------------------
    def bind(self) -> None:
        path = self.config.socket_path
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # stale socket of a daemon that died
            else:
                probe.close()
                raise GfaasError(f"a node daemon already serves {path}; stop it first (gfaas node stop)")
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        old = os.umask(0o177)
        try:
            ls.bind(path)
        finally:
            os.umask(old)
        self._share_socket(path)
        ls.listen(256)
        ls.setblocking(False)
        self._reserve_fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._max_conns = min(self.config.max_connections, max(8, soft // 4))
        if self.store.spill is not None:
            self.store.spill.clear()  # files of a daemon that died: no other daemon serves this node
        self._listener = ls
        self._ep.register(ls.fileno(), select.EPOLLIN)
        self._ep.register(self._wake_r, select.EPOLLIN)
        if self.remote is not None:
            self.remote.start(self)
        log.info("node %s serving %s (%s backend, %d bytes)", self.config.node_id, path,
                 self.config.backend, self.config.capacity_bytes)

    def _share_socket(self, path: str) -> None:
        """0600, or with ``socket_group`` 0660 and its directory 0710, both that group's: its members
        pass through to the socket and list nothing (the state directory stays the daemon's alone)."""
        gid = self.config.socket_group
        if gid is None:
            os.chmod(path, 0o600)
            return
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.chown(folder, -1, gid)
            os.chmod(folder, 0o710)
            os.chown(path, -1, gid)
            os.chmod(path, 0o660)
        except PermissionError as exc:
            raise ConfigError(f"socket_group={gid}: the daemon cannot give its socket to group {gid} ({exc.strerror});"
                              " run it as root or as a member of that group") from None

    def stop(self) -> None:
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def serve_forever(self) -> None:
        if self._listener is None:
            self.bind()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
        try:
            while not self._stopping:
                listen_fd = self._listener.fileno() if self._listener is not None else -1
                for fd, _ev in self._ep.poll(self._limits_timeout(self._idle_timeout())):
                    conn = self._conns.get(fd)
                    if conn is not None:
                        self._serve(conn)
                    elif fd == listen_fd:
                        try:
                            self._accept()
                        except Exception:  # a bug must not take the node down
                            log.exception("internal error accepting a connection")
                    elif fd == self._wake_r:
                        self._flush_done()
                self._enforce_limits()
                if self.store.local_reads and time.monotonic() >= self._next_scan:
                    try:
                        found = self._scan_all()
                    except Exception:  # a bug must not take the node down
                        log.exception("internal error reading slab directories and read logs")
                        found = 0
                    self._scan_every = _SCAN_MIN_S if found else min(2 * self._scan_every, _SCAN_MAX_S)
                    self._next_scan = time.monotonic() + self._scan_every
        finally:
            self.close()

    def _start_spill(self, job: SpillJob) -> None:
        """Write an evicted segment on the worker thread, so no request waits for the disk; the
        loop hands the result to ``Store.finish_spill`` (which needs the store, hence the lock)."""
        spill, pool = self.store.spill, self._spill_pool
        assert spill is not None and pool is not None

        def work() -> None:
            err: Exception | None = None
            try:
                spill.write_file(job.key, job.data)
            except Exception as exc:  # reported to the store, which keeps the segment in memory
                err = exc
            self._spilled.put((job, err))
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

        fut = pool.submit(work)
        self._spill_futures.add(fut)
        fut.add_done_callback(self._spill_futures.discard)

    def _finish_spills(self, wait: bool = False) -> None:
        """Complete the evictions whose writes are done (``wait``: all in flight, first)."""
        if wait:
            for fut in list(self._spill_futures):
                fut.result()
        while True:
            try:
                job, err = self._spilled.get_nowait()
            except queue.Empty:
                return
            with self.lock:
                self.store.finish_spill(job, err)

    def _idle_timeout(self) -> float:
        """How long the loop may sleep: until the store's next pool-target change (then settle)."""
        self._finish_spills()
        self._settle()
        with self.lock:
            due = self.store.next_settle()
            now = self.store.clock.now()
        wait = -1.0 if due is None else max(0.0, due - now) + 0.001
        if self.store.local_reads and any(c.read_log is not None or (c.session is not None and c.session.arena
                                                                     is not None) for c in self._conns.values()):
            scan = max(0.0, self._next_scan - time.monotonic())
            wait = scan if wait < 0 else min(wait, scan)
        return wait

    def close(self) -> None:
        if self.dedup is not None:
            self.dedup.stop()  # KSM back to the settings it had before any burst
        if self.remote is not None:
            self.remote.stop()
        for conn in list(self._conns.values()):
            self._drop(conn)
        if self._listener is not None:
            if self._listen_paused_until == 0.0:
                self._ep.unregister(self._listener.fileno())
            self._listener.close()
            self._listener = None
            try:
                os.unlink(self.config.socket_path)
            except FileNotFoundError:
                pass
        self.journal.close()
        self.invocations.close()
        self._finish_spills(wait=True)
        if self._spill_pool is not None:
            self._spill_pool.shutdown(wait=True)
        with self.lock:
            self.store.close()
        self._ep.close()
        if self._reserve_fd >= 0:
            os.close(self._reserve_fd)
            self._reserve_fd = -1
        for dev in self.store.devices.values():
            dev.close()

    # ---- connections ---------------------------------------------------------------------------
    def _accept(self) -> None:
        """Accept every waiting connection, refusing (with an error the client reads, then closing)
        those over the caps and, when the process is out of descriptors, all of them."""
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno not in _FD_ERRNOS or not self._refuse_without_fds(exc):
                    self._pause_listener(exc)
                    return
                continue
            try:
                uid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[1]
            except OSError:
                uid = -1
            c = self.config
            if len(self._conns) >= self._max_conns:
                self._refuse(sock, f"node {c.node_id} has {len(self._conns)} connections, its limit"
                             f" (max_connections={self._max_conns}); close idle connections or raise the limit")
                continue
            if self._per_uid.get(uid, 0) >= c.max_connections_per_uid:
                self._refuse(sock, f"node {c.node_id} has {self._per_uid[uid]} connections from uid {uid}, the"
                             f" limit per user (max_connections_per_uid={c.max_connections_per_uid}); close idle"
                             " connections or raise the limit")
                continue
            sock.setblocking(False)
            conn = Conn(sock, uid=uid)
            self._conns[sock.fileno()] = conn
            self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
            self._hello_due.append((time.monotonic() + c.hello_timeout_s, conn))
            self._ep.register(sock.fileno(), select.EPOLLIN)

    def _refuse(self, sock: socket.socket, why: str, code: str = "CapacityError") -> None:
        """Answer a connection with an error and close it; its client raises the error (channel.py)."""
        try:
            sock.setblocking(False)
            sock.send(P.encode(P.Error(code, why)))
        except OSError:
            pass
        sock.close()
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged >= 1.0:  # at most one line a second, however many are refused
            log.warning("refused %d connection(s): %s", self._refused, why)
            self._refused, self._refusal_logged = 0, now

    def _refuse_without_fds(self, exc: OSError) -> bool:
        """Out of descriptors: free the spare one, accept with it and refuse. False if that failed too."""
        if self._reserve_fd < 0:
            return False
        os.close(self._reserve_fd)
        self._reserve_fd = -1
        try:
            sock, _ = self._listener.accept()  # type: ignore[union-attr]
        except OSError:
            sock = None
        if sock is not None:
            self._refuse(sock, f"node {self.config.node_id} is out of file descriptors ({exc.strerror});"
                         " try again later, or raise its limit (ulimit -n) or lower max_connections")
        try:
            self._reserve_fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        return sock is not None

    def _pause_listener(self, exc: OSError) -> None:
        """Stop polling the listener for a while (level-triggered, it would wake the loop at once)."""
        if self._listen_paused_until == 0.0 and self._listener is not None:
            self._ep.unregister(self._listener.fileno())
        self._listen_paused_until = time.monotonic() + _ACCEPT_PAUSE_S
        log.warning("cannot accept connections (%s); pausing for %.1f s", exc, _ACCEPT_PAUSE_S)

    def _enforce_limits(self) -> None:
        """Resume a paused listener; close connections that said no Hello in time."""
        now = time.monotonic()
        if self._listen_paused_until and now >= self._listen_paused_until and self._listener is not None:
            self._listen_paused_until = 0.0
            if self._reserve_fd < 0:
                try:
                    self._reserve_fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    pass
            self._ep.register(self._listener.fileno(), select.EPOLLIN)
        due = self._hello_due
        while due and due[0][0] <= now:
            _, conn = due.popleft()
            if conn.sock.fileno() >= 0 and conn.session is None and not conn.admin and not conn.attached \
                    and not conn.busy:
                t = self.config.hello_timeout_s
                self._refuse_conn(conn, f"no Hello within {t:g} s of connecting (hello_timeout_s); connection"
                                  " closed: present credentials first")

    def _refuse_conn(self, conn: Conn, why: str) -> None:
        try:
            conn.sock.send(P.encode(P.Error("AuthenticationError", why)))
        except OSError:
            pass
        self._drop(conn)

    def _limits_timeout(self, wait: float) -> float:
        """``wait`` shortened to the next Hello deadline or listener resume."""
        now = time.monotonic()
        nxt = [t for t in (self._hello_due[0][0] if self._hello_due else 0.0, self._listen_paused_until) if t]
        if not nxt:
            return wait
        left = max(0.0, min(nxt) - now) + 0.001
        return left if wait < 0 else min(wait, left)

    def _drop(self, conn: Conn) -> None:
        if self._conns.pop(conn.sock.fileno(), None) is None:
            return
        self._ep.unregister(conn.sock.fileno())
        left = self._per_uid.get(conn.uid, 1) - 1
        if left > 0:
            self._per_uid[conn.uid] = left
        else:
            self._per_uid.pop(conn.uid, None)
        self._scan(conn)  # what it put or read before it left counts
        with self.lock:
            self._arenas_closed(conn, conn.closing + conn.gone)
            conn.closing, conn.gone = [], []
            if conn.read_log is not None:
                conn.read_log.close()
                conn.read_log = None
            if conn.session is not None:
                self.store.disconnect(conn.session)
                conn.session = None
            for seg in conn.sent_rw | conn.sent_ro:
                holders = self._seg_holders.get(seg)
                if holders is not None:
                    holders.discard(conn)
        conn.sock.close()

    def _on_retire(self, seg_id: int) -> None:
        for conn in self._seg_holders.pop(seg_id, ()):
            conn.sent_rw.discard(seg_id)
            conn.sent_ro.discard(seg_id)
            conn.retired.append(seg_id)
        self._collect_gone()
        if self.remote is not None:
            self.remote.on_retire(seg_id)

    def _collect_gone(self) -> None:
        """Arenas the GPU pools retired, on any path (a freed block, trim, set_target, an eviction):
        each connection that was sent one hears so in its next device reply and closes it; the
        arena is freed once all of them have (``_arenas_closed``): cudaFree under another process's
        mapping is undefined. The memory stays held until then (an idle holder delays it)."""
        if not any(dev.gone for dev in self.store.devices.values()):
            return
        with self.lock:
            for dev in self.store.devices.values():
                for a in dev.collect_gone():
                    holders = set()
                    for conn in self._conns.values():
                        if a in conn.arenas:
                            conn.arenas.discard(a)
                            conn.gone.append(a)
                            holders.add(conn)
                    if holders:
                        self._arena_holders[a] = (dev, holders)
                    else:
                        dev.release_arena(a)

    def _arenas_closed(self, conn: Conn, arenas: list[int]) -> None:
        """``conn``'s process closed these retired arenas (or left): free those nobody has open."""
        with self.lock:
            for a in arenas:
                entry = self._arena_holders.get(a)
                if entry is not None:
                    entry[1].discard(conn)
                    if not entry[1]:
                        del self._arena_holders[a]
                        entry[0].release_arena(a)

    def _serve(self, conn: Conn, drain: bool = False) -> None:
        """Handle the next message on ``conn``; with ``drain``, every message queued on it.

        Without ``drain`` one message is handled per readiness event: the selector is level
        triggered, so a queue of messages is still served, without a failing ``recv`` per event.
        """
        while conn.sock.fileno() in self._conns and not conn.busy:
            try:
                data = conn.sock.recv(P.MAX_FRAME + 1)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._drop(conn)
                return
            if conn.closing:  # it read the reply naming them before sending this: it closed them
                closing, conn.closing = conn.closing, []
                self._arenas_closed(conn, closing)
            self._handle(conn, data)
            if not drain:
                return

    def _handle(self, conn: Conn, data: bytes) -> None:
        msg: Any = None
        if conn.session is not None and self.store.local_reads:
            self._scan(conn)  # its puts and reads so far come before this message
        try:
            msg = P.decode_request(data)
            if conn.pending_error is not None and not isinstance(msg, _ASYNC + _BINDING):
                err, conn.pending_error = conn.pending_error, None
                raise err
        except GfaasError as exc:
            self._send(conn, P.Error(code_of(exc), str(exc)), [])
            return
        self._run(conn, msg, self._handlers[type(msg)])

    def _run(self, conn: Conn, msg: Any, handler: Callable[[Conn, Any], tuple[P.Reply, list[int]] | None]) -> None:
        """Run one request's handler and send its reply (or remember an asynchronous one's error)."""
        out: tuple[P.Reply, list[int]] | None
        try:
            with self.lock:
                out = handler(conn, msg)
        except GfaasError as exc:
            if isinstance(msg, _ASYNC):
                conn.pending_error = exc  # asynchronous request: reported on the next synchronous one
                log.warning("asynchronous seal failed: %s", exc)
                return
            out = (P.Error(code_of(exc), str(exc)), [])
        except Exception as exc:  # a bug, or no descriptors left, must not take the node down
            err = self._internal_error(exc)
            if isinstance(msg, _ASYNC):  # no reply: it would be taken as the answer to the next request
                conn.pending_error = err
                return
            out = (P.Error(code_of(err), str(err)), [])
        if out is not None:
            self._send(conn, *out)
        if not isinstance(msg, _READ_ONLY):
            self._settle()

    def _internal_error(self, exc: Exception) -> GfaasError:
        """The error a client gets for an unexpected exception: running out of descriptors (creating a
        segment's memfd, duplicating one to send) is a ``CapacityError`` of that request alone."""
        if isinstance(exc, OSError) and exc.errno in _FD_ERRNOS:
            now = time.monotonic()
            if now - self._refusal_logged >= 1.0:
                log.warning("out of file descriptors handling a request: %s", exc)
                self._refusal_logged = now
            return CapacityError(f"node {self.config.node_id} is out of file descriptors ({exc.strerror}); free"
                                 " objects or end invocations, or raise its limit (ulimit -n)")
        log.exception("internal error handling a request")
        return DataPlaneError(f"internal error in the node daemon: {exc!r}")

    def _settle(self) -> None:
        """The store's deferred tier work (evict after a restore, restore into freed memory, pool
        targets), run after the reply went out so the request never waits for it."""
        if self._draining:
            return  # inside another request's drain: that request's own _run settles afterwards
        try:
            with self.lock:
                self.store.settle()
        except Exception:  # a failed background eviction must not take the node down
            log.exception("error while rebalancing the storage tiers")
        self._collect_gone()  # arenas it returned with no holder are freed now, not at the next reply

    def _send(self, conn: Conn, reply: P.Reply, fds: list[int]) -> None:
        if conn.retired and hasattr(reply, "retired"):
            reply = msgspec.structs.replace(reply, retired=conn.retired)
            conn.retired = []
        self._collect_gone()
        if conn.gone and hasattr(reply, "gone"):
            reply = msgspec.structs.replace(reply, gone=conn.gone)
            conn.closing.extend(conn.gone)
            conn.gone = []
        data = P.encode(reply)
        try:
            if fds:
                conn.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                conn.sock.send(data)
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            log.warning("dropping a connection whose reply could not be sent: %s", exc)
            # The client does not read its replies (or is gone): drop it rather than block the node.
            self._drop(conn)
            return
        for fd in fds:
            os.close(fd)

    # ---- deferred work (cross-node pulls) ------------------------------------------------------
    def defer(self, conn: Conn, work: Callable[[], tuple[P.Reply, list[int]]]) -> None:
        """Run ``work`` on a worker thread; its reply goes to ``conn`` from the loop thread."""
        conn.busy = True

        def run() -> None:
            try:
                out = work()
            except GfaasError as exc:
                out = (P.Error(code_of(exc), str(exc)), [])
            except Exception as exc:
                log.exception("deferred request failed")
                out = (P.Error("RemoteError", f"cross-node request failed: {exc!r}"), [])
            self._done.put((conn, out[0], out[1]))
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

        self._pullers.submit(run)

    def _flush_done(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        self._finish_spills()
        while not self._done.empty():
            conn, reply, fds = self._done.get()
            conn.busy = False
            if conn.sock.fileno() in self._conns:
                self._send(conn, reply, fds)
                self._serve(conn, drain=True)
            else:
                for fd in fds:  # the client left while its pull ran
                    os.close(fd)

    def _drain_others(self, current: Conn) -> None:
        """Process messages already queued on other connections (see the module docstring).

        A get that misses while a drain runs is parked, not answered: the seal it waits for was
        queued before the get was sent, but perhaps on a connection this drain had already passed.
        So a parked get is answered only after a whole further round that began after it was read;
        rounds repeat while gets are parked. ``current``'s get was read before the first round
        began, so that round is enough for it. Parked clients are blocked waiting and queue nothing
        behind their get, so skipping their connections (``busy``) loses nothing.
        """
        if self._draining:
            return
        ripe: list[tuple[Conn, P.Get]] = []  # parked gets that have now seen a whole round
        while True:
            self._draining = True
            try:
                for conn in list(self._conns.values()):
                    if conn is not current:
                        self._serve(conn, drain=True)
            finally:
                self._draining = False
            self._answer_parked(ripe)
            ripe, self._parked = self._parked, []
            if not ripe:
                return

    def _answer_parked(self, parked: list[tuple[Conn, P.Get]]) -> None:
        for conn, _ in parked:
            conn.busy = False
        for conn, msg in parked:
            if conn.sock.fileno() in self._conns:
                self._run(conn, msg, self._get_drained)

    # ---- handlers ------------------------------------------------------------------------------
    def _need_session(self, conn: Conn) -> Session:
        if conn.session is None:
            if conn.attached:
                raise AuthenticationError("this connection holds no function credentials now: its task ended"
                                          " (Unbind) or it was never given any (Bind)")
            raise AuthenticationError("this connection has not presented function credentials (Hello)")
        return conn.session

    def _need_admin(self, conn: Conn) -> None:
        if not conn.admin:
            raise AuthenticationError("this request needs the node's admin token (AdminHello)")

    @staticmethod
    def _check_version(version: int) -> None:
        if version != P.PROTOCOL_VERSION:
            raise ProtocolError(
                f"client speaks protocol version {version}, this daemon {P.PROTOCOL_VERSION};"
                " use the same gfaas version for functions and nodes"
            )

    def _hello(self, conn: Conn, m: P.Hello) -> tuple[P.Reply, list[int]]:
        self._check_version(m.version)
        if conn.session is not None or conn.admin or conn.attached:
            raise ProtocolError("this connection is already authenticated; open a new one for other credentials")
        s = self.store.connect(m.token)
        conn.session = s
        c = self.config
        return P.Welcome(c.node_id, s.invocation, s.function, list(s.functions), c.slab_bytes,
                         c.small_object_max, c.capacity_bytes, sorted(self.store.devices),
                         directory_seals=self.directory_seals), []

    def _attach(self, conn: Conn, m: P.Attach) -> tuple[P.Reply, list[int]]:
        """A function connection for the platform to bind per task (see ``Bind``): proved with the admin
        token, so no one else holds connections without credentials past the Hello deadline."""
        self._check_version(m.version)
        if conn.session is not None or conn.admin or conn.attached:
            raise ProtocolError("this connection is already authenticated; attach a new one")
        if not hmac.compare_digest(token_hash(self.node_key, m.admin_token), self._admin_hash):
            raise AuthenticationError(
                f"wrong admin token for Attach; read it from {os.path.join(self.config.state_dir, 'admin.token')}"
            )
        conn.attached = True
        c = self.config
        return P.Welcome(c.node_id, "", "", [], c.slab_bytes, c.small_object_max, c.capacity_bytes,
                         sorted(self.store.devices), directory_seals=self.directory_seals), []

    def _need_attached(self, conn: Conn, what: str) -> None:
        if not conn.attached:
            raise ProtocolError(f"{what} is for connections the platform attached (Attach); this one presented"
                                " its credentials with Hello and keeps them: open a new connection for others")

    def _end_binding(self, conn: Conn) -> None:
        """End the credentials an attached connection holds, as a disconnect ends a connection's: what it
        described in its slab's directory and noted in its read log counts first (``_handle`` scanned
        them before this request), its unsealed objects are freed, its slab closes, its pins and unused
        IDs go back. An error held for its next request (a refused asynchronous seal) has no next request
        under these credentials: it is logged, and readers of the object get it as the reason."""
        s = conn.session
        if s is None:
            return
        err, conn.pending_error = conn.pending_error, None
        if err is not None:
            log.warning("%s/%s: an asynchronous request of its finished task failed: %s", s.invocation, s.function, err)
        conn.session = None
        for oid in conn.prefetched:  # handed to the task with its Bind: its read, whether or not it used it
            rec = self.store.objects.get(oid)
            if rec is not None and rec.invocation == s.invocation:
                self.store.consumed(rec, s.function)
        conn.prefetched.clear()
        self.store.disconnect(s)

    def _bind(self, conn: Conn, m: P.Bind) -> tuple[P.Reply, list[int]]:
        self._need_attached(conn, "Bind")
        if len(m.prefetch) > P.MAX_PREFETCH or any(len(oid) != ID_BYTES for oid in m.prefetch):
            raise ProtocolError(f"Bind with {len(m.prefetch)} prefetch IDs; give at most {P.MAX_PREFETCH}, each of "
                                f"{ID_BYTES} bytes")
        self._end_binding(conn)
        s = self.store.connect(m.token)  # refused: the connection stays without credentials
        conn.session = s
        lease: P.Leased | None = None
        fds: list[int] = []
        if m.lease >= 0:
            try:
                seg, ids = self.store.lease(s, m.lease, m.ids or None)
                fds = self._export(conn, seg, True)
            except (GfaasError, OSError) as exc:  # the binding stands; the first small put leases, and says why not
                log.debug("no slab with Bind for %s/%s: %s", s.invocation, s.function, exc)
            else:
                if fds:  # (a backend with no descriptors to map has no slab to hand over)
                    lease = P.Leased(seg.id, 0, seg.limit or seg.size, ids, first_slot=self.store.first_slot(s, ids))
        return P.Bound(s.invocation, s.function, list(s.functions), lease, located=self._prefetch(conn, s, m.prefetch)), fds

    def _prefetch(self, conn: Conn, s: Session, ids: list[bytes]) -> list[P.Located]:
        """The Bind's prefetched objects that live on a GPU here and that this function may read, each
        located and pinned as a Get would (the same access check); others are left to the task's own
        get. The read counts when the task reads it through the daemon or when the binding ends."""
        out: list[P.Located] = []
        for oid in dict.fromkeys(ids):
            rec = self.store.objects.get(oid)
            if rec is None or rec.state == WRITING:
                continue
            seg = self.store.segments.get(rec.segment)
            if seg is None or seg.device < 0:
                continue  # a host object: its get maps its segment (and a slab's is read locally after)
            try:
                self.store.lookup(s.invocation, s.function, oid)  # the access check of a get
            except GfaasError:
                continue  # not readable by this function: its get gets the precise refusal
            reply, fds = self._located(conn, rec, seg)
            assert isinstance(reply, P.Located) and not fds  # a device segment travels as a DeviceRef
            conn.prefetched.add(oid)
            self.store.device_counters["prefetched"] += 1
            out.append(reply)
        return out

    def _unbind(self, conn: Conn, m: P.Unbind) -> None:
        self._need_attached(conn, "Unbind")
        self._end_binding(conn)
        return None

    def _admin_hello(self, conn: Conn, m: P.AdminHello) -> tuple[P.Reply, list[int]]:
        self._check_version(m.version)
        relayed = isinstance(m.admin_token, str) and hmac.compare_digest(m.admin_token.encode(), self.relay_token.encode())
        if not relayed and not hmac.compare_digest(token_hash(self.node_key, m.admin_token), self._admin_hash):
            raise AuthenticationError(
                f"wrong admin token; read it from {os.path.join(self.config.state_dir, 'admin.token')}"
            )
        conn.admin = True
        kind = self.config.device_spec()[0] if self.store.devices else ""
        return P.AdminWelcome(self.config.node_id, sorted(self.store.devices), kind), []

    def _open(self, conn: Conn, m: P.OpenInvocation) -> tuple[P.Reply, list[int]]:
        self._need_admin(conn)
        inv = self.store.open_invocation(m.workflow, m.functions, m.invocation_id, m.tokens)
        try:
            self.invocations.opened(inv, self.store.registry)
        except GfaasError:
            self.store.end_invocation(inv.id)  # not recorded: a restart would not know it, so it is not open
            raise
        return P.InvocationOpened(inv.id, dict(inv.tokens)), []

    def _end(self, conn: Conn, m: P.EndInvocation) -> tuple[P.Reply, list[int]]:
        self._need_admin(conn)
        freed = self.store.end_invocation(m.invocation_id)
        self._record_ended([m.invocation_id])
        if self.remote is not None:
            self.remote.on_end_invocation(m.invocation_id)
        return P.Ended(m.invocation_id, freed), []

    def _end_many(self, conn: Conn, m: P.EndInvocations) -> tuple[P.Reply, list[int]]:
        self._need_admin(conn)
        freed: dict[str, int] = {}
        for inv in m.invocation_ids:
            if inv in self.store.registry and inv not in freed:
                freed[inv] = self.store.end_invocation(inv)
                if self.remote is not None:
                    self.remote.on_end_invocation(inv)
        if freed:
            self._record_ended(list(freed))
        return P.EndedMany(freed), []

    def _stats(self, conn: Conn, m: P.Stats) -> tuple[P.Reply, list[int]]:
        self._need_admin(conn)
        self._drain_others(conn)  # seals and local reads already sent count
        self._scan_all()
        for _ in range(8):  # report settled tiers, not writes still in flight
            self._finish_spills(wait=True)
            with self.lock:
                self.store.settle()
            if not self._spill_futures:
                break
        return P.StatsReply(self.config.node_id, **self.store.stats()), []

    def _snapshot(self, conn: Conn, m: P.Snapshot) -> tuple[P.Reply, list[int]]:
        self._need_admin(conn)
        return nodestats.snapshot(self.store, self.config.node_id, len(self._conns)), []

    def _object_info(self, conn: Conn, m: P.ObjectInfo) -> tuple[P.Reply, list[int]]:
        self._need_admin(conn)
        return nodestats.object_info(self.store, m.id), []

    def _queue_hint(self, conn: Conn, m: P.QueueHint) -> tuple[P.Reply, list[int]]:
        self._need_admin(conn)
        self.store.queue_hint(m.invocation_id, m.positions, m.done)
        return P.Ok(), []

    def _queue_state(self, conn: Conn, m: P.QueueState) -> tuple[P.Reply, list[int]]:
        self._need_admin(conn)
        self.store.queue_state([(e.invocation_id, e.queued, e.running, e.done) for e in m.entries], m.heads)
        return P.Ok(), []

    def _need_dedup(self) -> Any:
        if self.dedup is None:
            raise ConfigError("page merging is off on this node (NodeConfig.dedup=False); start it with dedup on")
        return self.dedup

    def _dedup_hint(self, conn: Conn, m: P.DedupHint) -> tuple[P.Reply, list[int]]:
        self._need_admin(conn)
        self._need_dedup().hint(m.pid, m.workflow, m.function, m.domain, m.nbytes)
        return P.Ok(), []

    def _dedup_forget(self, conn: Conn, m: P.DedupForget) -> tuple[P.Reply, list[int]]:
        self._need_admin(conn)
        self._need_dedup().forget(m.pid)
        return P.Ok(), []

    def _dedup_status(self, conn: Conn, m: P.DedupStatus) -> tuple[P.Reply, list[int]]:
        self._need_admin(conn)
        return P.DedupReport(self._need_dedup().report()), []

    def _export(self, conn: Conn, seg: Segment, writable: bool) -> list[int]:
        sent = conn.sent_rw if writable else conn.sent_ro
        if seg.id in sent:
            return []
        if seg.device >= 0:
            return []  # device segments travel as a DeviceRef in the reply (see _device_ref)
        if not writable and (seg.owner is not None or self.config.seal_writes):
            # A slab is never reused: its writes are sealed before any reader sees it (its owner
            # keeps writing through the mapping it already has). Dedicated segments, see seal_writes.
            self.store.backend.seal_writes(seg.handle)
        fd = self.store.backend.export(seg.handle, writable)
        if fd is None:
            return []
        sent.add(seg.id)
        self._seg_holders.setdefault(seg.id, set()).add(conn)
        # A duplicate: the segment may be retired (and its descriptors closed) before the reply goes.
        return [os.dup(fd)]

    def _device_ref(self, conn: Conn, seg: Segment) -> P.DeviceRef | None:
        if seg.device < 0:
            return None
        ref: P.DeviceRef = self.store.devices[seg.device].export(seg.handle, False)
        if (seg.id not in conn.sent_ro):
            conn.sent_ro.add(seg.id)
            self._seg_holders.setdefault(seg.id, set()).add(conn)
        conn.arenas.add(ref.arena)
        return ref

    def _lease(self, conn: Conn, m: P.Lease) -> tuple[P.Reply, list[int]]:
        s = self._need_session(conn)
        seg, ids = self.store.lease(s, m.min_bytes)
        if seg.index is not None and s.slots:
            ids = self.store.held_ids(s)  # all of them, in slot order: the client replaces its list
        return (P.Leased(seg.id, 0, seg.limit or seg.size, ids, first_slot=self.store.first_slot(s, ids)),
                self._export(conn, seg, True))

    def _more_ids(self, conn: Conn, m: P.MoreIds) -> tuple[P.Reply, list[int]]:
        s = self._need_session(conn)
        ids = self.store.more_ids(s, m.n)
        return P.Ids(ids, first_slot=self.store.first_slot(s, ids)), []

    def _seal_small(self, conn: Conn, m: P.Seal) -> None:
        s = self._need_session(conn)
        try:
            rec = self.store.seal_small(s, m.id, m.offset, m.nbytes, m.dtype, m.shape, m.consumers)
        except GfaasError as exc:
            self.store.seal_refused(s, m.id, exc)
            raise
        self._sealed(rec)
        return None

    def _sealed(self, rec: ObjectRecord) -> None:
        self._published(rec)
        readers = self._early.pop(rec.id, None) if self._early else None
        for s in readers or ():
            self._count_read(s, rec.id)

    def _sync(self, conn: Conn, m: P.Sync) -> tuple[P.Reply, list[int]]:
        return P.Ok(), []  # an error of an earlier asynchronous request was raised before this ran

    def _scan(self, conn: Conn, reads: bool = True) -> int:
        """Seal what ``conn`` described in its slab's directory, then count what it noted in its read
        log (``reads``); returns how many entries it found. A refused seal is held for its next
        synchronous request, as for a ``Seal`` message."""
        s = conn.session
        if s is None:
            return 0
        log_ = conn.read_log if reads else None
        if not ((self.directory_seals and self.store.directory_pending(s)) or (log_ is not None and log_.pending())):
            return 0  # nothing new: the common case, two 8-byte reads
        with self.lock:
            recs, err = self.store.scan_directory(s) if self.directory_seals else ([], None)
            for rec in recs:
                self._sealed(rec)
            if err is not None and conn.pending_error is None:
                conn.pending_error = err
                log.warning("seal from a slab directory refused: %s", err)
            ids = conn.read_log.take() if reads and conn.read_log is not None else []
        if ids:
            self._consumed(conn, P.Consumed(ids))
        return len(recs) + len(ids)

    def _scan_all_directories(self) -> None:
        for c in list(self._conns.values()):
            self._scan(c, reads=False)

    def _scan_all(self) -> int:
        """Every connection's directory first (so reads find their objects), then every read log."""
        found = 0
        for conn in list(self._conns.values()):
            found += self._scan(conn, reads=False)
        for conn in list(self._conns.values()):
            if conn.read_log is not None:
                found += self._scan(conn)
        return found

    def _consumed(self, conn: Conn, m: P.Consumed) -> None:
        """Reads a client made locally (see slabindex.py), counted as its gets would have been.

        The reader learnt each ID after its producer's put returned, so the seal was queued before
        this message: if it is not here yet, the other connections are drained first; one still
        missing then (its seal arrives on a connection this drain had passed) is counted when it is
        sealed. A read the reader may not make counts for nothing: the read itself was checked
        against the directory's reader list, and this only decides when the object is freed.
        """
        s = conn.session
        if s is None:
            return None
        drained = False
        for oid in m.ids:
            if not isinstance(oid, bytes):
                continue
            if oid not in self.store.objects and not drained:
                self._scan_all_directories()
                self._drain_others(conn)
                drained = True
            if oid in self.store.objects:
                self._count_read(s, oid)
            else:
                self._early.setdefault(oid, []).append(s)
                while len(self._early) > _EARLY_MAX:
                    self._early.popitem(last=False)
        return None

    def _count_read(self, s: Session, oid: bytes) -> None:
        if s.id not in self.store.sessions:
            return
        try:
            self.store.check_live(s)
            rec = self.store.lookup(s.invocation, s.function, oid)
        except GfaasError:
            return  # freed meanwhile, the invocation ended, or not this reader's to read
        rec.accessed = self.store.clock.now()
        self.store.consumed(rec, s.function)

    def _allocate(self, conn: Conn, m: P.Allocate) -> tuple[P.Reply, list[int]]:
        rec, seg = self.store.allocate(self._need_session(conn), m.nbytes, m.dtype, m.shape, m.consumers,
                                       m.device)
        fds = self._export(conn, seg, True)
        return P.Allocated(rec.id, seg.id, rec.offset, pin=self.store.pin(self._need_session(conn), seg),
                           device=self._device_ref(conn, seg)), fds

    def _seal_allocated(self, conn: Conn, m: P.SealAllocated) -> tuple[P.Reply, list[int]] | None:
        s = self._need_session(conn)
        rec = self.store.objects.get(m.id)
        seg = self.store.segments.get(rec.segment) if rec is not None else None
        if not m.event or seg is None or seg.device < 0:
            rec = self.store.seal(s, m.id, m.event)  # refuses an event on a host object
            self._published(rec)
            return P.Ok(), []
        dev = self.store.devices[seg.device]

        def work() -> tuple[P.Reply, list[int]]:
            # A producer that sends an event (ours wait before sealing) may exit before it completes:
            # wait here, bounded and off the loop and the lock, and store no event, so no reader,
            # delivery or eviction ever waits on another process's event.
            dev.wait_event(m.event)
            with self.lock:
                self._published(self.store.seal(s, m.id))
            return P.Ok(), []

        self.defer(conn, work)
        return None

    def _seal_written(self, conn: Conn, m: P.SealWritten) -> None:
        """A host object's asynchronous seal (no reply: an error is the connection's next one)."""
        s = self._need_session(conn)
        rec = self.store.objects.get(m.id)
        seg = self.store.segments.get(rec.segment) if rec is not None else None
        if seg is not None and seg.device >= 0 and rec is not None and rec.writer == s.id:
            raise ProtocolError(f"object {m.id.hex()} is in a GPU's pool: seal it with SealAllocated and the "
                                "CUDA event of its writes")
        self._published(self.store.seal(s, m.id))
        return None

    def _derive(self, conn: Conn, m: P.Derive) -> tuple[P.Reply, list[int]]:
        rec = self.store.derive(self._need_session(conn), m.segment, m.offset, m.nbytes, m.dtype, m.shape,
                                m.consumers)
        self._published(rec)
        return P.Derived(rec.id), []

    def _published(self, rec: ObjectRecord) -> None:
        if self.remote is not None:
            self.remote.publish(rec)

    @staticmethod
    def _check_size(rec: ObjectRecord, expect_nbytes: int) -> None:
        if expect_nbytes >= 0 and expect_nbytes != rec.nbytes:
            # Raised before the read is counted, so the object stays available to this consumer.
            raise ConfigError(
                f"get into a buffer of {expect_nbytes} bytes, but object {rec.id.hex()} has {rec.nbytes};"
                " pass a buffer of the object's size"
            )

    def _located(self, conn: Conn, rec: ObjectRecord, seg: Segment,
                 expect_nbytes: int = -1, copy: Segment | None = None) -> tuple[P.Reply, list[int]]:
        """The reply to a get: the object's own segment, or ``copy``, a delivery holding its bytes
        at offset 0 on the tier the reader asked for."""
        self._check_size(rec, expect_nbytes)
        where, offset, event = (seg, rec.offset, rec.event) if copy is None else (copy, 0, b"")
        fds = self._export(conn, where, False)
        local: list[int] = []
        if fds and where.index is not None:
            # The reader may read this object, and every object in the slab shares its invocation:
            # send the slab's index too, so its later objects are read locally (slabindex.py).
            fds.append(os.dup(where.index.export()))
            local = [where.limit, where.index.entries]
        read_log = 0
        if local and conn.read_log is None:
            conn.read_log = ReadLog()
            fds.append(os.dup(conn.read_log.fd))
            read_log = conn.read_log.capacity
        pin = conn.session is not None and self.store.pin(conn.session, where, read=(offset, rec.nbytes))
        return (P.Located(rec.id, where.id, offset, rec.nbytes, rec.dtype, list(rec.shape),
                          self.config.node_id, pin=pin, device=self._device_ref(conn, where), event=event,
                          local=local, read_log=read_log), fds)

    def _get(self, conn: Conn, m: P.Get, drained: bool = False) -> tuple[P.Reply, list[int]] | None:
        s = self._need_session(conn)
        if not (math.isfinite(m.deadline_s) and m.deadline_s >= 0):
            raise ProtocolError(f"get with deadline_s={m.deadline_s!r}; give the seconds the reader can wait, >= 0"
                                " (0: no deadline)")
        if self._absent(m.id) and self.store.local_reads:
            self._scan_all_directories()  # its seal may be in a slab's directory, not yet seen
        if self._absent(m.id) or self._written_here(m.id):  # its seal may be queued on its producer's connection
            if self._draining:
                conn.busy = True
                self._parked.append((conn, m))
                return None
            if not drained:
                self._drain_others(conn)
            if self._absent(m.id) and self.remote is not None and self.remote.may_fetch(m.id):
                if m.device >= 0:  # a GPU reader: pulled into host memory here, then delivered onto its GPU
                    self.defer(conn, lambda: self._fetch_to_device(conn, s, m))
                else:
                    self.defer(conn, lambda: self.remote.fetch(s, m.id, lambda rec, seg: self._located(conn, rec, seg)))
                return None
        if m.device != P.ANY_DEVICE:
            rec = self.store.lookup(s.invocation, s.function, m.id)
            seg = self.store.resident(rec, m.device)
            if seg.device != m.device:
                return self._deliver(conn, s, m, rec, seg)
        return self.store.get(s, m.id, lambda rec, seg: self._located(conn, rec, seg, m.expect_nbytes))

    def _fetch_to_device(self, conn: Conn, s: Session, m: P.Get) -> tuple[P.Reply, list[int]]:
        """A GPU reader's get of an object on another machine (on a worker thread): the puller lands it
        in a host segment here (the owner sent it from a warm staging segment if it lived on a GPU
        there), then one copy delivers it onto the reader's GPU, as for a local host object. The copy
        runs outside the lock; the pulled segment is held until it finished."""
        assert self.remote is not None
        got: dict[str, Any] = {}

        def export(rec: ObjectRecord, seg: Segment) -> tuple[P.Reply, list[int]]:  # under the lock
            self._check_size(rec, m.expect_nbytes)
            if seg.device == m.device:
                return self._located(conn, rec, seg)
            got.update(rec=rec, seg=seg, copy=self.store.delivery(s, rec.nbytes, m.device))
            self.store.hold(seg)
            return P.Error("", ""), []  # a placeholder: the delivery below answers

        try:
            out = self.remote.fetch(s, m.id, export)
        except BaseException:
            if got:  # the pull failed after its copy was placed: give back what export took
                with self.lock:
                    self.store.drop_delivery(got["copy"])
                    self.store.unhold(got["seg"])
            raise
        if not got:
            return out
        rec, seg, copy = got["rec"], got["seg"], got["copy"]
        return self._fill(rec, seg, copy, m.deadline_s, lambda: self._located(conn, rec, seg, -1, copy))

    def _deliver(self, conn: Conn, s: Session, m: P.Get, rec: ObjectRecord,
                 seg: Segment) -> tuple[P.Reply, list[int]] | None:
        """A get onto another tier: copy the object into a delivery segment there on a worker
        thread (host<->GPU through the pinned ring, GPU<->GPU over the peer link), then answer."""
        self._check_size(rec, m.expect_nbytes)
        copy = self.store.delivery(s, rec.nbytes, m.device)
        self.store.hold(seg)  # the source's memory stays while the copy runs, whatever happens to it

        self.defer(conn, lambda: self._fill(rec, seg, copy, m.deadline_s, lambda: self.store.get(
            s, m.id, lambda r, g: self._located(conn, r, g, -1, copy))))
        return None

    def _fill(self, rec: ObjectRecord, seg: Segment, copy: Segment, deadline_s: float,
              answer: Callable[[], tuple[P.Reply, list[int]]]) -> tuple[P.Reply, list[int]]:
        """Copy ``rec``'s bytes from ``seg`` (held by the caller) into the delivery ``copy`` on a
        worker thread, outside the lock, then ``answer`` under it. A failure gives the delivery back;
        the source is let go either way."""
        try:
            if rec.nbytes:
                due = time.monotonic() + deadline_s if deadline_s > 0 else math.inf
                self._copy_between(seg, rec.offset, copy, rec.nbytes, rec.event, due)
            with self.lock:
                return answer()
        except BaseException:
            with self.lock:
                self.store.drop_delivery(copy)
            raise
        finally:
            with self.lock:
                self.store.unhold(seg)

    def _copy_between(self, src: Segment, src_offset: int, dst: Segment, nbytes: int, event: bytes,
                      deadline: float = math.inf) -> None:
        """Copy an object's bytes into a delivery on another tier (host <-> GPU through the GPU's
        ring, GPU <-> GPU peer). Runs on a worker thread without the lock: the source is held and
        the delivery is not published yet. ``deadline`` (``time.monotonic()``) is the reader's:
        the ring shares the link among concurrent copies by their deadlines."""
        sb, db = self.store.backend_of(src), self.store.backend_of(dst)
        if event and src.device >= 0:
            self.store.devices[src.device].wait_event(event)  # the producer's writes, nothing more
        if src.device >= 0 and dst.device >= 0:
            db.transfer(src.handle, src_offset, dst.handle, 0, nbytes)
        elif dst.device >= 0:
            view = sb.host_view(src.handle)  # None on the null host backend: nothing to read
            db.copy_in(dst.handle, 0, memoryview(bytearray(nbytes)) if view is None
                       else view[src_offset : src_offset + nbytes], deadline)
        else:
            view = db.host_view(dst.handle)
            sb.copy_out(src.handle, src_offset, nbytes, memoryview(bytearray(nbytes)) if view is None
                        else view[:nbytes], deadline)

    def _get_drained(self, conn: Conn, m: P.Get) -> tuple[P.Reply, list[int]] | None:
        return self._get(conn, m, drained=True)

    def _written_here(self, oid: bytes) -> bool:
        """Allocated by a connection of this node and not sealed yet (its ``SealWritten`` may be queued)."""
        rec = self.store.objects.get(oid)
        return rec is not None and rec.state == WRITING and rec.writer is not None

    def _absent(self, oid: bytes) -> bool:
        """Not here, or still arriving from another node (a pull writes it; the remote waits for it)."""
        rec = self.store.objects.get(oid)
        return rec is None or (rec.state == WRITING and rec.writer is None)

    def _release(self, conn: Conn, m: P.Release) -> None:
        if conn.session is not None:
            self.store.release(conn.session, m.segments)
        return None

    def _delete(self, conn: Conn, m: P.Delete) -> tuple[P.Reply, list[int]]:
        s = self._need_session(conn)
        if self.directory_seals and isinstance(m.id, bytes) and m.id not in self.store.objects:
            self._scan_all_directories()  # its seal may be in its producer's directory, not yet seen
        rec = self.store.objects.get(m.id)
        self.store.delete(s, m.id)
        if self.remote is not None and rec is not None:
            self.remote.unpublish(rec)
        return P.Ok(), []


def run_daemon(config: NodeConfig, remote: Any = None) -> None:
    """Run a daemon in this process until SIGTERM/SIGINT."""
    Daemon(config, remote).serve_forever()
