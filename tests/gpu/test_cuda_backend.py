"""The CUDA backend on a real GPU (skipped, with the reason, on machines without one).

Run them alone with ``make test-gpu``. Each checks bytes against numpy, the oracle.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from gfaas.config import MiB

cp = pytest.importorskip("cupy", reason="needs the gpu extra: pip install 'gfaas[gpu]'")


@pytest.fixture
def backend() -> Any:
    from gfaas.dataplane.backends.cuda import CudaBackend

    be = CudaBackend(0, cap_bytes=2048 * MiB, target_bytes=256 * MiB, ring_bytes=20 * MiB)
    yield be
    be.close()


@pytest.mark.parametrize("n", [1, 4096, 2 * MiB, 2 * MiB + 3, 37 * MiB + 11])
def test_ring_copies_round_trip_exactly(backend: Any, n: int) -> None:
    src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    seg = backend.alloc(n)
    backend.copy_in(seg, 0, memoryview(src))
    dev = cp.ndarray((n,), cp.uint8, cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(seg.address, n, None, 0), 0))
    assert np.array_equal(cp.asnumpy(dev), src)
    out = np.zeros(n, np.uint8)
    backend.copy_out(seg, 0, n, memoryview(out))
    assert np.array_equal(out, src)
    backend.free(seg)


def test_concurrent_copies_share_the_ring(backend: Any) -> None:
    import threading

    parts = [np.full(9 * MiB + i, i, np.uint8) for i in range(6)]
    segs = [backend.alloc(p.nbytes) for p in parts]
    ts = [threading.Thread(target=backend.copy_in, args=(s, 0, memoryview(p))) for s, p in zip(segs, parts, strict=True)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for s, p in zip(segs, parts, strict=True):
        out = np.zeros_like(p)
        backend.copy_out(s, 0, p.nbytes, memoryview(out))
        assert np.array_equal(out, p)
    assert backend.engine.batches >= 6 * 5 // 5


def test_pool_serves_from_arenas_not_cudamalloc(backend: Any) -> None:
    before = backend.pool.raw_allocs
    segs = [backend.alloc(MiB) for _ in range(32)]
    assert backend.pool.raw_allocs - before <= 1
    for s in segs:
        backend.free(s)


def _consumer(sock: str, token: str, ref: str, q: Any) -> None:
    import cupy

    import gfaas

    c = gfaas.connect(socket_path=sock, token=token)
    v = c.get(ref)
    arr = cupy.asarray(v)
    q.put((v.readonly, v.__cuda_array_interface__["data"][1], int(arr.sum()), str(arr.dtype), arr.shape))


def test_ipc_get_in_another_process_sees_the_producers_bytes(tmp_path: Any) -> None:
    import multiprocessing as mp

    import gfaas
    from gfaas.dataplane.local import LocalNode

    d = f"/tmp/gfg-{os.getpid()}"
    cfg = gfaas.NodeConfig(node_id="gpu", socket_path=d + ".sock", state_dir=d, devices="cuda:0")
    with LocalNode(cfg), gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as admin:
        inv = admin.open_invocation("wf", ["p", "c", "h"])
        prod = gfaas.connect(inv.credentials("p"))
        x = cp.arange(1 << 20, dtype=cp.int64)
        buf = prod.allocate((1 << 20,), np.int64, consumers=["c", "h"], device=0)
        cp.copyto(buf.array(), x)  # queued on the current stream; seal records the IPC event after it
        ref = str(buf.seal())
        q = mp.get_context("spawn").Queue()
        p = mp.get_context("spawn").Process(target=_consumer, args=(cfg.socket_path, inv.tokens["c"], ref, q))
        p.start()
        ro, flag, total, dtype, shape = q.get(timeout=120)
        p.join(30)
        assert (ro, flag, dtype, shape) == (True, True, "int64", (1 << 20,))
        assert total == int(x.sum())
        host = gfaas.connect(inv.credentials("h")).get(ref, device="host")  # D2H through the ring
        assert np.array_equal(host, cp.asnumpy(x))


def test_torch_interop_without_copies() -> None:
    torch = pytest.importorskip("torch", reason="needs torch with CUDA")
    from gfaas.dataplane.device_client import CudaMapper, DeviceView

    x = cp.arange(16, dtype=cp.float32)
    v = DeviceView(CudaMapper(), 0, int(x.data.ptr), x.nbytes, np.dtype(np.float32), (16,), True)
    t = torch.as_tensor(v, device="cuda:0")
    assert t.data_ptr() == int(x.data.ptr) and float(t.sum()) == float(x.sum())
