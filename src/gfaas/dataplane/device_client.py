"""The function side of device objects: mapping pool arenas through CUDA IPC, ordering a
producer's writes before its seal, and handing tensors out through DLPack.

A :class:`DeviceMapper` does the CUDA calls; :class:`CudaMapper` is the real one (CuPy, from the
``gpu`` extra), one per process (:func:`process_mapper`), shared by every :class:`Client` of the
process: an arena is opened once per process and closed when its last user lets go; events are
created once per GPU. Tests on machines without a GPU pass a mapper that records the calls, or a
``CudaMapper`` over the asynchronous fake runtime (``tests/support/fake_cuda.py``).

*Ordering* (docs/design/gpu-storage.md): a producer waits for its own stream's work before it
seals (:meth:`DeviceMapper.finish`), so no IPC event outlives its exporter and neither readers nor
the daemon ever wait on another process's event. A reader's released view goes back to the
daemon only once the work its stream had queued when the view died has completed
(:meth:`DeviceMapper.mark` / :meth:`DeviceMapper.done`), so a block is never reused under a
kernel still reading it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..errors import DataPlaneError, DependencyMissing, GfaasError

#: How long a producer's seal (or a daemon's copy) waits for GPU work before failing. Long enough
#: for any kernel a function queues before publishing; finite so a dead or hung producer is an error.
EVENT_TIMEOUT_S = 60.0


def wait_until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``done`` (an ``eventQuery``) until true, backing off to 1 ms between polls; a
    :class:`DataPlaneError` naming ``what`` after ``timeout_s``. Never blocks in the driver, so a
    wait on work that never completes stays bounded (``cudaEventSynchronize`` would not)."""
    if done():
        return
    end = time.monotonic() + timeout_s
    pause = 1e-5
    while not done():
        if time.monotonic() >= end:
            raise DataPlaneError(
                f"{what} did not complete within {timeout_s:g} s: the GPU work it waits for is hung or its"
                " process exited; check the producer function (or raise the timeout)")
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


class DeviceMapper(Protocol):
    """CUDA calls a client makes for device objects (one instance per process)."""

    def open(self, device: int, handle: bytes) -> int:
        """Open an arena's IPC handle in this process (once: later calls count a reference);
        returns its base address here."""
        ...

    def close(self, device: int, base: int) -> None:
        """Drop one reference taken by :meth:`open`; the last one closes the handle."""
        ...

    def finish(self, device: int, stream: int | None = None) -> None:
        """Wait (bounded, polling) until the work queued so far on ``stream`` (default: this
        thread's current stream) has completed: a producer's writes, before its seal."""
        ...

    def mark(self, device: int) -> Any:
        """Record that the work queued so far on the current stream must complete before the
        block whose view just died is reused; returns a token for :meth:`done`."""
        ...

    def done(self, device: int, token: Any = None) -> bool:
        """Whether the work of the :meth:`mark` that returned ``token`` has completed (None: no mark)."""
        ...

    def wait(self, device: int, event: bytes) -> None:
        """Make this process's current stream wait for a recorded IPC event (no host blocking)."""
        ...

    def stream_of(self, obj: Any) -> int | None:
        """The stream a tensor's pending work is on (torch: the device's current torch stream),
        ``None`` for this thread's current CuPy stream."""
        ...

    def copy(self, device: int, dst: int, src: int, nbytes: int, stream: int | None = None) -> None:
        """Queue a device-to-device copy on ``stream`` (a put of an existing tensor)."""
        ...

    def array(self, view: DeviceView) -> Any:
        """A framework array over the view's memory (CuPy for the real mapper)."""
        ...


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise DependencyMissing(
            "device objects need CuPy and a CUDA GPU: pip install 'gfaas[gpu]' (CUDA 12) or 'gfaas[gpu-cuda13]' (CUDA 13)"
        ) from exc
    return cupy


class CudaMapper:
    """The real mapper, on CuPy's runtime bindings; use :func:`process_mapper` (one per process).

    One plain event per GPU, created once, re-recorded at each :meth:`finish` (waiting on a later
    record of an event waits for more work, never less). Each :meth:`mark` records an event of its
    own, taken from the GPU's completed ones: re-recording one shared event at every view that dies
    would let a client that keeps dropping views never see its earlier drops complete (a fake CUDA
    runtime showed the H200 run's arena that was never closed this way)."""

    def __init__(self, cp: Any = None, event_timeout_s: float = EVENT_TIMEOUT_S) -> None:
        cp = cp if cp is not None else _cupy()
        self._cp = cp
        self._rt = cp.cuda.runtime
        self.event_timeout_s = event_timeout_s
        self._opened: dict[tuple[int, bytes], list[int]] = {}  # (GPU, handle) -> [base, references]
        self._handles: dict[tuple[int, int], bytes] = {}  # (GPU, base) -> handle
        self._events: dict[tuple[int, str], int] = {}
        self._opened_events: dict[bytes, int] = {}
        self._free_marks: dict[int, set[int]] = {}  # GPU -> mark events whose work completed
        self._lock = threading.Lock()

    def _stream(self) -> int:
        return int(self._cp.cuda.get_current_stream().ptr)

    def _event(self, device: int, role: str) -> int:
        e = self._events.get((device, role))
        if e is None:
            e = self._events[(device, role)] = int(self._rt.eventCreateWithFlags(self._rt.eventDisableTiming))
        return e

    def open(self, device: int, handle: bytes) -> int:
        with self._lock:
            got = self._opened.get((device, handle))
            if got is None:
                with self._cp.cuda.Device(device):
                    base = int(self._rt.ipcOpenMemHandle(handle, self._rt.cudaIpcMemLazyEnablePeerAccess))
                got = self._opened[(device, handle)] = [base, 0]
                self._handles[(device, base)] = handle
            got[1] += 1
            return got[0]

    def close(self, device: int, base: int) -> None:
        with self._lock:
            handle = self._handles.get((device, base))
            if handle is None:
                return  # not open (a stale close)
            got = self._opened[(device, handle)]
            got[1] -= 1
            if got[1] > 0:
                return
            del self._opened[(device, handle)], self._handles[(device, base)]
            with self._cp.cuda.Device(device):
                self._rt.ipcCloseMemHandle(base)

    def finish(self, device: int, stream: int | None = None) -> None:
        with self._lock, self._cp.cuda.Device(device):
            e = self._event(device, "finish")
            self._rt.eventRecord(e, self._stream() if stream is None else stream)
        wait_until(lambda: int(self._rt.eventQuery(e)) == 0, self.event_timeout_s,
                   f"the writes queued on GPU {device} before a seal")

    def mark(self, device: int) -> int:
        with self._lock, self._cp.cuda.Device(device):
            free = self._free_marks.get(device)
            e = free.pop() if free else int(self._rt.eventCreateWithFlags(self._rt.eventDisableTiming))
            self._rt.eventRecord(e, self._stream())
            return e

    def done(self, device: int, token: Any = None) -> bool:
        if token is None:
            return True
        if int(self._rt.eventQuery(token)) != 0:
            return False
        with self._lock:  # reusable: whoever records it next waits for its own work only
            self._free_marks.setdefault(device, set()).add(token)
        return True

    def wait(self, device: int, event: bytes) -> None:
        with self._lock, self._cp.cuda.Device(device):
            e = self._opened_events.get(event)
            if e is None:
                e = self._opened_events[event] = self._rt.ipcOpenEventHandle(event)
            self._rt.streamWaitEvent(self._stream(), e, 0)

    def stream_of(self, obj: Any) -> int | None:
        torch = sys.modules.get("torch")  # a torch tensor means torch is imported already
        if torch is not None and isinstance(obj, torch.Tensor):
            return int(torch.cuda.current_stream(obj.device).cuda_stream)
        return None  # CuPy queues an array's work on the thread's current stream

    def copy(self, device: int, dst: int, src: int, nbytes: int, stream: int | None = None) -> None:
        with self._cp.cuda.Device(device):
            self._rt.memcpyAsync(dst, src, nbytes, self._rt.memcpyDeviceToDevice,
                                 self._stream() if stream is None else stream)

    def array(self, view: DeviceView) -> Any:
        cp = self._cp
        mem = cp.cuda.UnownedMemory(view.ptr, view.nbytes, view, view.device)
        return cp.ndarray(view.shape, view.dtype, cp.cuda.MemoryPointer(mem, 0))


_process_mapper: CudaMapper | None = None
_process_lock = threading.Lock()


def process_mapper() -> CudaMapper:
    """This process's :class:`CudaMapper`, created on first use and shared by every client."""
    global _process_mapper
    with _process_lock:
        if _process_mapper is None:
            _process_mapper = CudaMapper()
        return _process_mapper


def as_torch(view: DeviceView) -> Any:
    """A torch tensor over ``view``'s memory, without a copy, through DLPack.

    Not ``torch.as_tensor(view)``: that reads ``__cuda_array_interface__`` and refuses the
    read-only flag every store object carries. Treat the tensor as read-only (CUDA IPC cannot
    enforce it)."""
    try:
        import torch
    except ImportError as exc:
        raise DependencyMissing("as_torch needs torch; install the extra with pip install 'gfaas[torch]'") from exc
    return torch.from_dlpack(view)


class DeviceView:
    """An object in a GPU's memory pool, as this process sees it.

    Exposes DLPack and ``__cuda_array_interface__`` (with the read-only flag set for objects got
    from the store), so ``cupy.asarray(v)`` and ``torch.from_dlpack(v)`` (:func:`as_torch`) wrap it
    without a copy; ``torch.as_tensor(v)`` refuses the read-only flag. CUDA IPC cannot map memory read-only: the flag
    tells well-behaved consumers, the store's immutability rests on that (docs/design/gpu-storage.md).
    """

    __slots__ = ("__weakref__", "_mapper", "device", "dtype", "nbytes", "ptr", "readonly", "shape")

    def __init__(self, mapper: DeviceMapper, device: int, ptr: int, nbytes: int, dtype: np.dtype[Any],
                 shape: tuple[int, ...], readonly: bool) -> None:
        self._mapper = mapper
        self.device, self.ptr, self.nbytes = device, ptr, nbytes
        self.dtype, self.shape, self.readonly = dtype, shape, readonly

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, self.readonly),
                "version": 3, "strides": None}

    def array(self) -> Any:
        """The framework array over this memory (a CuPy array with the real mapper)."""
        return self._mapper.array(self)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.array().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device)  # kDLCUDA

    def __repr__(self) -> str:
        mode = "read-only" if self.readonly else "writable"
        return f"DeviceView(cuda:{self.device}, {self.shape}, {self.dtype}, {mode}, ptr={self.ptr:#x})"


def device_of(obj: Any) -> int | None:
    """The GPU ordinal an array-like lives on (``__cuda_array_interface__`` or DLPack), else None."""
    if hasattr(obj, "__dlpack_device__"):
        kind, dev = obj.__dlpack_device__()
        return int(dev) if int(kind) == 2 else None  # kDLCUDA; pinned host memory (3) is host memory
    if hasattr(obj, "__cuda_array_interface__"):
        dev = getattr(obj, "device", None)
        return int(getattr(dev, "id", 0) if dev is not None else 0)
    return None


def cuda_interface(obj: Any) -> tuple[int, tuple[int, ...], np.dtype[Any]]:
    """``(pointer, shape, dtype)`` of a C-contiguous device array."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise GfaasError(f"a {type(obj).__name__} has no __cuda_array_interface__; pass a CuPy or torch CUDA tensor")
    shape = tuple(int(n) for n in cai["shape"])
    dt = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None:
        want, step = [], dt.itemsize
        for n in reversed(shape):
            want.append(step)
            step *= n
        if tuple(strides) != tuple(reversed(want)):
            raise GfaasError("put of a non-contiguous device tensor; call .contiguous() (torch) or"
                             " cupy.ascontiguousarray first")
    return int(cai["data"][0]), shape, dt
