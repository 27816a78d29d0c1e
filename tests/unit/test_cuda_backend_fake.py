"""The CUDA backend's own code against a fake CUDA runtime whose "device memory" is host memory.

No GPU here, so this cannot say anything about CUDA itself; it runs every line of
``backends/cuda.py`` (pool over ``malloc``, ring in ``hostAlloc`` memory, chunked copies on two
streams with an event per slot, D2D and peer copies, IPC handles, close) and checks the bytes.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

from gfaas.config import MiB
from gfaas.dataplane.backends import cuda


class FakeRuntime:
    memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice = 1, 2, 3
    streamNonBlocking, eventDisableTiming, eventInterprocess = 1, 2, 4

    def __init__(self, gpus: int = 2) -> None:
        self.gpus = gpus
        self.buffers: dict[int, Any] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.current = 0
        self._next = 100

    def getDeviceCount(self) -> int:
        return self.gpus

    def setDevice(self, d: int) -> None:
        self.current = d

    def memGetInfo(self) -> tuple[int, int]:
        return 1024 * MiB, 2048 * MiB

    def deviceCanAccessPeer(self, a: int, b: int) -> int:
        return 1

    def deviceEnablePeerAccess(self, peer: int) -> None:
        self.calls.append(("peer", self.current, peer))

    def _buf(self, n: int) -> int:
        b = ctypes.create_string_buffer(n)
        self.buffers[ctypes.addressof(b)] = b
        return ctypes.addressof(b)

    def malloc(self, n: int) -> int:
        self.calls.append(("malloc", self.current, n))
        return self._buf(n)

    def free(self, p: int) -> None:
        self.calls.append(("free", self.current))
        del self.buffers[p]

    hostAlloc = lambda self, n, flags: self._buf(n)  # noqa: E731
    freeHost = free

    def _id(self) -> int:
        self._next += 1
        return self._next

    def streamCreateWithFlags(self, f: int) -> int:
        return self._id()

    def eventCreateWithFlags(self, f: int) -> int:
        return self._id()

    def memcpyAsync(self, dst: int, src: int, n: int, kind: int, stream: int) -> None:
        self.calls.append(("memcpy", kind, n, stream))
        ctypes.memmove(dst, src, n)

    def memcpyPeerAsync(self, dst: int, dd: int, src: int, sd: int, n: int, stream: int) -> None:
        self.calls.append(("peer-copy", sd, dd, n))
        ctypes.memmove(dst, src, n)

    def eventRecord(self, ev: int, stream: int) -> None:
        self.calls.append(("record", ev, stream))

    def eventQuery(self, ev: int) -> int:
        return 0

    def eventSynchronize(self, ev: int) -> None:
        self.calls.append(("sync-event", ev))

    def streamSynchronize(self, s: int) -> None:
        pass

    def streamDestroy(self, s: int) -> None:
        pass

    def eventDestroy(self, e: int) -> None:
        pass

    def ipcGetMemHandle(self, p: int) -> bytes:
        return p.to_bytes(64, "little")

    def ipcOpenEventHandle(self, h: bytes) -> int:
        return int.from_bytes(h[:8], "little")


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> FakeRuntime:
    fake = FakeRuntime()
    monkeypatch.setattr(cuda, "runtime", lambda: fake)
    monkeypatch.setattr(cuda, "_current", cuda._DeviceThread())
    return fake


def _dev_bytes(seg: Any, n: int) -> bytes:
    return ctypes.string_at(seg.address, n)


def test_copies_go_through_the_ring_in_chunks_and_back(rt: FakeRuntime) -> None:
    be = cuda.CudaBackend(0, ring_bytes=10 * MiB, target_bytes=0)
    try:
        assert be.pool.cap == 512 * MiB  # half of the (fake) free memory
        assert ("peer", 0, 1) in rt.calls
        src = np.random.default_rng(3).integers(0, 256, 7 * MiB + 5, dtype=np.uint8)
        seg = be.alloc(src.nbytes)
        be.copy_in(seg, 0, memoryview(src.data))
        assert _dev_bytes(seg, src.nbytes) == src.tobytes()
        h2d = [c for c in rt.calls if c[0] == "memcpy" and c[1] == rt.memcpyHostToDevice]
        assert [c[2] for c in h2d] == [2 * MiB] * 3 + [MiB + 5]
        assert len({c[3] for c in h2d}) == 2  # two streams, alternating
        out = np.zeros_like(src)
        be.copy_out(seg, 0, src.nbytes, memoryview(out.data))
        assert np.array_equal(out, src)
        ref = be.export(seg, False)
        assert ref.handle == seg.block.base.to_bytes(64, "little") and ref.offset == 0
    finally:
        be.close()


def test_device_and_peer_transfers_and_event_waits(rt: FakeRuntime) -> None:
    g0 = cuda.CudaBackend(0, ring_bytes=10 * MiB, target_bytes=0)
    g1 = cuda.CudaBackend(1, ring_bytes=10 * MiB, target_bytes=0)
    try:
        a, b, c = g0.alloc(4096), g0.alloc(4096), g1.alloc(4096)
        g0.copy_in(a, 0, memoryview(b"\x05" * 4096))
        g0.transfer(a, 0, b, 0, 4096)
        g1.transfer(a, 0, c, 0, 4096)
        assert _dev_bytes(b, 4096) == _dev_bytes(c, 4096) == b"\x05" * 4096
        assert ("peer-copy", 0, 1, 4096) in rt.calls
        g0.wait_event((77).to_bytes(64, "little"))
        g0.wait_event((77).to_bytes(64, "little"))
        assert rt.calls.count(("sync-event", 77)) == 2
    finally:
        g0.close()
        g1.close()
    assert not rt.buffers  # pools, rings: everything went back


def test_a_gpu_that_does_not_exist(rt: FakeRuntime) -> None:
    from gfaas.errors import ConfigError

    with pytest.raises(ConfigError, match="GPU 4 does not exist: this machine has 2"):
        cuda.CudaBackend(4)


def test_gpu_status_can_be_forced_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GFAAS_FORCE_NO_GPU", "1")
    assert cuda.gpu_status() == (0, "GFAAS_FORCE_NO_GPU is set")
