"""The CUDA backend's own code against an asynchronous fake CUDA runtime (tests/support/fake_cuda.py).

No GPU here, so this cannot say anything about CUDA itself; it runs every line of
``backends/cuda.py`` (pool over ``malloc``, ring in ``hostAlloc`` memory, chunked copies on two
streams with an event per slot, D2D and peer copies, IPC handles, close) and checks the bytes. The
fake's copies complete later, on a worker thread per stream, so deleting a synchronisation point
(``ops.wait``, ``eventRecord`` in ``launch``, ``streamSynchronize`` after a D2D or peer copy) makes
these tests read stale bytes and fail.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gfaas.config import MiB
from gfaas.dataplane import device_client
from gfaas.dataplane.backends import cuda
from gfaas.dataplane.backends.device import NullDeviceBackend
from gfaas.dataplane.device_client import CudaMapper, DeviceView, as_torch, wait_until
from gfaas.errors import CapacityError, DataPlaneError

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "support"))
from fake_cuda import CUDARuntimeError, FakeArray, FakeCupy, FakeRuntime, FreedInUse  # noqa: E402


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRuntime]:
    fake = FakeRuntime()
    monkeypatch.setattr(cuda, "runtime", lambda: fake)
    monkeypatch.setattr(cuda, "_current", cuda._DeviceThread())
    yield fake
    fake.close()


def _dev_bytes(seg: Any, n: int) -> bytes:
    return ctypes.string_at(seg.address, n)


def test_copies_go_through_the_ring_in_chunks_and_back(rt: FakeRuntime) -> None:
    """Chunks reuse ring slots only after their DMA completed; D2H reads a slot only after it landed."""
    be = cuda.CudaBackend(0, ring_bytes=10 * MiB, target_bytes=0)  # 5 slots: a 23 MiB copy reuses each
    try:
        assert be.pool.cap == 512 * MiB  # half of the (fake) free memory
        assert ("peer", 0, 1) in rt.calls
        src = np.random.default_rng(3).integers(0, 256, 23 * MiB + 5, dtype=np.uint8)
        seg = be.alloc(src.nbytes)
        be.copy_in(seg, 0, memoryview(src.data))
        assert _dev_bytes(seg, src.nbytes) == src.tobytes()
        h2d = [c for c in rt.calls if c[0] == "memcpy" and c[1] == rt.memcpyHostToDevice]
        assert [c[2] for c in h2d] == [2 * MiB] * 11 + [MiB + 5]
        assert len({c[3] for c in h2d}) == 2  # two streams, alternating
        out = np.zeros_like(src)
        be.copy_out(seg, 0, src.nbytes, memoryview(out.data))
        assert np.array_equal(out, src)
        ref = be.export(seg, False)
        assert ref.handle == seg.block.base.to_bytes(64, "little") and ref.offset == 0
    finally:
        be.close()


def test_device_and_peer_transfers_complete_before_they_return(rt: FakeRuntime) -> None:
    g0 = cuda.CudaBackend(0, ring_bytes=10 * MiB, target_bytes=0)
    g1 = cuda.CudaBackend(1, ring_bytes=10 * MiB, target_bytes=0)
    try:
        a, b, c = g0.alloc(4096), g0.alloc(4096), g1.alloc(4096)
        g0.copy_in(a, 0, memoryview(b"\x05" * 4096))
        g0.transfer(a, 0, b, 0, 4096)
        assert _dev_bytes(b, 4096) == b"\x05" * 4096  # read at once: the D2D copy has completed
        g1.transfer(a, 0, c, 0, 4096)
        assert _dev_bytes(c, 4096) == b"\x05" * 4096
        assert ("peer-copy", 0, 1, 4096) in rt.calls
    finally:
        g0.close()
        g1.close()
    assert not rt.buffers  # pools, rings: everything went back


def test_closing_the_ring_waits_for_the_copies_queued_on_its_streams(rt: FakeRuntime) -> None:
    """The ring's pinned memory is freed only after the DMA queued from it has run (a copy left
    behind by a failed batch, say): the fake refuses a free under a queued copy."""
    rt.delay_s = 0.05  # the streams created next run their work this much later
    ops = cuda.CudaStagingOps(0, 4 * MiB, 2 * MiB, 2)
    dev = rt.malloc(2 * MiB)
    ops.stage_in(0, memoryview(b"\x05" * (2 * MiB)))
    ops.launch(cuda.H2D, 0, dev, 2 * MiB, 1)
    ops.close()
    assert ctypes.string_at(dev, 2 * MiB) == b"\x05" * (2 * MiB)
    rt.free(dev)
    assert not rt.buffers
    with pytest.raises(FreedInUse, match="cudaFree of 0x"):  # the fake's check itself
        src, dst = rt.malloc(64), rt.malloc(64)
        rt.memcpyAsync(dst, src, 64, rt.memcpyDeviceToDevice, 0)
        rt.free(src)


def test_a_producer_event_is_polled_with_a_bound_never_synchronised_on(rt: FakeRuntime) -> None:
    """An event whose exporter exited may never complete: the wait polls eventQuery and fails,
    naming the producer, after event_timeout_s; it never calls cudaEventSynchronize."""
    be = cuda.CudaBackend(0, ring_bytes=10 * MiB, target_bytes=0)
    try:
        ok, stuck = rt.eventCreateWithFlags(0), rt.eventCreateWithFlags(0)
        rt.stuck.add(stuck)
        rt.eventRecord(ok, 0)
        rt.eventRecord(stuck, 0)
        be.event_timeout_s = 0.2
        be.wait_event(rt.ipcGetEventHandle(ok))
        assert rt.eventQuery(ok) == 0
        with pytest.raises(DataPlaneError, match="did not complete within 0.2 s"):
            be.wait_event(rt.ipcGetEventHandle(stuck))
        assert [c for c in rt.calls if c[0] == "sync-event"] == []
        assert [c[0] for c in rt.calls].count("ipc-open-event") == 2  # each opened once
        be.wait_event(rt.ipcGetEventHandle(ok))
        assert [c[0] for c in rt.calls].count("ipc-open-event") == 2
    finally:
        be.close()


def test_cuda_out_of_memory_is_a_capacity_error(rt: FakeRuntime) -> None:
    be = cuda.CudaBackend(0, ring_bytes=10 * MiB, target_bytes=0)
    try:
        rt.oom = True
        with pytest.raises(CapacityError, match="cuda:0 is out of memory: cudaMalloc of 67108864 bytes"):
            be.alloc(4096)
        assert be.pool.held == 0  # the pool's books are untouched
        rt.oom = False
        assert be.alloc(4096).size >= 4096
        real = rt.malloc

        def other_error(n: int) -> int:
            raise CUDARuntimeError(1)  # cudaErrorInvalidValue: a bug, not a full GPU

        rt.malloc = other_error  # type: ignore[method-assign]
        with pytest.raises(CUDARuntimeError):
            be.alloc(100 * MiB)
        rt.malloc = real  # type: ignore[method-assign]
    finally:
        be.close()


@pytest.mark.parametrize("path", ["free", "trim", "set_target", "close"])
def test_a_returned_arena_is_freed_only_once_released(path: str) -> None:
    """Every path that returns an exported arena (a freed block emptying it above the target, an
    eviction's free included; trim; set_target; close) announces it (``collect_gone``) and keeps
    its memory until ``release_arena``; an arena never exported is freed at once."""
    be = NullDeviceBackend(0, cap_bytes=512 * MiB, target_bytes=512 * MiB)  # keeps empty arenas
    shared, private = be.alloc(MiB), be.alloc(65 * MiB)  # an arena each
    be.export(shared, False)
    base = shared.block.base
    if path == "free":
        be.pool.set_target(0)
        be.free(shared)
        be.free(private)
    elif path == "trim":
        be.free(shared)
        be.free(private)
        assert be.collect_gone() == []  # both kept (target)
        be.pool.target = 0
        be.pool.trim()
    elif path == "set_target":
        be.free(shared)
        be.free(private)
        be.pool.set_target(0)
    else:
        be.pool.close()
    assert be.collect_gone() == [shared.block.arena]
    assert list(be.raw) == [base]  # announced, not freed: another process may have it open
    be.release_arena(shared.block.arena)
    assert be.raw == {}
    be.close()


def test_an_arena_never_exported_is_freed_at_once() -> None:
    be = NullDeviceBackend(0, cap_bytes=512 * MiB, target_bytes=0)
    seg = be.alloc(MiB)
    be.free(seg)
    assert be.raw == {} and be.collect_gone() == []


# ---- the function side: CudaMapper over the fake --------------------------------------------
@pytest.fixture
def cp(rt: FakeRuntime) -> FakeCupy:
    return FakeCupy(rt)


def test_finish_waits_for_the_streams_work_and_is_bounded(cp: FakeCupy, rt: FakeRuntime) -> None:
    """A producer's seal returns only once the work queued before it has run; a stream whose work
    never completes is an error after the bound, not a hang."""
    m = CudaMapper(cp, event_timeout_s=0.2)
    buf = ctypes.create_string_buffer(8)
    rt.launch(0, lambda: ctypes.memmove(buf, b"written!", 8))
    m.finish(0)
    assert buf.raw == b"written!"
    m.finish(0)
    assert [c[0] for c in rt.calls].count("event-create") == 1  # created once, re-recorded
    rt.stuck.add(m._events[(0, "finish")])
    with pytest.raises(DataPlaneError, match="before a seal did not complete within 0.2 s"):
        m.finish(0)


def test_mark_and_done_follow_the_readers_stream(cp: FakeCupy, rt: FakeRuntime) -> None:
    m = CudaMapper(cp)
    assert m.done(0)  # nothing marked
    gate = threading.Event()
    rt.launch(0, gate.wait)  # a kernel still reading the block
    token = m.mark(0)
    assert not m.done(0, token)
    gate.set()
    m.finish(0)
    assert m.done(0, token)


def test_a_later_mark_never_holds_back_an_earlier_one(cp: FakeCupy, rt: FakeRuntime) -> None:
    """Each dropped view's mark has an event of its own: a client that keeps dropping views (and so
    marking) still sees each earlier drop's work complete. With one event re-recorded at every mark,
    the H200 run's two clients never released a freed 100 MiB block, and its arena stayed open."""
    m = CudaMapper(cp)
    first, second = threading.Event(), threading.Event()
    rt.launch(0, first.wait)
    early = m.mark(0)  # after the first kernel
    rt.launch(0, second.wait)
    late = m.mark(0)  # after the second
    first.set()
    wait_until(lambda: m.done(0, early), 5.0, "the first kernel")
    assert not m.done(0, late)  # the second kernel still runs
    second.set()
    wait_until(lambda: m.done(0, late), 5.0, "the second kernel")
    m.mark(0)  # a completed mark's event is used again, not a new one
    assert [c[0] for c in rt.calls].count("event-create") == 2


def test_ipc_handles_are_opened_once_per_process_and_closed_by_the_last_user(cp: FakeCupy, rt: FakeRuntime) -> None:
    m = CudaMapper(cp)
    base = rt.malloc(4096)
    h = rt.ipcGetMemHandle(base)
    assert m.open(0, h) == m.open(0, h) == base
    assert [c[0] for c in rt.calls].count("ipc-open") == 1
    m.close(0, base)
    assert ("ipc-close", 0, base) not in rt.calls  # one user left
    m.close(0, base)
    assert rt.calls.count(("ipc-close", 0, base)) == 1
    m.close(0, base)  # a stale close is ignored
    assert rt.calls.count(("ipc-close", 0, base)) == 1


def test_the_process_mapper_is_one_per_process(monkeypatch: pytest.MonkeyPatch, cp: FakeCupy) -> None:
    monkeypatch.setattr(device_client, "_process_mapper", None)
    monkeypatch.setattr(device_client, "_cupy", lambda: cp)
    assert device_client.process_mapper() is device_client.process_mapper()


class _FakeTorch(types.ModuleType):
    """torch as far as interop goes: ``as_tensor`` reads ``__cuda_array_interface__`` and refuses
    read-only memory (as torch does); ``from_dlpack`` takes the DLPack capsule."""

    class Tensor:
        pass

    def __init__(self) -> None:
        super().__init__("torch")
        self.protocols: list[str] = []

    def as_tensor(self, obj: Any, device: Any = None) -> Any:
        self.protocols.append("cai")
        if obj.__cuda_array_interface__["data"][1]:
            raise TypeError("the read only flag is not supported, should always be False")
        return obj

    def from_dlpack(self, obj: Any) -> Any:
        self.protocols.append("dlpack")
        assert obj.__dlpack_device__() == (2, 0)
        return obj.__dlpack__(stream=None)


def test_torch_gets_a_read_only_view_through_dlpack(monkeypatch: pytest.MonkeyPatch, cp: FakeCupy) -> None:
    torch = _FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    v = DeviceView(CudaMapper(cp), 0, 0x7000, 64, np.dtype(np.float32), (16,), True)
    assert as_torch(v) == ("dltensor", 0x7000, (16,))
    assert torch.protocols == ["dlpack"]
    with pytest.raises(TypeError, match="read only"):
        torch.as_tensor(v)  # what the old docs advised: refused
    assert isinstance(v.array(), FakeArray)


def test_stream_of_a_torch_tensor_is_its_current_stream(monkeypatch: pytest.MonkeyPatch, cp: FakeCupy) -> None:
    torch = _FakeTorch()
    torch.cuda = types.SimpleNamespace(current_stream=lambda dev: types.SimpleNamespace(cuda_stream=4242 + dev))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    t = torch.Tensor()
    t.device = 1  # type: ignore[attr-defined]
    m = CudaMapper(cp)
    assert m.stream_of(t) == 4243
    assert m.stream_of(object()) is None  # CuPy: the thread's current stream
