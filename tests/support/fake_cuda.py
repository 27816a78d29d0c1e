"""An asynchronous fake CUDA runtime (and the slice of CuPy gfaas uses) for CPU-only machines.

"Device memory" is host memory, so tests check bytes. Unlike a synchronous fake, work queued on a
stream runs *later*, in order, on that stream's worker thread (after ``delay_s``), as on a GPU:

* ``memcpyAsync`` / ``memcpyPeerAsync`` read their source when they run, not when queued;
* an event completes when the work queued on its stream before ``eventRecord`` has run;
  ``eventQuery`` says not-ready (600) until then; an event never recorded is complete;
* ``eventSynchronize`` / ``streamSynchronize`` block until then; ``streamWaitEvent`` makes the
  stream's later work wait for the event, without blocking the host.

So code that reads or reuses memory without waiting for the copy that fills it reads stale bytes,
which is what the tests that delete a synchronisation point rely on. ``stuck`` events never
complete (a producer whose work never finishes, or whose process exited); ``oom`` makes
``malloc`` fail as CuPy does (``CUDARuntimeError`` with status 2, cudaErrorMemoryAllocation).
``free``/``freeHost`` of memory that a queued copy has yet to read or write raise
:class:`FreedInUse`: gfaas must wait for its copies before it frees their memory, not count on an
implicit synchronisation inside the free.

Registered host memory (``hostRegister``) follows CUDA's rules: registering a range that overlaps
a registered one fails (712, cudaErrorHostMemoryAlreadyRegistered), unregistering an address that
is not a registration's start fails (713), and ``hostUnregister`` while a queued copy still uses
the range raises :class:`FreedInUse`. ``fail_register`` makes every registration fail (a page-lock
limit). Each asynchronous copy whose host side is neither ``hostAlloc`` memory nor registered is
counted in ``pageable_async``: CUDA runs it, but staged and synchronous with the host.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

NOT_READY = 600  # cudaErrorNotReady
MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation
ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered
NOT_REGISTERED = 713  # cudaErrorHostMemoryNotRegistered


class CUDARuntimeError(RuntimeError):
    """CuPy's error type, duck-typed: the CUDA status is in ``.status``."""

    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(f"cudaError {status}")


class FreedInUse(RuntimeError):
    """Memory freed while a copy queued on a stream still reads or writes it."""


class _Stream:
    def __init__(self, sid: int, delay_s: float) -> None:
        self.q: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.delay_s = delay_s
        self.thread = threading.Thread(target=self._run, name=f"fake-stream-{sid}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            op = self.q.get()
            if op is None:
                return
            time.sleep(self.delay_s)  # the GPU is busy: queued work completes later
            op()


class FakeRuntime:
    """``cupy.cuda.runtime``'s calls gfaas makes; see the module docstring."""

    memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice = 1, 2, 3
    streamNonBlocking, eventDisableTiming, eventInterprocess = 1, 2, 4
    cudaIpcMemLazyEnablePeerAccess = 1

    def __init__(self, gpus: int = 2, delay_s: float = 0.002, ipc_bytes: int = 1 << 30) -> None:
        self.gpus, self.delay_s, self.ipc_bytes = gpus, delay_s, ipc_bytes
        self.buffers: dict[int, Any] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.current = 0
        self.stuck: set[int] = set()
        self.oom = False
        self._lock = threading.Lock()
        self._next = 100
        self._streams: dict[int, _Stream] = {0: _Stream(0, delay_s)}  # 0: the legacy default stream
        self._events: dict[int, threading.Event | None] = {}
        self._ipc: dict[bytes, tuple[mmap.mmap, Any]] = {}
        self._copies = itertools.count()
        self._inflight: dict[int, tuple[int, int, int]] = {}  # queued copies: (dst, src, nbytes)
        self.pinned: dict[int, int] = {}  # hostAlloc memory: base -> size
        self.registered: dict[int, tuple[int, int]] = {}  # hostRegister: base -> (size, flags)
        self.fail_register = False
        self.pageable_async = 0

    # ---- devices and memory ----------------------------------------------------------------
    def getDeviceCount(self) -> int:
        return self.gpus

    def setDevice(self, d: int) -> None:
        self.current = d

    def memGetInfo(self) -> tuple[int, int]:
        return 1024 << 20, 2048 << 20

    def deviceCanAccessPeer(self, a: int, b: int) -> int:
        return 1

    def deviceEnablePeerAccess(self, peer: int) -> None:
        self.calls.append(("peer", self.current, peer))

    def _buf(self, n: int) -> int:
        b = ctypes.create_string_buffer(n)
        self.buffers[ctypes.addressof(b)] = b
        return ctypes.addressof(b)

    def malloc(self, n: int) -> int:
        if self.oom:
            raise CUDARuntimeError(MEMORY_ALLOCATION)
        self.calls.append(("malloc", self.current, n))
        return self._buf(n)

    def _unused(self, p: int, what: str) -> None:
        end = p + ctypes.sizeof(self.buffers[p])
        for dst, src, n in list(self._inflight.values()):
            if any(a < end and p < a + n for a in (dst, src)):
                raise FreedInUse(f"fake CUDA: {what} of {p:#x} while a queued copy still uses it")

    def free(self, p: int) -> None:
        self.calls.append(("free", self.current, p))
        self._unused(p, "cudaFree")
        del self.buffers[p]

    def hostAlloc(self, n: int, flags: int) -> int:
        p = self._buf(n)
        self.pinned[p] = n
        return p

    def freeHost(self, p: int) -> None:
        self._unused(p, "cudaFreeHost")
        del self.buffers[p]
        del self.pinned[p]

    def hostRegister(self, p: int, n: int, flags: int) -> None:
        self.calls.append(("host-register", p, n, flags))
        if self.fail_register:
            raise CUDARuntimeError(MEMORY_ALLOCATION)
        with self._lock:
            if any(b < p + n and p < b + size for b, (size, _) in self.registered.items()):
                raise CUDARuntimeError(ALREADY_REGISTERED)
            self.registered[p] = (n, flags)

    def hostUnregister(self, p: int) -> None:
        self.calls.append(("host-unregister", p))
        with self._lock:
            if p not in self.registered:
                raise CUDARuntimeError(NOT_REGISTERED)
            n = self.registered[p][0]
            for dst, src, m in list(self._inflight.values()):
                if any(a < p + n and p < a + m for a in (dst, src)):
                    raise FreedInUse(f"fake CUDA: cudaHostUnregister of {p:#x} while a queued copy still uses it")
            del self.registered[p]

    def _page_locked(self, p: int, n: int) -> bool:
        spans = [*self.pinned.items(), *((b, size) for b, (size, _) in self.registered.items())]
        return any(b <= p and p + n <= b + size for b, size in spans)

    # ---- IPC -------------------------------------------------------------------------------
    def ipcGetMemHandle(self, p: int) -> bytes:
        return p.to_bytes(64, "little")

    def ipcOpenMemHandle(self, handle: bytes, flags: int = 0) -> int:
        """The arena's memory: our own allocation if the handle names one, else (a null-GPU
        daemon's fake handle) a lazily backed region of ``ipc_bytes`` shared by every opener."""
        handle = bytes(handle)
        self.calls.append(("ipc-open", self.current, handle))
        p = int.from_bytes(handle[:8], "little")
        if p in self.buffers:
            return p
        with self._lock:
            if handle not in self._ipc:
                mm = mmap.mmap(-1, self.ipc_bytes)
                self._ipc[handle] = (mm, ctypes.c_char.from_buffer(mm))
            return ctypes.addressof(self._ipc[handle][1])

    def ipcCloseMemHandle(self, base: int) -> None:
        self.calls.append(("ipc-close", self.current, base))

    def ipcGetEventHandle(self, e: int) -> bytes:
        return e.to_bytes(64, "little")

    def ipcOpenEventHandle(self, h: bytes) -> int:
        self.calls.append(("ipc-open-event", bytes(h)))
        return int.from_bytes(bytes(h)[:8], "little")

    # ---- streams, events, copies -----------------------------------------------------------
    def _id(self) -> int:
        with self._lock:
            self._next += 1
            return self._next

    def streamCreateWithFlags(self, f: int) -> int:
        s = self._id()
        self._streams[s] = _Stream(s, self.delay_s)
        return s

    def streamDestroy(self, s: int) -> None:
        self._streams.pop(s).q.put(None)

    def _enqueue(self, stream: int, op: Callable[[], None]) -> None:
        self._streams[int(stream)].q.put(op)

    def eventCreateWithFlags(self, f: int) -> int:
        e = self._id()
        self.calls.append(("event-create", self.current, e))
        self._events[e] = None
        return e

    def eventDestroy(self, e: int) -> None:
        self._events.pop(e, None)

    def _copy(self, stream: int, dst: int, src: int, n: int) -> None:
        k = next(self._copies)
        self._inflight[k] = (dst, src, n)

        def run() -> None:
            ctypes.memmove(dst, src, n)
            del self._inflight[k]

        self._enqueue(stream, run)

    def memcpyAsync(self, dst: int, src: int, n: int, kind: int, stream: int) -> None:
        self.calls.append(("memcpy", kind, n, stream))
        host = src if kind == self.memcpyHostToDevice else dst if kind == self.memcpyDeviceToHost else None
        if host is not None and not self._page_locked(host, n):
            self.pageable_async += 1
        if kind == self.memcpyDeviceToHost and host is not None:
            for b, (size, flags) in self.registered.items():
                if b <= host < b + size and flags & 0x08:
                    raise CUDARuntimeError(1)  # cudaErrorInvalidValue: a write into read-only registered memory
        self._copy(stream, dst, src, n)

    def memcpyPeerAsync(self, dst: int, dd: int, src: int, sd: int, n: int, stream: int) -> None:
        self.calls.append(("peer-copy", sd, dd, n))
        self._copy(stream, dst, src, n)

    def launch(self, stream: int, fn: Callable[[], None]) -> None:
        """A "kernel": ``fn`` runs on ``stream`` after the work queued there before it."""
        self._enqueue(stream, fn)

    def eventRecord(self, ev: int, stream: int) -> None:
        self.calls.append(("record", ev, stream))
        done = threading.Event()
        self._events[ev] = done
        if ev not in self.stuck:
            self._enqueue(stream, done.set)

    def eventQuery(self, ev: int) -> int:
        done = self._events.get(ev)
        return 0 if done is None or done.is_set() else NOT_READY

    def eventSynchronize(self, ev: int) -> None:
        self.calls.append(("sync-event", ev))
        done = self._events.get(ev)
        if done is not None:
            done.wait()

    def streamWaitEvent(self, stream: int, ev: int, flags: int = 0) -> None:
        self.calls.append(("stream-wait", stream, ev))
        done = self._events.get(ev)
        if done is not None:
            self._enqueue(stream, done.wait)

    def streamSynchronize(self, s: int) -> None:
        done = threading.Event()
        self._enqueue(s, done.set)
        done.wait()

    def close(self) -> None:
        for s in self._streams.values():
            s.q.put(None)


class _Stream_:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class FakeCupy:
    """The part of the ``cupy`` module gfaas's mapper uses: ``cuda.runtime``, ``cuda.Device``,
    ``cuda.get_current_stream``; arrays are :class:`FakeArray`."""

    def __init__(self, rt: FakeRuntime) -> None:
        self.rt = rt
        self.cuda = self
        self.runtime = rt
        self._tls = threading.local()

    def Device(self, d: int) -> Any:  # noqa: N802 - CuPy's name
        rt = self.rt

        class _Ctx:
            def __enter__(self) -> None:
                self.prev = rt.current
                rt.current = d

            def __exit__(self, *a: Any) -> None:
                rt.current = self.prev

        return _Ctx()

    def get_current_stream(self) -> _Stream_:
        return _Stream_(getattr(self._tls, "stream", 0))

    def use_stream(self, s: int) -> None:
        """Make ``s`` this thread's current stream (CuPy: ``with stream:``)."""
        self._tls.stream = s

    def UnownedMemory(self, ptr: int, n: int, owner: Any, device: int) -> tuple[int, int, Any]:  # noqa: N802
        return (ptr, n, owner)

    def MemoryPointer(self, mem: Any, off: int) -> tuple[Any, int]:  # noqa: N802
        return (mem, off)

    def ndarray(self, shape: tuple[int, ...], dtype: Any, memptr: Any) -> FakeArray:
        return FakeArray(memptr[0][0], shape, dtype, memptr[0][2])


class FakeArray:
    """A CuPy array over device memory, as far as DLPack consumers see it."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: Any, owner: Any) -> None:
        self.ptr, self.shape, self.dtype, self.owner = ptr, shape, dtype, owner

    def __dlpack__(self, stream: Any = None, **kw: Any) -> tuple[str, int, tuple[int, ...]]:
        return ("dltensor", self.ptr, self.shape)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, getattr(self.owner, "device", 0))
