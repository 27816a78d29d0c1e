"""The client library used inside functions: ``connect``, ``put``, ``allocate``/``seal``, ``get``,
``delete``, and the platform-side :class:`Admin`."""

from __future__ import annotations

import logging
import mmap
import os
import socket
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import default_run_dir, default_socket_path
from ..errors import (
    AccessDenied,
    AuthenticationError,
    ConfigError,
    DaemonUnavailable,
    GfaasError,
    ObjectStateError,
    ProtocolError,
)
from ..secfiles import read_private_file
from . import protocol as P
from .backends.host import attach
from .channel import Channel
from .copy import as_bytes, copy_bytes
from .device_client import (
    EVENT_TIMEOUT_S,
    DeviceMapper,
    DeviceView,
    cuda_interface,
    device_of,
    process_mapper,
    wait_until,
)
from .ids import DataRef, object_id
from .meta import _ITEMSIZE, RAW, align, check_consumers, itemsize
from .slabindex import (
    DIR,
    DIR_COMMIT,
    DIR_ENTRY,
    DIR_ID,
    DIR_MAX_FUNCTIONS,
    DIR_MAX_NDIM,
    DTYPE_CODE,
    DTYPES,
    INDEX_ENTRY,
    INDEX_HEADER,
    LIVE,
    LOG_HEADER,
)

log = logging.getLogger("gfaas.dataplane")


# Pre-fault a whole range with one system call instead of one page fault per 4 KiB page (Linux 5.14+;
# ignored where unsupported). Fresh shared-memory pages are the main cost of large puts and copies.
_MADV_POPULATE_READ = 22
_MADV_POPULATE_WRITE = 23
_POPULATE_MIN = 1 << 20


_SLAB_PREFAULT = 256 << 10
_SLAB_PREFAULT_FIRST = 16 << 10  # first stride after a lease; doubles up to _SLAB_PREFAULT


def _populate(mm: mmap.mmap, offset: int, nbytes: int, advice: int, minimum: int = _POPULATE_MIN) -> None:
    if nbytes < minimum or nbytes <= 0:
        return
    start = offset // mmap.PAGESIZE * mmap.PAGESIZE
    try:
        mm.madvise(advice, start, offset + nbytes - start)
    except (OSError, ValueError):
        pass


_HUGE_COPY_MIN = 4 << 20


def _private_array(shape: tuple[int, ...], dtype: np.dtype[Any], nbytes: int) -> np.ndarray:
    """A fresh writable array for a copy. Large ones are backed by anonymous memory asked for in
    2 MiB pages and faulted in with one call: on the VM we measured, copying 256 MiB out of shared
    memory into it ran at 7.1 GB/s, against 2.3 GB/s into ``np.empty`` (page faults on 4 KiB pages).
    """
    if nbytes < _HUGE_COPY_MIN:
        return np.empty(shape, dtype)
    mm = mmap.mmap(-1, nbytes, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for advice in (getattr(mmap, "MADV_HUGEPAGE", None), _MADV_POPULATE_WRITE):
        if advice is not None:
            try:
                mm.madvise(advice)
            except OSError:
                pass
    return np.frombuffer(mm, dtype, nbytes // dtype.itemsize).reshape(shape)


_NOT_LOCAL = 255  # directory entry's ndim for an object that is read through the daemon only
_U32 = 1 << 32
_NP_DTYPES = tuple(np.dtype(np.uint8 if d == RAW else d) for d in DTYPES)
_ITEMSIZES = tuple(_ITEMSIZE[d] for d in DTYPES)
_ZERO8 = bytes(8)


class _LocalSlab:
    """A slab of another connection this one maps read-only, with its index (see slabindex.py)."""

    __slots__ = ("seg", "data", "index", "dir_at", "slots", "scanned", "dead")

    def __init__(self, seg: int, data: mmap.mmap, index: mmap.mmap, dir_at: int, slots: int) -> None:
        self.seg, self.data, self.index, self.dir_at = seg, data, index, dir_at
        self.slots = min(slots, (len(data) - dir_at) // DIR_ENTRY, (len(index) - INDEX_HEADER) // INDEX_ENTRY)
        self.scanned = 0
        self.dead = False


@dataclass(frozen=True)
class Credentials:
    """What a function process needs to talk to its node: socket path and its function token."""

    socket_path: str
    token: str
    invocation_id: str = ""
    function: str = ""

    def to_env(self) -> dict[str, str]:
        """Environment variables that :func:`connect` reads when given no arguments."""
        return {"GFAAS_SOCKET": self.socket_path, "GFAAS_TOKEN": self.token}


def _as_array(obj: Any) -> tuple[np.ndarray, str]:
    """Turn a supported object into a C-contiguous host array and its wire dtype."""
    if isinstance(obj, np.ndarray):
        arr = obj
    elif isinstance(obj, np.generic):
        arr = np.asarray(obj)  # a numpy scalar is stored as a 0-d array
    elif isinstance(obj, bytes | bytearray | memoryview):
        mv = memoryview(obj)
        if not mv.c_contiguous:
            raise ConfigError("put of a non-contiguous memoryview; pass bytes(view) or a contiguous buffer")
        return np.frombuffer(mv.cast("B"), dtype=np.uint8), RAW
    elif hasattr(obj, "__dlpack__"):
        # torch / CuPy / JAX tensors. Device tensors are staged through host memory until the
        # cuda backend keeps them on the GPU.
        dev = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else 1
        if dev != 1:
            host = obj.get() if hasattr(obj, "get") else obj.cpu() if hasattr(obj, "cpu") else None
            if host is None:
                raise ConfigError(f"cannot stage a {type(obj).__name__} on DLPack device {dev} to host memory")
            return _as_array(host)
        arr = np.from_dlpack(obj)
    else:
        raise ConfigError(
            f"cannot put a {type(obj).__name__}; pass a numpy array, bytes, memoryview or a DLPack tensor"
        )
    if arr.dtype.hasobject or arr.dtype.fields is not None:
        raise ConfigError(f"cannot put an array of dtype {arr.dtype}; use a numeric or bool dtype")
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d array into shape (1,))
        arr = np.ascontiguousarray(arr)
    dt = arr.dtype.str
    itemsize(dt)  # validates
    return arr, dt


class Buffer:
    """Space for an object the producer writes in place; :meth:`seal` publishes it."""

    def __init__(self, client: Client, oid: bytes, array: np.ndarray, raw: bool) -> None:
        self._client = client
        self._id = oid
        self.array = array
        self._raw = raw
        self._sealed = False

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.array if dtype is None else self.array.astype(dtype)

    @property
    def sealed(self) -> bool:
        return self._sealed

    def seal(self) -> DataRef:
        """Make the object immutable and visible to its consumers; returns its reference.

        The seal goes out without waiting for the daemon (a reader's get of the object waits for it
        there); if it fails, the error comes with this connection's next call, as a small put's does."""
        if self._sealed:
            raise ObjectStateError(f"object {self._id.hex()} is already sealed; objects are sealed once")
        self._client._seal_written(self._id)
        self._sealed = True
        self.array.flags.writeable = False
        return DataRef(self._id, self._client.node_id)


class DeviceBuffer:
    """Space in a GPU's pool for an object the producer writes in place (``.view`` exposes
    ``__cuda_array_interface__``/DLPack, ``.array()`` a CuPy array); :meth:`seal` waits for the
    writes queued on the current stream, then publishes the object."""

    def __init__(self, client: Client, oid: bytes, view: DeviceView) -> None:
        self._client, self._id, self.view = client, oid, view
        self._sealed = False

    @property
    def sealed(self) -> bool:
        return self._sealed

    def array(self) -> Any:
        return self.view.array()

    def seal(self, stream: int | None = None) -> DataRef:
        """Publish the object once the work queued on ``stream`` (default: the current CuPy
        stream) has completed. The producer waits, not its readers: an IPC event would die with
        the producer's process, which may exit right after the seal (docs/design/gpu-storage.md)."""
        if self._sealed:
            raise ObjectStateError(f"object {self._id.hex()} is already sealed; objects are sealed once")
        self._client._device_mapper().finish(self.view.device, stream)
        self._client._call(P.SealAllocated(self._id))
        self._sealed = True
        self.view.readonly = True
        return DataRef(self._id, self._client.node_id)


class Client:
    """A function's connection to its node daemon; see :func:`connect`.

    An *attached* client (``welcome=``: a connection the platform opened with :meth:`Admin.attach`)
    outlives tasks: it holds one (invocation, function)'s credentials at a time, given by a ``Bind``
    that :meth:`bind` sends, or that the platform sent on it before the task (:meth:`expect_binding`);
    :meth:`end_task` forgets them. Mappings of segments, the read log and the node's settings stay."""

    def __init__(self, socket_path: str, token: str | None, timeout: float | None = 60.0,
                 device_mapper: DeviceMapper | None = None, sock: socket.socket | None = None, *,
                 welcome: P.Welcome | None = None) -> None:
        self._mapper = device_mapper
        self._arenas: dict[int, tuple[int, int]] = {}  # arena -> (GPU, base address here)
        # Device blocks whose views died -> their GPU: released once the work queued before is done.
        self._device_dropped: list[tuple[int, int, Any]] = []  # (segment, GPU, its mark's token)
        self._ch = Channel(socket_path, timeout, sock)
        self.attached = welcome is not None
        if welcome is None:
            if not token:
                self._ch.close()
                raise AuthenticationError("a client needs a function token, or an attached connection (welcome=)")
            w = self._ch.handshake(P.Hello(token))
        else:
            w = welcome
        assert isinstance(w, P.Welcome)
        self.node_id = w.node_id
        self.small_object_max = w.small_object_max
        self.devices = frozenset(w.devices)  # GPUs with a pool on this node
        self._directory_seals = w.directory_seals
        self._maps: dict[tuple[int, bool], mmap.mmap] = {}
        self._gen = 0  # which credentials' views a dying view's pin belongs to (see _view_died)
        # A Bind whose reply (Bound) is not read yet, and the invocation it must name ("": any).
        self._bind_pending = False
        self._bind_expect = ""
        # GPU objects the current binding was handed located (Bound.located): id -> the daemon's answer,
        # taken by the first get of each (the pin it holds is that view's).
        self._prefetched: dict[bytes, P.Located] = {}
        self.prefetched_gets = 0  # gets served from it, with no round trip
        # Writable mappings whose every page is in this process's page tables (MAP_POPULATE at
        # attach, or populated before a first write): a warm segment reused for the next large
        # put needs no second pass, which cost 10 ms per 256 MiB put (issue 12).
        self._populated: set[tuple[int, bool]] = set()
        self._retiring: dict[tuple[int, bool], mmap.mmap] = {}
        self._log_head = 0  # the daemon's head in the read log, as last read
        # Slabs read locally, and the IDs found in their directories (not yet read) -> (slab, slot).
        self._local: dict[int, _LocalSlab] = {}
        self._local_ids: dict[bytes, tuple[_LocalSlab, int]] = {}
        self._log: mmap.mmap | None = None  # where local reads are noted for the daemon (ReadLog)
        self._log_cap = 0
        self._log_tail = 0
        self._masks: dict[tuple[str, ...] | None, bytes | None] = {}
        self._consumer_lists: dict[tuple[str, ...], list[str]] = {}  # checked, as put sends them
        # Readers (None or a tuple) seen before -> (the checked list, directory mask, open to all).
        self._put_plans: dict[tuple[str, ...] | None, tuple[list[str] | None, bytes, bool]] = {}
        self.functions: tuple[str, ...] = ()
        self._credentials(w.invocation_id, w.function, tuple(w.functions))

    def _credentials(self, invocation_id: str, function: str, functions: tuple[str, ...]) -> None:
        """Start acting for ``function`` of ``invocation_id`` (all empty: for nobody): the state that
        belongs to one set of credentials starts afresh; what belongs to the connection stays."""
        self.invocation_id = invocation_id
        self.function = function
        if functions != self.functions:  # what was checked against the functions of another workflow
            self._masks.clear()
            self._consumer_lists.clear()
            self._put_plans.clear()
        self.functions = functions
        self._prefetched = {}  # located for the earlier credentials: their pins ended with them
        # Views of the earlier credentials' objects no longer hold pins (the daemon released them
        # when the credentials ended): their deaths are not told under these (see _view_died).
        self._gen += 1
        # Objects of their own segment this connection got as zero-copy views:
        # segment -> (address of the object's first byte in this process, its offset, its size).
        self._read: dict[int, tuple[int, int, int]] = {}
        self._arena: memoryview | None = None
        self._arena_seg = -1
        self._next = 0
        self._faulted_to = 0
        self._ahead = _SLAB_PREFAULT_FIRST
        # IDs for small puts, (id, directory slot or -1), the next one last.
        self._ids: list[tuple[bytes, int]] = []
        self._arena_map: mmap.mmap | None = None
        self._dir_at = -1  # where the current slab's directory starts (-1: it has none)
        me = functions.index(function) if function in functions else DIR_MAX_FUNCTIONS
        self._my_bit = (me // 8, 1 << (me % 8)) if me < DIR_MAX_FUNCTIONS else None
        # Asynchronous requests sent since the last reply (see close), and of those, seals: a get
        # made while one may have failed asks the daemon, so the failure surfaces at that call.
        self._unsynced = False
        self._unsealed = False
        self.slab_used = False  # a put packed an object into a slab under these credentials
        # Segments whose views died (see _pinned_view), told to the daemon with the next request.
        self._released: list[int] = []
        self._device_dropped = []

    # ---- plumbing ------------------------------------------------------------------------------
    def _flush_released(self) -> None:
        if self._device_dropped:
            self._flush_device_dropped()
        if self._released:
            done, self._released[:] = list(self._released), []
            self._ch.send(P.Release(done))

    def _pinned_view(self, mm: mmap.mmap, seg: int, offset: int, nbytes: int) -> np.ndarray:
        """A uint8 array over one object whose death tells the daemon the segment may be reused.

        Every array derived from it has this exact array as its ``base`` (numpy stops collapsing
        the base chain at an array whose own base is not an array), and ``memoryview``s of those
        arrays hold them, so the finalizer runs only when the last view of the object is gone.
        """
        holder = np.frombuffer(memoryview(mm)[offset : offset + nbytes], np.uint8)
        weakref.finalize(holder, self._view_died, seg, self._gen)
        return holder

    def _view_died(self, seg: int, gen: int) -> None:
        """A pinned view's finalizer: its pin is released with the next request, if it was taken under
        the credentials held now (the daemon released the earlier ones' pins when they ended, and the
        same segment may be pinned again under these)."""
        if gen == self._gen:
            self._released.append(seg)

    @property
    def closed(self) -> bool:
        """The connection is gone (closed here, or broken: the daemon went or refused it)."""
        return self._ch.sock is None

    def fileno(self) -> int:
        """The connection's descriptor (-1 once it is gone)."""
        return -1 if self._ch.sock is None else self._ch.sock.fileno()

    # ---- credentials on an attached connection ------------------------------------------------
    def bind(self, token: str, lease: int = -1, ids: int = 0) -> None:
        """Take ``token``'s credentials (an attached client): the ``Bind`` goes out now, its reply is
        read with the next request's, so it costs no round trip of its own. ``lease`` >= 0 asks for a
        slab for small objects of up to that size with ``ids`` IDs (the next put then needs no lease)."""
        if not self.attached:
            raise ConfigError("bind() is for attached clients (Admin.attach); this one holds its Hello's credentials")
        self.end_task()
        self._ch.send(P.Bind(token, lease, ids))
        self._bind_pending = True

    def expect_binding(self, invocation_id: str) -> None:
        """The platform sent a ``Bind`` for ``invocation_id`` on this connection before handing over a
        task (a worker process never sees the token): its reply is read with the next request's."""
        if not self.attached:
            raise ConfigError("expect_binding() is for attached clients (Admin.attach)")
        self.end_task()
        self._bind_pending, self._bind_expect = True, invocation_id

    def end_task(self, unbind: bool = False) -> None:
        """Stop acting for the current credentials (an attached client). ``unbind``: end them at the
        daemon now, with a one-way ``Unbind`` (else the platform's ``Unbind``, or the next ``Bind``, does):
        their pins and slab go back at once. Puts need no round trip here: a seal refused after this
        is the error its readers get (``DataLost``, with the reason)."""
        if not self.attached:
            return
        if self._bind_pending:
            try:
                self._settle_bind()
            except DaemonUnavailable:
                raise
            except GfaasError:  # nothing was done under them: nothing to report
                pass
        self._bind_expect = ""
        if self.invocation_id or self.function:
            if unbind:
                self._ch.send(P.Unbind())
            self._credentials("", "", self.functions)

    def _settle_bind(self, request: bytes = b"") -> None:
        """Read the reply to the pending ``Bind`` (after sending ``request``, whose reply follows it) and
        take the credentials it names, or raise why not."""
        self._bind_pending = False
        expect, self._bind_expect = self._bind_expect, ""
        r, fds = self._ch.recv(request)
        if not isinstance(r, P.Bound) or len(fds) != (r.lease is not None):
            for fd in fds:
                os.close(fd)
            self._ch.close()
            raise ProtocolError(f"the daemon answered a Bind with {type(r).__name__}"
                                f" and {len(fds)} descriptor(s); reconnect")
        if expect and r.invocation_id != expect:
            for fd in fds:
                os.close(fd)
            self._ch.close()
            raise ProtocolError(f"this connection was bound to invocation {r.invocation_id}, not {expect}; reconnect")
        self._credentials(r.invocation_id, r.function, tuple(r.functions))
        self._note_retired(r.retired)
        self._prefetched = {loc.id: loc for loc in r.located if loc.device is not None}
        if r.lease is not None:
            self._maps[(r.lease.segment, True)] = attach(fds[0], True)
            self._use_slab(r.lease)

    def _call(self, msg: P._Msg) -> P.Reply:
        self._flush_released()
        self._retiring.clear()
        if self._bind_pending:
            reply, fds = self._call_bound(P.encode(msg))
        else:
            reply, fds = self._ch.call(msg)
        self._unsynced = self._unsealed = False
        if self._local_ids and isinstance(reply, P.Located):
            self._local_ids.pop(reply.id, None)  # read through the daemon: not again locally
        if fds:
            seg = getattr(reply, "segment", None)
            local = getattr(reply, "local", None)
            read_log = getattr(reply, "read_log", 0)
            if seg is None or len(fds) != 1 + bool(local) + bool(read_log):
                for fd in fds:
                    os.close(fd)
                raise ProtocolError("the daemon sent file descriptors with a reply that names no segment")
            writable = not isinstance(reply, P.Located)
            # A segment of its own for one object about to be written whole: map all of it now.
            whole = isinstance(reply, P.Allocated) and seg != self._arena_seg
            mapped = self._maps[(seg, writable)] = attach(fds[0], writable, populate=whole)
            if whole:
                self._populated.add((seg, writable))
            if local:
                self._local[seg] = _LocalSlab(seg, mapped, attach(fds[1], False), local[0], local[1])
            if read_log:
                self._log, self._log_cap, self._log_tail, self._log_head = attach(fds[-1], True), read_log, 0, 0
        for arena in getattr(reply, "gone", ()):
            opened = self._arenas.pop(arena, None)
            if opened is not None:
                self._device_mapper().close(*opened)
        self._note_retired(getattr(reply, "retired", ()))
        return reply

    def _call_bound(self, request: bytes) -> tuple[P.Reply, list[int]]:
        """Send ``request`` while a ``Bind``'s reply is still unread, then read both (one round trip):
        a refused Bind is the error raised, after its request's own answer is read and dropped."""
        try:
            self._settle_bind(request)
        except (DaemonUnavailable, ProtocolError):
            raise
        except GfaasError:
            try:
                _, stray = self._ch.recv()  # this request's answer (refused too: no credentials)
                for fd in stray:
                    os.close(fd)
            except GfaasError:
                pass
            raise
        return self._ch.recv()

    def _note_retired(self, retired: Any) -> None:
        """The daemon retired these segments: forget what points into them and let their mappings go."""
        for seg in retired:
            # The reply may name a segment retired while it was being answered (a get that read the
            # last live object of a slab): the mapping stays valid, so keep it for this one call.
            self._read.pop(seg, None)
            gone = self._local.pop(seg, None)
            if gone is not None:
                self._forget_local(gone)
            for key in ((seg, False), (seg, True)):
                self._populated.discard(key)
                mm = self._maps.pop(key, None)
                if mm is not None:
                    self._retiring[key] = mm
            if seg == self._arena_seg:
                self._arena, self._arena_seg, self._arena_map = None, -1, None

    def _device_mapper(self) -> DeviceMapper:
        if self._mapper is None:
            self._mapper = process_mapper()
        return self._mapper

    def _device_view_died(self, seg: int, device: int, gen: int) -> None:
        """A device view's finalizer: its block may still be read by kernels queued on this
        thread's stream, so mark that point; the release waits for it (_flush_device_dropped)."""
        token = None
        try:
            token = self._device_mapper().mark(device)
        finally:
            if gen == self._gen:  # as _view_died
                self._device_dropped.append((seg, device, token))

    def _flush_device_dropped(self, wait: bool = False) -> None:
        """Release the dropped device blocks whose queued work has completed (``wait``: all)."""
        mapper = self._device_mapper()
        keep = []
        for s, d, token in self._device_dropped:
            if wait:
                wait_until(lambda d=d, token=token: mapper.done(d, token), EVENT_TIMEOUT_S,  # type: ignore[misc]
                           f"the work queued on GPU {d} before its views were dropped")
                self._released.append(s)
            elif mapper.done(d, token):
                self._released.append(s)
            else:
                keep.append((s, d, token))
        self._device_dropped[:] = keep

    def _device_view(self, ref: P.DeviceRef, offset_in_seg: int, nbytes: int, dtype: str, shape: list[int],
                     readonly: bool, pin: int | None) -> DeviceView:
        """A view of bytes of a device segment: the arena is opened once per process and kept."""
        mapper = self._device_mapper()
        opened = self._arenas.get(ref.arena)
        if opened is None:
            opened = self._arenas[ref.arena] = (ref.device, mapper.open(ref.device, ref.handle))
        np_dt = np.dtype(np.uint8 if dtype == RAW else dtype)
        view = DeviceView(mapper, ref.device, opened[1] + ref.offset + offset_in_seg, nbytes, np_dt,
                          tuple(shape), readonly)
        if pin is not None:
            weakref.finalize(view, self._device_view_died, pin, ref.device, self._gen)
        return view

    def _populate_once(self, mm: mmap.mmap, seg: int, writable: bool, offset: int, nbytes: int) -> None:
        """Fault a large object's pages into this process's mapping in one call, unless the whole
        mapping was populated before (it keeps its pages while the segment lives)."""
        key = (seg, writable)
        if key in self._populated:
            return
        _populate(mm, offset, nbytes, _MADV_POPULATE_WRITE if writable else _MADV_POPULATE_READ)
        if offset == 0 and nbytes >= len(mm) - mmap.PAGESIZE:
            self._populated.add(key)

    def _map(self, seg: int, writable: bool) -> mmap.mmap:
        mm = self._maps.get((seg, writable))
        if mm is None:
            mm = self._retiring.get((seg, writable))
        if mm is None:
            raise ProtocolError(f"segment {seg} was never sent by the daemon; reconnect")
        return mm

    # ---- API -----------------------------------------------------------------------------------
    def put(self, obj: Any, consumers: list[str] | None = None) -> DataRef:
        """Store an immutable copy of ``obj`` and return its reference.

        ``consumers`` lists the functions of this invocation that will read it; the object is freed
        once each has read it. ``None`` opens it to the whole invocation until deleted or the
        invocation ends.
        """
        if self._bind_pending:
            self._settle_bind()  # its slab, IDs and the invocation's functions
        if type(obj) is np.ndarray:
            # The common case, a small host array of a plain dtype for readers seen before, without
            # the general checks below (every condition they would check is checked here).
            fast = self._put_plans.get(consumers if consumers is None else tuple(consumers)) \
                if consumers is None or type(consumers) is list else None
            if fast is not None:
                ref = self._put_fast(obj, fast)
                if ref is not None:
                    return ref
            if obj.dtype.str in _ITEMSIZE and obj.flags.c_contiguous:
                known = self._known_consumers(consumers)
                if (known is None or isinstance(known, list)) and obj.nbytes <= self.small_object_max:
                    return self._put_small(obj, obj.nbytes, obj.dtype.str, known)
        cons = list(consumers) if consumers is not None else None
        check_consumers(cons, self.functions)
        gpu = device_of(obj)
        if gpu is not None and gpu in self.devices:
            return self._put_device(obj, gpu, cons)
        arr, dt = _as_array(obj)  # host data, or a GPU this node has no pool for: through host memory
        n = arr.nbytes
        if n > self.small_object_max:
            ref = self._derive(arr, dt, cons)
            if ref is not None:
                return ref
            buf = self._allocate(n, dt, list(arr.shape), cons)
            copy_bytes(as_bytes(buf.array), as_bytes(arr))
            return buf.seal()
        return self._put_small(arr, n, dt, cons)

    def _known_consumers(self, consumers: Any) -> list[str] | None | bool:  # (False: unknown)
        """``consumers`` as a list already checked against the invocation's functions, None for
        None, or False when it was never seen (the caller checks it the general way)."""
        if consumers is None:
            return None
        try:
            return self._consumer_lists.get(tuple(consumers), False)
        except TypeError:  # unhashable entries: not function names
            return False

    def _put_fast(self, arr: np.ndarray, plan: tuple[list[str] | None, bytes, bool]) -> DataRef | None:
        """:meth:`_put_small` for an object that fits the slab as it is (no lease, no fresh pages, an
        ID at hand, described in the directory, sealed from there); None if anything is otherwise."""
        code = DTYPE_CODE.get(arr.dtype.str)
        n = arr.nbytes
        ndim = arr.ndim
        if code is None or not 0 < n <= self.small_object_max or ndim > DIR_MAX_NDIM \
                or not arr.flags.c_contiguous:
            return None
        off = (self._next + 63) & -64
        arena, ids, mm = self._arena, self._ids, self._arena_map
        if arena is None or mm is None or off + n > self._faulted_to or off + n > len(arena) or not ids \
                or ids[-1][1] < 0 or not self._directory_seals:
            return None
        oid, slot = ids.pop()
        arena[off : off + n] = memoryview(arr).cast("B")  # type: ignore[arg-type]
        self._next = off + n
        self.slab_used = True
        dims = (*arr.shape, 0, 0, 0, 0)
        DIR.pack_into(mm, self._dir_at + slot * DIR_ENTRY, n, oid, code, ndim, plan[2], dims[0], dims[1],
                      dims[2], dims[3], plan[1], off + 1)
        self._ch.check()  # a put to a daemon that died fails, as a send would
        self._unsynced = self._unsealed = True
        return DataRef.trusted(oid, self.node_id)

    def _put_small(self, arr: np.ndarray, n: int, dt: str, cons: list[str] | None) -> DataRef:
        """Pack a small host object into this connection's slab and send its seal, not waiting."""
        key = tuple(cons) if cons is not None else None
        if key not in self._put_plans and len(self._put_plans) < 256 and self._describable([], 0, cons):
            mask = self._masks[key]
            assert mask is not None
            self._put_plans[key] = (cons, mask, cons is None)  # cons: checked by put
        if cons is not None and len(self._consumer_lists) < 256:
            self._consumer_lists.setdefault(tuple(cons), cons)
        off = align(self._next)
        if self._arena is None or off + n > len(self._arena):
            off = self._lease(n)
        if not self._ids:
            r2 = self._call(P.MoreIds(256))
            assert isinstance(r2, P.Ids)
            self._ids = self._slotted(r2.ids, r2.first_slot) + self._ids
            if self._directory_seals and self._dir_at >= 0 and r2.first_slot < 0:
                off = self._lease(n)  # the directory is full: a fresh slab (the IDs move with it)
        arena = self._arena
        assert arena is not None
        if off + n > self._faulted_to:
            # Fault the slab in ahead of the bump pointer, one system call for many pages instead of
            # a page fault per fresh 4 KiB page inside every put. The stride starts small and doubles
            # up to _SLAB_PREFAULT, so a connection that stores one object (a function serving one
            # task) does not pay for faulting in 256 KiB it never uses.
            mm = self._maps[(self._arena_seg, True)]
            end = min(len(arena), max(off + n, self._faulted_to + self._ahead))
            _populate(mm, self._faulted_to, end - self._faulted_to, _MADV_POPULATE_WRITE, minimum=0)
            self._faulted_to = end
            self._ahead = min(2 * self._ahead, _SLAB_PREFAULT)
        shape = [n] if dt == RAW else list(arr.shape)
        described = self._describable(shape, n, cons)
        if not described and self._directory_seals:
            # The daemon seals small puts from the directory, which cannot describe this one (over 4
            # dimensions, or a reader beyond the 128th function): allocate it, as a large one.
            buf = self._allocate(n, dt, shape, cons)
            np.copyto(buf.array, arr.view(buf.array.dtype).reshape(buf.array.shape), casting="no")
            return buf.seal()
        oid, slot = self._ids.pop()
        arena[off : off + n] = arr.reshape(-1).view(np.uint8).data if n else b""
        self._next = off + n
        self.slab_used = True
        if slot >= 0 and self._arena_map is not None:
            self._describe(self._arena_map, self._dir_at + slot * DIR_ENTRY, oid, off, n, dt, shape, cons,
                           described)
            sent = not self._directory_seals
        else:
            sent = True
        if sent:  # no directory, or the daemon does not seal from it (it publishes to other nodes)
            if self._released:
                self._flush_released()
            self._ch.send(P.Seal(oid, off, n, dt, shape, cons))
        else:
            self._ch.check()  # a put to a daemon that died fails, as a send would
        self._unsynced = self._unsealed = True
        return DataRef.trusted(oid, self.node_id)

    def _seal_written(self, oid: bytes) -> None:
        """Send a written object's seal without waiting (its error comes with the next call). Its
        ``Allocate`` settled any pending ``Bind``; a Bind sent since is read with the next call."""
        if self._released:
            self._flush_released()
        self._ch.send(P.SealWritten(oid))
        self._unsynced = self._unsealed = True

    def _lease(self, n: int) -> int:
        """Lease a fresh slab for objects of up to ``n`` bytes; returns where the first one goes."""
        self._arena, self._arena_seg = None, -1  # the daemon closes the old slab even if the lease fails
        r = self._call(P.Lease(n))
        assert isinstance(r, P.Leased)
        return self._use_slab(r)

    def _use_slab(self, r: P.Leased) -> int:
        """Pack small puts into the slab ``r`` names from now on (its mapping is in ``_maps``)."""
        self._arena_map = self._map(r.segment, True)
        self._arena = memoryview(self._arena_map)[: r.size]  # its directory follows
        self._arena_seg, self._next = r.segment, r.offset
        self._faulted_to = r.offset
        self._ahead = _SLAB_PREFAULT_FIRST
        self._dir_at = r.size if r.first_slot >= 0 else -1
        if r.first_slot >= 0:  # every ID the connection holds, now in this slab's directory slots
            self._ids = self._slotted(r.ids, r.first_slot)
        else:
            self._ids = self._slotted(r.ids, -1) + self._ids
        return r.offset

    def _describable(self, shape: list[int], n: int, cons: list[str] | None) -> bool:
        key = tuple(cons) if cons is not None else None
        mask = self._masks.get(key, b"")
        if mask == b"":
            mask = self._masks[key] = self._mask(cons)
        return not (mask is None or len(shape) > DIR_MAX_NDIM or n >= _U32 or any(d >= _U32 for d in shape))

    @staticmethod
    def _slotted(ids: list[bytes], first: int) -> list[tuple[bytes, int]]:
        return [(oid, first + i if first >= 0 else -1) for i, oid in enumerate(ids)][::-1]

    def _describe(self, mm: mmap.mmap, at: int, oid: bytes, off: int, n: int, dt: str, shape: list[int],
                  cons: list[str] | None, described: bool) -> None:
        """Write the directory entry of a small object just put (slabindex.py); the offset goes last."""
        if not described:
            DIR.pack_into(mm, at, 0, oid, 0, _NOT_LOCAL, 0, 0, 0, 0, 0, bytes(16), off + 1)
        else:
            mask = self._masks[tuple(cons) if cons is not None else None]
            assert mask is not None
            dims = (*shape, 0, 0, 0, 0)
            DIR.pack_into(mm, at, n, oid, DTYPE_CODE[dt], len(shape), cons is None, dims[0], dims[1], dims[2],
                          dims[3], mask, off + 1)

    def _mask(self, cons: list[str] | None) -> bytes | None:
        """The readers as a bitmask over the invocation's functions; None if one is beyond it."""
        bits = bytearray(16)
        for c in cons or ():
            i = self.functions.index(c)
            if i >= DIR_MAX_FUNCTIONS:
                return None
            bits[i // 8] |= 1 << (i % 8)
        return bytes(bits)

    def _scan(self) -> None:
        """Note the IDs written into the directories of the slabs read locally since the last scan."""
        found = self._local_ids
        for slab in self._local.values():
            data, at, i = slab.data, slab.dir_at, slab.scanned
            while i < slab.slots:
                e = at + i * DIR_ENTRY
                if data[e + DIR_COMMIT : e + DIR_ENTRY] == _ZERO8:
                    break
                found[data[e + DIR_ID : e + DIR_ID + 16]] = (slab, i)
                i += 1
            slab.scanned = i

    def _note_read(self, oid: bytes) -> None:
        """Tell the daemon this connection read ``oid`` (it counts it as a get): in the read log if
        there is room (no system call; the daemon looks there soon and before it answers anyone
        about it), else in a ``Consumed`` message."""
        log_map, tail = self._log, self._log_tail
        if log_map is not None and tail - self._log_head >= self._log_cap:
            self._log_head = int.from_bytes(log_map[8:16], "little")  # how far the daemon has read
        if log_map is not None and tail - self._log_head < self._log_cap:
            at = LOG_HEADER + (tail % self._log_cap) * 16
            log_map[at : at + 16] = oid
            self._log_tail = tail + 1
            log_map[0:8] = (tail + 1).to_bytes(8, "little")
        else:
            if self._released:
                self._flush_released()
            self._ch.send(P.Consumed([oid]))
        self._unsynced = True

    def _forget_local(self, slab: _LocalSlab) -> None:
        """Stop reading a slab locally and drop what points into it, so its mapping can go."""
        slab.dead = True
        self._local.pop(slab.seg, None)
        self._local_ids = {k: v for k, v in self._local_ids.items() if v[0] is not slab}

    def _get_local(self, oid: bytes) -> Any:
        """A small object of a slab this connection maps, read without asking the daemon; None when
        anything is not as it should be (the caller then asks the daemon, which has the answer)."""
        hit = self._local_ids.pop(oid, None)
        if hit is None:
            self._scan()
            hit = self._local_ids.pop(oid, None)
            if hit is None:
                return None
        slab, slot = hit
        ix = slab.index
        if slab.dead or ix[0] != 1:
            self._forget_local(slab)  # retired, or its invocation ended
            return None
        at = INDEX_HEADER + slot * INDEX_ENTRY
        if ix[at + 16] != LIVE or ix[at : at + 16] != oid:
            return None  # not issued for this slot, or freed
        n, eid, code, ndim, everyone, d0, d1, d2, d3, mask, commit = DIR.unpack_from(
            slab.data, slab.dir_at + slot * DIR_ENTRY)
        if eid != oid or ndim > DIR_MAX_NDIM or code >= len(DTYPES):
            return None
        if not everyone:
            me = self._my_bit
            if me is None or not mask[me[0]] & me[1]:
                return None  # not a declared reader: the daemon gives the precise answer
        off = commit - 1
        if off < 0 or off + n > slab.dir_at:
            return None
        shape = (d0, d1, d2, d3)[:ndim]
        count = 1
        for d in shape:
            count *= d
        if count * _ITEMSIZES[code] != n:
            return None
        self._note_read(oid)
        if code == 0:
            return memoryview(np.frombuffer(slab.data, np.uint8, n, off))  # type: ignore[arg-type]
        view = np.frombuffer(slab.data, _NP_DTYPES[code], count, off)
        return view if ndim == 1 else view.reshape(shape)

    def _put_device(self, obj: Any, gpu: int, cons: list[str] | None) -> DataRef:
        """A device tensor goes into its GPU's pool with one device-to-device copy (functions never
        own the store's memory)."""
        ptr, shape, dt = cuda_interface(obj)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        buf = self._allocate_device(n, dt.str, list(shape), cons, gpu)
        mapper = self._device_mapper()
        stream = mapper.stream_of(obj)  # the tensor's pending writes are on its stream: copy after them
        if n:
            mapper.copy(gpu, buf.view.ptr, ptr, n, stream)
        return buf.seal(stream)

    def _derive(self, arr: np.ndarray, dt: str, cons: list[str] | None) -> DataRef | None:
        """A put of a slice of an object this connection read (e.g. one chunk of an input clip)
        is published by reference to the bytes already in shared memory: no copy. ``None`` when
        ``arr`` lies elsewhere, or the daemon says the bytes are no longer held."""
        if not self._read or not arr.flags.c_contiguous:
            return None
        addr, n = arr.__array_interface__["data"][0], arr.nbytes
        for seg, (start, offset, size) in self._read.items():
            if start <= addr and addr + n <= start + size:
                try:
                    r = self._call(P.Derive(seg, offset + addr - start, n, dt,
                                            [n] if dt == RAW else list(arr.shape), cons))
                except AccessDenied:
                    self._read.pop(seg, None)  # its views are gone: copy instead
                    return None
                assert isinstance(r, P.Derived)
                return DataRef(r.id, self.node_id)
        return None

    def allocate(self, shape: int | tuple[int, ...] | list[int], dtype: Any = np.uint8,
                 consumers: list[str] | None = None, device: int | None = None) -> Any:
        """Reserve space to write an object in place (zero-copy put); call ``.seal()`` when done.

        Returns a :class:`Buffer` (host memory) or, with ``device=k``, a :class:`DeviceBuffer` in
        GPU ``k``'s pool of the node."""
        if self._bind_pending:
            self._settle_bind()
        shp = (shape,) if isinstance(shape, int) else tuple(shape)
        dt = np.dtype(dtype)
        if dt.hasobject or dt.fields is not None:
            raise ConfigError(f"cannot allocate dtype {dt}; use a numeric or bool dtype")
        n = int(np.prod(shp, dtype=np.int64)) * dt.itemsize
        cons = list(consumers) if consumers is not None else None
        check_consumers(cons, self.functions)
        if device is not None:
            if not isinstance(device, int) or device < 0:
                raise ConfigError(f"device={device!r}: give a GPU ordinal (0, 1, ...) or None for host memory")
            return self._allocate_device(n, dt.str, list(shp), cons, device)
        return self._allocate(n, dt.str, list(shp), cons)

    def _allocate_device(self, n: int, dt: str, shape: list[int], cons: list[str] | None,
                         device: int) -> DeviceBuffer:
        r = self._call(P.Allocate(n, dt, [n] if dt == RAW else shape, cons, device))
        assert isinstance(r, P.Allocated)
        if r.device is None:
            raise ProtocolError("the daemon placed a device allocation in host memory")
        view = self._device_view(r.device, r.offset, n, dt, [n] if dt == RAW else shape, False,
                                 r.segment if r.pin else None)
        return DeviceBuffer(self, r.id, view)

    def _allocate(self, n: int, dt: str, shape: list[int], cons: list[str] | None) -> Buffer:
        r = self._call(P.Allocate(n, dt, [n] if dt == RAW else shape, cons))
        assert isinstance(r, P.Allocated)
        mm = self._map(r.segment, True)
        if r.segment == self._arena_seg:
            self._next = r.offset + n
        else:
            self._populate_once(mm, r.segment, True, r.offset, n)
        np_dt = np.dtype(np.uint8 if dt == RAW else dt)
        if r.pin:
            arr = self._pinned_view(mm, r.segment, r.offset, n).view(np_dt).reshape(shape)
        else:
            arr = np.frombuffer(mm, dtype=np_dt, count=n // np_dt.itemsize, offset=r.offset).reshape(shape)
        return Buffer(self, r.id, arr, dt == RAW)

    def get(self, ref: DataRef | str, copy: bool = False, out: Any = None, device: int | str | None = None,
            deadline_s: float | None = None) -> Any:
        """Read an object.

        ``device`` says where the reader wants it: ``None`` where it lives, ``"host"`` in host
        memory, ``k`` on GPU ``k`` (a copy is delivered there if it lives elsewhere: host<->GPU
        through the node's pinned ring, GPU<->GPU over the peer link). An object on a GPU comes
        back as a read-only :class:`DeviceView` (``__cuda_array_interface__``, DLPack), after this
        process's current stream was made to wait for the producer's writes.

        By default a read-only zero-copy view (a numpy array, or a memoryview for bytes). With
        ``copy=True`` a private writable copy (numpy array, or bytes). With ``out=`` a writable,
        C-contiguous buffer of exactly the object's size (e.g. a reused input array): the bytes are
        copied into it and it is returned; a size mismatch raises ``ConfigError`` and the read is
        not counted.

        ``deadline_s``: how many seconds from now the reader can wait for a copy onto another tier
        (the runtime passes what its function's SLO leaves); concurrent copies through a GPU's
        ring share the link by their deadlines. ``None``: best effort.
        """
        if deadline_s is not None and not (isinstance(deadline_s, int | float) and deadline_s >= 0
                                           and deadline_s != float("inf")):
            raise ConfigError(f"deadline_s={deadline_s!r}: give seconds >= 0, or None for no deadline")
        if self.attached and type(device) is int and not copy and out is None \
                and (self._bind_pending or self._prefetched):
            # A GPU reader's input handed over located with its task's Bind: no round trip (the Bound
            # reply is read now if it was not yet: it came while the task travelled to this worker).
            view = self._get_prefetched(ref, device)
            if view is not None:
                return view
        if self._local and not copy and out is None and device is None and not self._unsealed \
                and not self._bind_pending:
            # A small object of a slab this connection maps: read without asking the daemon.
            oid = ref.id if type(ref) is DataRef else None
            local = self._get_local(oid) if oid is not None else None
            if local is not None:
                return local
        ref = DataRef.parse(ref) if isinstance(ref, str) else ref
        if not isinstance(ref, DataRef):
            raise ConfigError(f"get needs a DataRef or its string, got {type(ref).__name__}")
        dst: memoryview | None = None
        if out is not None:
            try:
                dst = memoryview(out).cast("B")
            except TypeError as exc:
                raise ConfigError(f"out= must be a writable C-contiguous buffer ({exc})") from None
            if dst.readonly:
                raise ConfigError("out= is read-only; pass a writable buffer")
        if device is None:
            where = P.HOST if (copy or dst is not None) else P.ANY_DEVICE  # copies land in host memory
        elif device == "host":
            where = P.HOST
        elif isinstance(device, int) and not isinstance(device, bool) and device >= 0:
            if copy or dst is not None:
                raise ConfigError("copy= and out= read into host memory; drop them to get onto a GPU")
            where = device
        else:
            raise ConfigError(f"device={device!r}: use None (where it lives), 'host' or a GPU ordinal")
        r = self._call(P.Get(ref.id, dst.nbytes if dst is not None else -1, where, float(deadline_s or 0.0)))
        assert isinstance(r, P.Located)
        if r.device is not None:
            view = self._device_view(r.device, r.offset, r.nbytes, r.dtype, r.shape, True,
                                     r.segment if r.pin else None)
            if r.event:  # the producer's writes: this process's stream waits, the host does not
                self._device_mapper().wait(r.device.device, r.event)
            return view
        mm = self._map(r.segment, False)
        if copy or dst is not None:
            self._populate_once(mm, r.segment, False, r.offset, r.nbytes)
            src = np.frombuffer(mm, np.uint8, r.nbytes, r.offset)
            if dst is not None:
                copy_bytes(np.frombuffer(dst, np.uint8), src)
                out_obj: Any = out
            elif r.dtype == RAW:
                out_obj = src.tobytes()
            else:
                out_obj = _private_array(tuple(r.shape), np.dtype(r.dtype), r.nbytes)
                copy_bytes(as_bytes(out_obj), src)
            del src
            if r.pin:
                self._released.append(r.segment)  # the copy is done: nothing of ours points there
            return out_obj
        if r.pin:
            raw = self._pinned_view(mm, r.segment, r.offset, r.nbytes)
            if r.nbytes:
                self._read[r.segment] = (raw.__array_interface__["data"][0], r.offset, r.nbytes)
        else:
            raw = np.frombuffer(memoryview(mm)[r.offset : r.offset + r.nbytes], np.uint8)
        if r.dtype == RAW:
            return memoryview(raw)  # type: ignore[arg-type]  # slices keep ``raw``, hence the pin, alive
        return raw.view(np.dtype(r.dtype)).reshape(r.shape)

    def _get_prefetched(self, ref: DataRef | str, device: int) -> Any:
        """The view of a prefetched GPU object (Bound.located) if it lives on GPU ``device``, or None."""
        if self._bind_pending:
            self._settle_bind()
        try:
            oid = ref.id if isinstance(ref, DataRef) else DataRef.parse(ref).id
        except (GfaasError, ValueError):
            return None  # the daemon's get gives the precise error
        r = self._prefetched.get(oid)
        if r is None or r.device is None or device != r.device.device:
            return None
        del self._prefetched[oid]
        self.prefetched_gets += 1
        view = self._device_view(r.device, r.offset, r.nbytes, r.dtype, r.shape, True, r.segment if r.pin else None)
        if r.event:  # the producer's writes: this process's stream waits, the host does not
            self._device_mapper().wait(r.device.device, r.event)
        return view

    def delete(self, ref: DataRef | str) -> None:
        """Free an object now (only its producer may)."""
        ref = DataRef.parse(ref) if isinstance(ref, str) else ref
        self._call(P.Delete(ref.id))

    def close(self) -> None:
        """Close the connection; views already returned stay valid.

        Puts of small objects do not wait for the daemon: if any were made since the last reply,
        one round trip first makes sure they all went through, and the error of one that did not
        is raised here (after the connection is closed)."""
        try:
            if self._device_dropped and self._ch.sock is not None:
                self._flush_device_dropped(wait=True)
                self._call(P.Sync())
            if self._unsynced and self._ch.sock is not None:
                self._call(P.Sync())
        except DaemonUnavailable:
            pass  # the daemon is gone: its objects are lost, which its restart reports (DataLost)
        finally:
            self._close()

    def _close(self) -> None:
        # Close this client's arena references before the daemon learns it left (the channel's
        # close), which may let the daemon free them; the process's other clients keep theirs.
        arenas, self._arenas = self._arenas, {}
        for device, base in arenas.values():
            self._device_mapper().close(device, base)
        self._ch.close()
        self._maps.clear()
        self._populated.clear()
        self._retiring.clear()
        self._read.clear()
        self._local.clear()
        self._local_ids.clear()
        self._log = None
        self._arena = self._arena_map = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(credentials: Credentials | None = None, *, socket_path: str | None = None,
            token: str | None = None, timeout: float | None = 60.0,
            device_mapper: DeviceMapper | None = None, sock: socket.socket | None = None) -> Client:
    """Connect a function process to its node daemon.

    Credentials come from the argument, or ``socket_path``/``token``, or the environment variables
    ``GFAAS_SOCKET`` and ``GFAAS_TOKEN`` that the platform sets for each function it starts.
    ``sock``: a connection to the daemon opened by the platform (sandboxed functions cannot open one).
    """
    if credentials is not None:
        socket_path, token = credentials.socket_path, credentials.token
    token = token or os.environ.get("GFAAS_TOKEN")
    if not token:
        raise AuthenticationError(
            "no function credentials: pass gfaas.connect(credentials) or set GFAAS_TOKEN (and GFAAS_SOCKET)"
        )
    return Client(socket_path or default_socket_path(), token, timeout, device_mapper, sock)


class Binder:
    """The platform's end of a worker's attached connection (:meth:`Admin.attach_socket`): before each
    task it sends ``Bind`` with the task's token on the very socket the worker holds, and ``Unbind``
    when the task ends; the worker reads the replies. The worker never sees a token, and holds the
    credentials only from its task's start to its end: a request it sends after the ``Unbind`` is
    read after it, so it finds none."""

    def __init__(self, sock: socket.socket, welcome: P.Welcome, socket_path: str, timeout: float = 10.0) -> None:
        self.sock: socket.socket | None = sock
        self.welcome = welcome
        self.socket_path = socket_path
        self.timeout = timeout

    def fileno(self) -> int:
        if self.sock is None:
            raise DaemonUnavailable(f"the worker's connection to {self.socket_path} is closed")
        return self.sock.fileno()

    def bind(self, token: str, lease: int = -1, ids: int = 0, prefetch: list[bytes] | None = None) -> None:
        """``prefetch``: IDs of the objects the task will read (its stored inputs); those on a GPU of
        the node come back located with the Bound reply (:class:`~gfaas.dataplane.protocol.Bind`)."""
        self._send(P.Bind(token, lease, ids, list(prefetch or ())[: P.MAX_PREFETCH]))

    def unbind(self) -> None:
        self._send(P.Unbind())

    def _send(self, msg: P._Msg) -> None:
        """Send without blocking the platform's thread for long on a connection a worker may flood."""
        if self.sock is None:
            raise DaemonUnavailable(f"the worker's connection to {self.socket_path} is closed")
        data = P.encode(msg)
        try:
            try:
                self.sock.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:
                import select

                if not select.select([], [self.sock], [], self.timeout)[1]:
                    raise DaemonUnavailable(f"the node daemon at {self.socket_path} took no request on a worker's"
                                            f" connection for {self.timeout} s") from None
                self.sock.send(data, socket.MSG_DONTWAIT)
        except OSError as exc:
            raise DaemonUnavailable(f"lost a worker's connection to the node daemon at {self.socket_path}: {exc}"
                                    ) from None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


@dataclass(frozen=True)
class InvocationHandle:
    """An open invocation: its ID and the credentials of each of its functions."""

    id: str
    workflow: str
    socket_path: str
    tokens: dict[str, str]

    def credentials(self, function: str) -> Credentials:
        if function not in self.tokens:
            raise ConfigError(f"{function!r} is not a function of this invocation; choose from {sorted(self.tokens)}")
        return Credentials(self.socket_path, self.tokens[function], self.id, function)


_END_BATCH = 1024  # invocation IDs per EndInvocations message (about 36 KiB of the 64 KiB frame)
_HINT_BYTES = 48 * 1024  # queue entries per QueueState message, by their encoded size (64 KiB frames)


class Admin:
    """The platform's handle on a node daemon: opens and ends invocations, reads statistics.

    The admin token is read from ``<state_dir>/admin.token`` (mode 0600) unless given.
    """

    def __init__(self, socket_path: str | None = None, admin_token: str | None = None,
                 state_dir: str | None = None, node_id: str = "node0", timeout: float | None = 60.0) -> None:
        self.socket_path = socket_path or default_socket_path(node_id)
        if admin_token is None:
            sd = state_dir or os.path.join(default_run_dir(), f"{node_id}.state")
            path = os.path.join(sd, "admin.token")
            try:
                # Not through a symlink, and only a 0600 file of ours (or root's): another user's
                # planted token would hand this admin connection to a daemon of theirs.
                admin_token = read_private_file(path, "admin token file", must_exist=False).decode().strip()
            except FileNotFoundError:
                raise AuthenticationError(
                    f"no admin token at {path}; pass admin_token= or the node's state_dir"
                ) from None
        self._ch = Channel(self.socket_path, timeout)
        w = self._ch.handshake(P.AdminHello(admin_token))
        assert isinstance(w, P.AdminWelcome)
        self._admin_token = admin_token  # what proves attached connections (attach)
        self.node_id = w.node_id
        self.devices: tuple[int, ...] = tuple(w.devices)  # the node's GPUs with a memory pool
        self.device_kind = w.device_kind  # "cuda", "null" (modelled GPUs) or "" (none)

    def attach_socket(self, timeout: float | None = 60.0) -> tuple[socket.socket, P.Welcome]:
        """A new function connection to the node, bound to no credentials yet (``Attach``, proved with
        the admin token, which gives it no admin rights): for a worker process, which reads its
        replies, while the platform keeps a copy to bind it per task (:class:`Binder`)."""
        ch = Channel(self.socket_path, timeout)
        w = ch.handshake(P.Attach(self._admin_token))
        assert isinstance(w, P.Welcome) and ch.sock is not None
        sock, ch.sock = ch.sock, None
        return sock, w

    def attach(self, timeout: float | None = 60.0) -> Client:
        """An attached client for the platform's own puts and gets (request inputs, results): it
        outlives invocations, and :meth:`Client.bind` gives it one invocation's credentials at a time."""
        sock, w = self.attach_socket(timeout)
        return Client(self.socket_path, None, timeout, sock=sock, welcome=w)

    def open_invocation(self, workflow: str, functions: list[str], invocation_id: str | None = None,
                        tokens: dict[str, str] | None = None) -> InvocationHandle:
        """Open an invocation of ``workflow`` and issue a token per function. For an invocation that
        spans nodes, open it on each node with the same ``invocation_id`` and ``tokens``."""
        r, _ = self._ch.call(P.OpenInvocation(workflow, list(functions), invocation_id, tokens))
        assert isinstance(r, P.InvocationOpened)
        return InvocationHandle(r.invocation_id, workflow, self.socket_path, dict(r.tokens))

    def end_invocation(self, invocation_id: str | InvocationHandle) -> int:
        """Free all objects of the invocation and revoke its tokens; returns the objects freed."""
        inv = invocation_id.id if isinstance(invocation_id, InvocationHandle) else invocation_id
        r, _ = self._ch.call(P.EndInvocation(inv))
        assert isinstance(r, P.Ended)
        return r.freed

    def end_invocations(self, invocation_ids: Iterable[str]) -> dict[str, int]:
        """End many invocations in few round trips (1,024 per message): objects freed by each one
        that was open; one that was not (ended already) is left out rather than raising."""
        ids = list(invocation_ids)
        freed: dict[str, int] = {}
        for k in range(0, len(ids), _END_BATCH):
            r, _ = self._ch.call(P.EndInvocations(ids[k : k + _END_BATCH]))
            assert isinstance(r, P.EndedMany)
            freed.update(r.freed)
        return freed

    def queue_hint(self, invocation_id: str | InvocationHandle, positions: dict[str, int],
                   done: list[str] | tuple[str, ...] = ()) -> None:
        """Tell the node where the invocation's functions wait: ``positions[f]`` requests are ahead
        of ``f`` in its queue (0: next, or running now; missing: not queued), ``done`` will not run
        again. Queue-aware eviction moves the objects whose readers are furthest back first.
        ``LocalRuntime.queue_positions(invocation)`` gives ``positions``."""
        inv = invocation_id.id if isinstance(invocation_id, InvocationHandle) else invocation_id
        r, _ = self._ch.call(P.QueueHint(inv, dict(positions), list(done)))
        assert isinstance(r, P.Ok)

    def queue_state(self, entries: Iterable[P.QueueEntry], heads: dict[str, int]) -> None:
        """Tell the node where many invocations' functions wait (:class:`~gfaas.dataplane.protocol.QueueState`:
        tickets of FIFO queues and the queues' heads), in as few messages as the frame size allows."""
        batch: list[P.QueueEntry] = []
        size = 0
        for e in entries:
            n = len(P.encode(e))
            if batch and size + n > _HINT_BYTES:
                self._queue_state(batch, heads)
                batch, size, heads = [], 0, {}
            batch.append(e)
            size += n
        if batch or heads:
            self._queue_state(batch, heads)

    def _queue_state(self, entries: list[P.QueueEntry], heads: dict[str, int]) -> None:
        r, _ = self._ch.call(P.QueueState(entries, heads))
        assert isinstance(r, P.Ok)

    def dedup_hint(self, pid: int, workflow: str, function: str, domain: str, nbytes: int) -> None:
        """Tell the node's merge controller that worker ``pid`` marked ``nbytes`` mergeable
        (:mod:`gfaas.dedup`); raises :class:`~gfaas.errors.DedupRefused` when another sharing domain
        holds KSM on the node."""
        r, _ = self._ch.call(P.DedupHint(pid, workflow, function, domain, nbytes))
        assert isinstance(r, P.Ok)

    def dedup_forget(self, pid: int) -> None:
        """The worker ``pid`` stopped: its hints no longer hold its sharing domain."""
        r, _ = self._ch.call(P.DedupForget(pid))
        assert isinstance(r, P.Ok)

    def dedup_status(self) -> dict[str, Any]:
        """The node's page-merging report (``gfaas dedup status``)."""
        import json

        r, _ = self._ch.call(P.DedupStatus())
        assert isinstance(r, P.DedupReport)
        out: dict[str, Any] = json.loads(r.report)
        return out

    def stats(self) -> dict[str, Any]:
        r, _ = self._ch.call(P.Stats())
        assert isinstance(r, P.StatsReply)
        import msgspec

        return msgspec.structs.asdict(r)

    def snapshot(self) -> dict[str, Any]:
        """The node's live figures, cheap enough to poll every second (``Snapshot``: read from counters;
        unlike :meth:`stats` nothing is settled or waited for, so a put whose seal is still queued may
        not show yet). ``{"node_id", "time", "tiers": [{"name", "bytes_live", "bytes_reserved",
        "bytes_target", "capacity_bytes", "objects", "bytes_pooled"}], "counters": {...}, "links": {...}}``
        (docs/design/node-stats.md)."""
        import msgspec

        r, _ = self._ch.call(P.Snapshot())
        assert isinstance(r, P.SnapshotReply)
        return {"node_id": r.node_id, "time": r.time, "tiers": [msgspec.structs.asdict(t) for t in r.tiers],
                "counters": dict(r.counters), "links": dict(r.links)}

    def object_info(self, ref: DataRef | str | bytes) -> dict[str, Any]:
        """Where one object on this node is: ``{"id" (hex), "invocation", "producer", "consumers",
        "readers_left", "nbytes", "dtype", "shape", "state", "tier", "age_s"}``. ``ref``: a
        :class:`DataRef`, its string form, the ID's 32 hex digits or its 16 bytes.
        :class:`~gfaas.errors.NotFound` if the node does not hold it."""
        import msgspec

        r, _ = self._ch.call(P.ObjectInfo(object_id(ref)))
        assert isinstance(r, P.ObjectInfoReply)
        out = msgspec.structs.asdict(r)
        out["id"] = r.id.hex()
        return out

    def close(self) -> None:
        self._ch.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
