"""The function side of device objects: mapping pool arenas through CUDA IPC, ordering with IPC
events, and handing tensors out through ``__cuda_array_interface__`` and DLPack.

A :class:`DeviceMapper` does the CUDA calls; :class:`CudaMapper` is the real one (CuPy, from the
``gpu`` extra). Tests on machines without a GPU pass a mapper that records the calls, so the
client's bookkeeping (one open per arena, close when the daemon says an arena is gone, wait on the
producer's event before a read) runs the same code paths.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import numpy as np

from ..errors import DependencyMissing, GfaasError


class DeviceMapper(Protocol):
    """CUDA calls a client makes for device objects (one instance per process)."""

    def open(self, device: int, handle: bytes) -> int:
        """Open an arena's IPC handle in this process; returns its base address here."""
        ...

    def close(self, device: int, base: int) -> None:
        """Close an arena opened with :meth:`open`."""
        ...

    def record(self, device: int) -> bytes:
        """Record an IPC event after the work queued so far on this process's current stream;
        returns its handle (sent with the seal)."""
        ...

    def wait(self, device: int, event: bytes) -> None:
        """Make this process's current stream wait for a recorded IPC event (no host blocking)."""
        ...

    def copy(self, device: int, dst: int, src: int, nbytes: int) -> None:
        """Queue a device-to-device copy on the current stream (a put of an existing tensor)."""
        ...

    def array(self, view: DeviceView) -> Any:
        """A framework array over the view's memory (CuPy for the real mapper)."""
        ...


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise DependencyMissing(
            "device objects need CuPy and a CUDA GPU: install the extra with pip install 'gfaas[gpu]'"
        ) from exc
    return cupy


class CudaMapper:
    """The real mapper, on CuPy's runtime bindings. Events are created once per device and
    re-recorded at every seal: a consumer that waits on a later record of the same event waits for
    more work of the producer's stream, never less, so reuse is safe."""

    def __init__(self) -> None:
        cp = _cupy()
        self._cp = cp
        self._rt = cp.cuda.runtime
        self._events: dict[int, tuple[int, bytes]] = {}
        self._opened_events: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def _stream(self) -> int:
        return int(self._cp.cuda.get_current_stream().ptr)

    def open(self, device: int, handle: bytes) -> int:
        with self._cp.cuda.Device(device):
            return int(self._rt.ipcOpenMemHandle(handle, self._rt.cudaIpcMemLazyEnablePeerAccess))

    def close(self, device: int, base: int) -> None:
        with self._cp.cuda.Device(device):
            self._rt.ipcCloseMemHandle(base)

    def record(self, device: int) -> bytes:
        with self._lock, self._cp.cuda.Device(device):
            ev = self._events.get(device)
            if ev is None:
                e = self._rt.eventCreateWithFlags(self._rt.eventInterprocess | self._rt.eventDisableTiming)
                ev = self._events[device] = (e, bytes(self._rt.ipcGetEventHandle(e)))
            self._rt.eventRecord(ev[0], self._stream())
            return ev[1]

    def wait(self, device: int, event: bytes) -> None:
        with self._lock, self._cp.cuda.Device(device):
            e = self._opened_events.get(event)
            if e is None:
                e = self._opened_events[event] = self._rt.ipcOpenEventHandle(event)
            self._rt.streamWaitEvent(self._stream(), e, 0)

    def copy(self, device: int, dst: int, src: int, nbytes: int) -> None:
        with self._cp.cuda.Device(device):
            self._rt.memcpyAsync(dst, src, nbytes, self._rt.memcpyDeviceToDevice, self._stream())

    def array(self, view: DeviceView) -> Any:
        cp = self._cp
        mem = cp.cuda.UnownedMemory(view.ptr, view.nbytes, view, view.device)
        return cp.ndarray(view.shape, view.dtype, cp.cuda.MemoryPointer(mem, 0))


class DeviceView:
    """An object in a GPU's memory pool, as this process sees it.

    Exposes ``__cuda_array_interface__`` (with the read-only flag set for objects got from the
    store) and DLPack, so ``cupy.asarray(v)``, ``torch.as_tensor(v, device='cuda')`` and
    ``torch.from_dlpack(v)`` wrap it without a copy. CUDA IPC cannot map memory read-only: the flag
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
