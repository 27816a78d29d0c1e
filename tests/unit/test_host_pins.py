"""Node host segments registered with CUDA (dataplane.pinned) against the asynchronous fake CUDA
runtime (tests/support/fake_cuda.py). The rule that says when a registration pays (policy.pinning)
is tested in test_pinning_rule.py; this file runs in the GPU tier too, whose image has no hypothesis.

The fake completes copies later on a stream thread and enforces CUDA's registration rules, so each
rule of ``HostPins`` has a test that fails when the rule is removed: the direct copy waits for its
DMA (stale bytes otherwise), a mapping is unregistered before it is unmapped (the fake still holds
the registration otherwise) and only after the copies through it (FreedInUse otherwise), a
read-only mapping never takes a copy into it, a failed registration is not retried.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gfaas.dataplane.backends import HostBackend, cuda, pin_host_segments
from gfaas.dataplane.pinned import PORTABLE, READ_ONLY, HostPins
from gfaas.policy.pinning import PinCosts, copies_to_pay
from gfaas.units import MiB

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "support"))
from fake_cuda import FakeRuntime  # noqa: E402

ALWAYS = PinCosts(register_gbps=1e6, register_fixed_s=0.0)  # registering is free: pays at the first copy


@pytest.fixture
def rt(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRuntime]:
    fake = FakeRuntime(delay_s=0.01)  # a copy lands 10 ms after it is queued
    monkeypatch.setattr(cuda, "runtime", lambda: fake)
    monkeypatch.setattr(cuda, "_current", cuda._DeviceThread())
    yield fake
    fake.close()


def _gpu(rt: FakeRuntime, costs: PinCosts = ALWAYS) -> tuple[cuda.CudaBackend, HostBackend, HostPins]:
    pins = HostPins(rt, costs)
    be = cuda.CudaBackend(0, ring_bytes=10 * MiB, target_bytes=0, pins=pins)
    host = HostBackend()
    pin_host_segments(host, {0: be})
    return be, host, pins


def _segment(host: HostBackend, data: np.ndarray) -> Any:
    seg = host.alloc(data.nbytes)
    host.copy_in(seg, 0, memoryview(data.data))
    return seg


def _memcpys(rt: FakeRuntime, kind: int) -> list[int]:
    return [c[2] for c in rt.calls if c[0] == "memcpy" and c[1] == kind]


def test_a_registered_segment_goes_to_the_gpu_and_back_by_one_dma_each_way(rt: FakeRuntime) -> None:
    be, host, pins = _gpu(rt)
    data = np.random.default_rng(1).integers(0, 256, 9 * MiB + 3, dtype=np.uint8)
    seg = _segment(host, data)
    dev = be.alloc(data.nbytes)
    try:
        view = host.host_view(seg)[: data.nbytes]
        be.copy_in(dev, 0, view)
        # The bytes are on the device when copy_in returns (the fake lands them 10 ms later).
        assert ctypes.string_at(dev.address, data.nbytes) == data.tobytes()
        assert _memcpys(rt, rt.memcpyHostToDevice) == [data.nbytes]  # one DMA, no 2 MiB ring chunks
        assert rt.pageable_async == 0  # its host side was page-locked
        registrations = [c for c in rt.calls if c[0] == "host-register"]
        assert len(registrations) == 1 and registrations[0][3] == PORTABLE
        back = host.alloc(data.nbytes)
        be.copy_out(dev, 0, data.nbytes, host.host_view(back)[: data.nbytes])
        assert bytes(host.host_view(back)[: data.nbytes]) == data.tobytes()
        assert _memcpys(rt, rt.memcpyDeviceToHost) == [data.nbytes]
        assert be.direct_copies == 2 and pins.stats()["registered"] == 2
        assert (be.bytes_host_direct, be.bytes_host_ring) == (2 * data.nbytes, 0)  # the daemon's stats say so
        view.release()
        host.free(back)
    finally:
        be.free(dev)
        host.free(seg)
        be.close()
    assert rt.registered == {}  # every registration ended with its segment


def test_a_warm_segment_is_registered_once_for_all_its_copies(rt: FakeRuntime) -> None:
    be, host, _ = _gpu(rt)
    data = np.arange(4 * MiB, dtype=np.uint8)
    seg = _segment(host, data)
    dev = be.alloc(data.nbytes)
    try:
        for _ in range(5):
            v = host.host_view(seg)
            be.copy_in(dev, 0, v[: data.nbytes])
            v.release()
        assert sum(1 for c in rt.calls if c[0] == "host-register") == 1
        assert _memcpys(rt, rt.memcpyHostToDevice) == [data.nbytes] * 5
    finally:
        be.free(dev)
        host.free(seg)
        be.close()


def test_a_segment_is_registered_at_the_copy_whose_reuse_pays_and_staged_before(rt: FakeRuntime) -> None:
    costs = PinCosts(ring_gbps=10, dma_gbps=50, register_gbps=4, register_fixed_s=0)
    n = 4 * MiB
    k = copies_to_pay(n, costs)
    assert k == 4  # 0.25 ns/B to register against 0.08 saved per copy: the 4th copy pays
    be, host, _ = _gpu(rt, costs)
    seg = _segment(host, np.ones(n, np.uint8))
    dev = be.alloc(n)
    try:
        for i in range(1, k + 2):
            v = host.host_view(seg)
            be.copy_in(dev, 0, v[:n])
            v.release()
            registered = any(c[0] == "host-register" for c in rt.calls)
            assert registered == (i >= k), i
        h2d = _memcpys(rt, rt.memcpyHostToDevice)
        assert h2d == [2 * MiB] * 2 * (k - 1) + [n, n]  # ring chunks for the first k-1 copies, then DMAs
    finally:
        be.free(dev)
        host.free(seg)
        be.close()


def test_buffers_that_are_not_node_segments_use_the_ring(rt: FakeRuntime) -> None:
    be, _, pins = _gpu(rt)
    data = np.ones(3 * MiB, np.uint8)
    dev = be.alloc(data.nbytes)
    try:
        be.copy_in(dev, 0, memoryview(data.data))  # a numpy array: the caller's, not the node's
        be.copy_in(dev, 0, memoryview(bytearray(data.nbytes)))
        assert not any(c[0] == "host-register" for c in rt.calls)
        assert _memcpys(rt, rt.memcpyHostToDevice) == [2 * MiB, MiB] * 2
        assert pins.stats()["mappings"] == 0
        assert (be.bytes_host_direct, be.bytes_host_ring) == (0, 2 * data.nbytes)
    finally:
        be.free(dev)
        be.close()


def test_a_sealed_segment_is_registered_read_only_and_never_copied_into(rt: FakeRuntime) -> None:
    be, host, _ = _gpu(rt)
    data = np.full(2 * MiB, 7, np.uint8)
    seg = host.alloc(data.nbytes)
    host.seal_writes(seg)  # sealed before the daemon mapped it: its mapping is read-only
    seg._map = None  # drop the pre-seal writable mapping, as a daemon restarting from the journal has none
    dev = be.alloc(data.nbytes)
    try:
        v = host.host_view(seg)
        be.copy_in(dev, 0, v)
        (reg,) = [c for c in rt.calls if c[0] == "host-register"]
        assert reg[3] == PORTABLE | READ_ONLY
        before = len(_memcpys(rt, rt.memcpyDeviceToHost))
        # A copy into it must not be a DMA into read-only registered memory (the fake refuses one);
        # it goes through the ring, whose stage-out then fails on the read-only mapping itself.
        with pytest.raises(ValueError, match="read-only"):
            be.copy_out(dev, 0, data.nbytes, v)
        assert all(n <= 2 * MiB for n in _memcpys(rt, rt.memcpyDeviceToHost)[before:])
        v.release()
    finally:
        be.free(dev)
        host.free(seg)
        be.close()
    assert rt.registered == {}


def test_freeing_a_segment_unregisters_it_after_the_copy_through_it_landed(rt: FakeRuntime) -> None:
    """The unmap waits for a direct copy in flight (the fake raises FreedInUse otherwise)."""
    rt.delay_s = 0.2
    be, host, pins = _gpu(rt)
    data = np.ones(MiB, np.uint8)
    seg = _segment(host, data)
    dev = be.alloc(data.nbytes)
    copying = threading.Event()
    errors: list[BaseException] = []
    real_direct = pins.direct

    def direct(view: memoryview, write: bool) -> int | None:
        addr = real_direct(view, write)
        copying.set()
        return addr

    pins.direct = direct  # type: ignore[method-assign]

    def copy() -> None:
        try:
            v = host.host_view(seg)
            be.copy_in(dev, 0, v[: data.nbytes])
            v.release()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=copy)
    t.start()
    assert copying.wait(5)
    t0 = time.monotonic()
    host.free(seg)  # the host backend releases the mapping first: waits for the DMA
    waited = time.monotonic() - t0
    t.join(5)
    assert not errors
    assert waited > 0.05  # it waited for the copy (0.2 s on the fake's stream)
    assert rt.registered == {}
    be.free(dev)
    be.close()


def test_a_failed_registration_is_logged_once_and_not_tried_again(rt: FakeRuntime,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    rt.fail_register = True
    be, host, pins = _gpu(rt)
    seg = _segment(host, np.ones(MiB, np.uint8))
    dev = be.alloc(MiB)
    try:
        with caplog.at_level(logging.WARNING, logger="gfaas.dataplane.pinned"):
            for _ in range(3):
                v = host.host_view(seg)
                be.copy_in(dev, 0, v[:MiB])
                v.release()
        assert sum(1 for c in rt.calls if c[0] == "host-register") == 1
        assert len([r for r in caplog.records if "could not register" in r.message]) == 1
        assert _memcpys(rt, rt.memcpyHostToDevice) == [MiB] * 3  # ring chunks (one each)
        assert be.direct_copies == 0 and pins.stats()["registered"] == 0
    finally:
        be.free(dev)
        host.free(seg)
        be.close()


def test_a_new_mapping_never_inherits_a_gone_mappings_registration(rt: FakeRuntime) -> None:
    pins = HostPins(rt, ALWAYS)
    m1 = mmap.mmap(-1, MiB)
    assert pins.direct(memoryview(m1), write=False) is not None
    pins.done(memoryview(m1))
    pins.release(m1)
    m1.close()
    assert rt.registered == {}
    m2 = mmap.mmap(-1, 2 * MiB)
    addr = pins.direct(memoryview(m2)[MiB:], write=True)
    assert addr == np.frombuffer(m2, np.uint8).ctypes.data + MiB
    (base, (size, _)), = rt.registered.items()
    assert size == 2 * MiB and base == addr - MiB
    pins.done(memoryview(m2))
    pins.close()
    assert rt.registered == {}


def test_the_gpu_benchmarks_registered_rows_run_on_the_fake(rt: FakeRuntime) -> None:
    """``gfaas bench dataplane --gpu``'s registered-segment rows, on the fake: GPU time is rare, so
    the code that will run there first runs here."""
    from gfaas.bench import gpu

    be = gpu._pinned_backend(rt, 4 * MiB)
    try:
        for kind in ("h2d", "d2h"):
            gpu._registered_copy(be, kind, 4 * MiB)()
        assert be.cuda.direct_copies == 2 and rt.pageable_async == 0
        rows = [gpu._row("h2d", "gfaas-ring", 4 * MiB, 4e-4), gpu._row("h2d", "gfaas-registered", 4 * MiB, 1e-4)]
        (row,) = gpu._register_rows(rt, [4 * MiB], rows, 4)
        assert row["kind"] == "register" and row["system"] == "cuda-host-register"
        assert isinstance(row["copies_to_pay"], int) and row["copies_to_pay"] >= 1
        pin = gpu._row("h2d", "cuda-pinned", 64 * MiB, 1e-3)
        reg = gpu._row("h2d", "gfaas-registered", 64 * MiB, 1.2e-3)
        (t,) = [t for t in gpu.targets([pin, reg]) if "registered" in t["target"]]
        assert t["value"] == pytest.approx(1 / 1.2, abs=1e-3) and t["met"] is False
    finally:
        gpu._close_pinned(be)
    assert rt.registered == {}


def test_a_dma_refused_at_launch_falls_back_to_the_ring_for_good(rt: FakeRuntime,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A registered segment whose DMA CUDA refuses at launch still arrives, through the ring, and its
    later copies go there too (logged once); the registration still ends with the segment."""
    be, host, pins = _gpu(rt)
    data = np.arange(2 * MiB, dtype=np.uint8)
    seg = _segment(host, data)
    dev = be.alloc(data.nbytes)
    real = rt.memcpyAsync
    refused = []

    def memcpy(dst: int, src: int, n: int, kind: int, stream: int) -> None:
        if n == data.nbytes and not refused:  # the direct one (ring chunks are 2 MiB too: refuse once)
            refused.append(1)
            raise RuntimeError("cudaErrorInvalidValue")
        real(dst, src, n, kind, stream)

    rt.memcpyAsync = memcpy  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger="gfaas.dataplane.pinned"):
            for _ in range(2):
                v = host.host_view(seg)
                be.copy_in(dev, 0, v[: data.nbytes])
                v.release()
                assert ctypes.string_at(dev.address, data.nbytes) == data.tobytes()
        assert be.direct_copies == 0 and refused == [1]
        assert len([r for r in caplog.records if "was refused" in r.message]) == 1
        assert pins.stats()["registered"] == 1  # registered still, until the segment goes
    finally:
        be.free(dev)
        host.free(seg)
        be.close()
    assert rt.registered == {}
