"""The client library used inside functions: ``connect``, ``put``, ``allocate``/``seal``, ``get``,
``delete``, and the platform-side :class:`Admin`."""

from __future__ import annotations

import logging
import mmap
import os
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import default_run_dir, default_socket_path
from ..errors import AccessDenied, AuthenticationError, ConfigError, ObjectStateError, ProtocolError
from . import protocol as P
from .backends.host import attach
from .channel import Channel
from .copy import as_bytes, copy_bytes
from .device_client import CudaMapper, DeviceMapper, DeviceView, cuda_interface, device_of
from .ids import DataRef
from .meta import RAW, align, check_consumers, itemsize

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
        """Make the object immutable and visible to its consumers; returns its reference."""
        if self._sealed:
            raise ObjectStateError(f"object {self._id.hex()} is already sealed; objects are sealed once")
        self._client._call(P.SealAllocated(self._id))
        self._sealed = True
        self.array.flags.writeable = False
        return DataRef(self._id, self._client.node_id)


class DeviceBuffer:
    """Space in a GPU's pool for an object the producer writes in place (``.view`` exposes
    ``__cuda_array_interface__``/DLPack, ``.array()`` a CuPy array); :meth:`seal` records a CUDA IPC
    event after the writes queued on the current stream and publishes the object."""

    def __init__(self, client: Client, oid: bytes, view: DeviceView) -> None:
        self._client, self._id, self.view = client, oid, view
        self._sealed = False

    @property
    def sealed(self) -> bool:
        return self._sealed

    def array(self) -> Any:
        return self.view.array()

    def seal(self) -> DataRef:
        if self._sealed:
            raise ObjectStateError(f"object {self._id.hex()} is already sealed; objects are sealed once")
        event = self._client._device_mapper().record(self.view.device)
        self._client._call(P.SealAllocated(self._id, event))
        self._sealed = True
        self.view.readonly = True
        return DataRef(self._id, self._client.node_id)


class Client:
    """A function's connection to its node daemon; see :func:`connect`."""

    def __init__(self, socket_path: str, token: str, timeout: float | None = 60.0,
                 device_mapper: DeviceMapper | None = None) -> None:
        self._mapper = device_mapper
        self._arenas: dict[int, tuple[int, int]] = {}  # arena -> (GPU, base address here)
        self._ch = Channel(socket_path, timeout)
        w = self._ch.handshake(P.Hello(token))
        assert isinstance(w, P.Welcome)
        self.node_id = w.node_id
        self.invocation_id = w.invocation_id
        self.function = w.function
        self.functions = tuple(w.functions)
        self.small_object_max = w.small_object_max
        self.devices = frozenset(w.devices)  # GPUs with a pool on this node
        self._maps: dict[tuple[int, bool], mmap.mmap] = {}
        # Writable mappings whose every page is in this process's page tables (MAP_POPULATE at
        # attach, or populated before a first write): a warm segment reused for the next large
        # put needs no second pass, which cost 10 ms per 256 MiB put (issue 12).
        self._populated: set[tuple[int, bool]] = set()
        self._retiring: dict[tuple[int, bool], mmap.mmap] = {}
        # Objects of their own segment this connection got as zero-copy views:
        # segment -> (address of the object's first byte in this process, its offset, its size).
        self._read: dict[int, tuple[int, int, int]] = {}
        self._arena: memoryview | None = None
        self._arena_seg = -1
        self._next = 0
        self._faulted_to = 0
        self._ahead = _SLAB_PREFAULT_FIRST
        self._ids: list[bytes] = []
        # Segments whose views died (see _pinned_view), told to the daemon with the next request.
        self._released: list[int] = []

    # ---- plumbing ------------------------------------------------------------------------------
    def _flush_released(self) -> None:
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
        weakref.finalize(holder, self._released.append, seg)
        return holder

    def _call(self, msg: P._Msg) -> P.Reply:
        self._flush_released()
        self._retiring.clear()
        reply, fds = self._ch.call(msg)
        if fds:
            seg = getattr(reply, "segment", None)
            if seg is None or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise ProtocolError("the daemon sent file descriptors with a reply that names no segment")
            writable = not isinstance(reply, P.Located)
            # A segment of its own for one object about to be written whole: map all of it now.
            whole = isinstance(reply, P.Allocated) and seg != self._arena_seg
            self._maps[(seg, writable)] = attach(fds[0], writable, populate=whole)
            if whole:
                self._populated.add((seg, writable))
        for arena in getattr(reply, "gone", ()):
            opened = self._arenas.pop(arena, None)
            if opened is not None:
                self._device_mapper().close(*opened)
        for seg in getattr(reply, "retired", ()):
            # The reply may name a segment retired while it was being answered (a get that read the
            # last live object of a slab): the mapping stays valid, so keep it for this one call.
            self._read.pop(seg, None)
            for key in ((seg, False), (seg, True)):
                self._populated.discard(key)
                mm = self._maps.pop(key, None)
                if mm is not None:
                    self._retiring[key] = mm
            if seg == self._arena_seg:
                self._arena, self._arena_seg = None, -1
        return reply

    def _device_mapper(self) -> DeviceMapper:
        if self._mapper is None:
            self._mapper = CudaMapper()
        return self._mapper

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
            weakref.finalize(view, self._released.append, pin)
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
        off = align(self._next)
        if self._arena is None or off + n > len(self._arena):
            self._arena, self._arena_seg = None, -1  # the daemon closes the old slab even if the lease fails
            r = self._call(P.Lease(n))
            assert isinstance(r, P.Leased)
            self._arena = memoryview(self._map(r.segment, True))
            self._arena_seg, self._next, off = r.segment, r.offset, r.offset
            self._faulted_to = r.offset
            self._ahead = _SLAB_PREFAULT_FIRST
            self._ids.extend(r.ids)
        if off + n > self._faulted_to:
            # Fault the slab in ahead of the bump pointer, one system call for many pages instead of
            # a page fault per fresh 4 KiB page inside every put. The stride starts small and doubles
            # up to _SLAB_PREFAULT, so a connection that stores one object (a function serving one
            # task) does not pay for faulting in 256 KiB it never uses.
            mm = self._maps[(self._arena_seg, True)]
            end = min(len(self._arena), max(off + n, self._faulted_to + self._ahead))
            _populate(mm, self._faulted_to, end - self._faulted_to, _MADV_POPULATE_WRITE, minimum=0)
            self._faulted_to = end
            self._ahead = min(2 * self._ahead, _SLAB_PREFAULT)
        if not self._ids:
            r2 = self._call(P.MoreIds(64))
            assert isinstance(r2, P.Ids)
            self._ids.extend(r2.ids)
        oid = self._ids.pop()
        self._arena[off : off + n] = arr.reshape(-1).view(np.uint8).data if n else b""
        self._next = off + n
        self._flush_released()
        self._ch.send(P.Seal(oid, off, n, dt, [n] if dt == RAW else list(arr.shape), cons))
        return DataRef(oid, self.node_id)

    def _put_device(self, obj: Any, gpu: int, cons: list[str] | None) -> DataRef:
        """A device tensor goes into its GPU's pool with one device-to-device copy (functions never
        own the store's memory)."""
        ptr, shape, dt = cuda_interface(obj)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        buf = self._allocate_device(n, dt.str, list(shape), cons, gpu)
        if n:
            self._device_mapper().copy(gpu, buf.view.ptr, ptr, n)
        return buf.seal()

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

    def get(self, ref: DataRef | str, copy: bool = False, out: Any = None, device: int | str | None = None) -> Any:
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
        """
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
        r = self._call(P.Get(ref.id, dst.nbytes if dst is not None else -1, where))
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

    def delete(self, ref: DataRef | str) -> None:
        """Free an object now (only its producer may)."""
        ref = DataRef.parse(ref) if isinstance(ref, str) else ref
        self._call(P.Delete(ref.id))

    def close(self) -> None:
        """Close the connection; views already returned stay valid."""
        self._ch.close()
        self._maps.clear()
        self._populated.clear()
        self._retiring.clear()
        self._read.clear()
        self._arena = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(credentials: Credentials | None = None, *, socket_path: str | None = None,
            token: str | None = None, timeout: float | None = 60.0,
            device_mapper: DeviceMapper | None = None) -> Client:
    """Connect a function process to its node daemon.

    Credentials come from the argument, or ``socket_path``/``token``, or the environment variables
    ``GFAAS_SOCKET`` and ``GFAAS_TOKEN`` that the platform sets for each function it starts.
    """
    if credentials is not None:
        socket_path, token = credentials.socket_path, credentials.token
    token = token or os.environ.get("GFAAS_TOKEN")
    if not token:
        raise AuthenticationError(
            "no function credentials: pass gfaas.connect(credentials) or set GFAAS_TOKEN (and GFAAS_SOCKET)"
        )
    return Client(socket_path or default_socket_path(), token, timeout, device_mapper)


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
                with open(path) as f:
                    admin_token = f.read().strip()
            except FileNotFoundError:
                raise AuthenticationError(
                    f"no admin token at {path}; pass admin_token= or the node's state_dir"
                ) from None
        self._ch = Channel(self.socket_path, timeout)
        w = self._ch.handshake(P.AdminHello(admin_token))
        assert isinstance(w, P.AdminWelcome)
        self.node_id = w.node_id

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

    def queue_hint(self, invocation_id: str | InvocationHandle, positions: dict[str, int],
                   done: list[str] | tuple[str, ...] = ()) -> None:
        """Tell the node where the invocation's functions wait: ``positions[f]`` requests are ahead
        of ``f`` in its queue (0: next, or running now; missing: not queued), ``done`` will not run
        again. Queue-aware eviction moves the objects whose readers are furthest back first.
        ``LocalRuntime.queue_positions(invocation)`` gives ``positions``."""
        inv = invocation_id.id if isinstance(invocation_id, InvocationHandle) else invocation_id
        r, _ = self._ch.call(P.QueueHint(inv, dict(positions), list(done)))
        assert isinstance(r, P.Ok)

    def stats(self) -> dict[str, Any]:
        r, _ = self._ch.call(P.Stats())
        assert isinstance(r, P.StatsReply)
        import msgspec

        return msgspec.structs.asdict(r)

    def close(self) -> None:
        self._ch.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
