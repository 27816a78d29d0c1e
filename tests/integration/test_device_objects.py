"""Device objects through a real daemon process whose GPUs are modelled (``devices='null:0,1'``).

No CUDA here: the daemon's pools hand out fake addresses and fake IPC handles, and the client's
mapper records the CUDA calls it would make (``FakeMapper``) or is the real ``CudaMapper`` over the
asynchronous fake runtime (``fake_gpu``: queued work completes later, "device memory" is host
memory, so bytes are checked). What is checked is everything around them: one open per arena per
process, handles closed and arenas freed only after every holder closed them, the producer's
queued writes finished before its seal, a block reused only after a reader's queued work, read-only
views, deliveries between tiers, errors.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gfaas.config import MiB
from gfaas.dataplane import device_client
from gfaas.dataplane.device_client import CudaMapper, DeviceView
from gfaas.errors import ConfigError, DataPlaneError, ObjectStateError

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
from fake_cuda import FakeCupy, FakeRuntime  # noqa: E402

pytestmark = pytest.mark.node_config(devices="null:0,1", device_capacity_bytes=512 * MiB)


class FakeMapper:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.bases: dict[bytes, int] = {}

    def open(self, device: int, handle: bytes) -> int:
        self.calls.append(("open", device, handle))
        return self.bases.setdefault(handle, 0x7F0000000000 + len(self.bases) * (1 << 36))

    def close(self, device: int, base: int) -> None:
        self.calls.append(("close", device, base))

    def finish(self, device: int, stream: int | None = None) -> None:
        self.calls.append(("finish", device))

    def mark(self, device: int) -> None:
        self.calls.append(("mark", device))

    def done(self, device: int, token: Any = None) -> bool:
        return True

    def wait(self, device: int, event: bytes) -> None:
        self.calls.append(("wait", device, event))

    def stream_of(self, obj: Any) -> int | None:
        return None

    def copy(self, device: int, dst: int, src: int, nbytes: int, stream: int | None = None) -> None:
        self.calls.append(("copy", device, dst, src, nbytes))

    def array(self, view: DeviceView) -> Any:
        return view

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]


class FakeTensor:
    """A CUDA tensor as far as put can tell: DLPack device and ``__cuda_array_interface__``."""

    def __init__(self, device: int, shape: tuple[int, ...], dtype: str, ptr: int = 0xDEAD0000) -> None:
        self.device, self.shape, self.dtype, self.ptr = device, shape, np.dtype(dtype), ptr

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None}


def test_allocate_seal_get_maps_each_arena_once_and_the_producer_finishes_first(node: Any) -> None:
    pm, cm = FakeMapper(), FakeMapper()
    prod = node.connect("f", device_mapper=pm)
    cons = node.connect("g", device_mapper=cm)
    bufs = [prod.allocate((4, 1024), np.float32, consumers=["g"], device=0) for _ in range(3)]
    assert all(not b.view.readonly for b in bufs)
    refs = [b.seal() for b in bufs]
    assert pm.kinds() == ["open", "finish", "finish", "finish"]  # one arena, opened once
    ptrs = [b.view.ptr for b in bufs]
    assert len(set(ptrs)) == 3 and all(p >= 0x7F0000000000 for p in ptrs)
    views = [cons.get(r) for r in refs]
    assert cm.kinds() == ["open"]  # the producer's writes finished before its seal: nothing to wait on
    for v, b in zip(views, bufs, strict=True):
        cai = v.__cuda_array_interface__
        assert cai["shape"] == (4, 1024) and cai["typestr"] == "<f4" and cai["data"][1] is True
        # Same arena, same offsets: the consumer's address differs from the producer's only by base.
        assert v.ptr - cm.bases[cm.calls[0][2]] == b.view.ptr - pm.bases[pm.calls[0][2]]
    assert views[0].__dlpack_device__() == (2, 0)
    assert node.stats()["device_bytes_used"] >= 3 * 16384


def test_a_device_tensor_put_is_one_device_copy_into_the_pool(node: Any) -> None:
    pm = FakeMapper()
    prod = node.connect("f", device_mapper=pm)
    ref = prod.put(FakeTensor(1, (8, 8), "<i8"), consumers=["g"])
    assert pm.kinds() == ["open", "copy", "finish", "mark"]  # mark: its view died (see _device_view_died)
    assert pm.calls[1][1:] == (1, pm.calls[1][2], 0xDEAD0000, 512)
    v = node.connect("g", device_mapper=FakeMapper()).get(ref)
    assert (v.device, v.shape, v.dtype) == (1, (8, 8), np.dtype("<i8"))


def test_host_object_delivered_to_a_gpu_and_back(node: Any) -> None:
    f = node.connect("f", device_mapper=FakeMapper())
    host = np.arange(3 * MiB, dtype=np.uint8)
    ref = f.put(host, consumers=["g", "h"])
    gm = FakeMapper()
    v = node.connect("g", device_mapper=gm).get(ref, device=1)
    assert isinstance(v, DeviceView) and v.device == 1 and v.readonly and v.nbytes == host.nbytes
    assert gm.kinds() == ["open"]  # a delivery has no producer event: the daemon's copy finished
    # A host reader of a device object gets a host array (D2H delivery); bytes are modelled here.
    dref = f.allocate(1000, np.uint8, consumers=["h"], device=0).seal()
    out = node.connect("h").get(dref, device="host")
    assert isinstance(out, np.ndarray) and out.shape == (1000,)
    st = node.stats()  # what the runtime's GPU tests read to tell device passing happened
    assert (st["device_objects"], st["deliveries_to_device"], st["deliveries_to_host"]) == (1, 1, 1)
    assert st["bytes_delivered"] == host.nbytes + 1000


def test_copy_and_out_of_a_device_object_land_in_host_memory(node: Any) -> None:
    f = node.connect("f", device_mapper=FakeMapper())
    ref = f.allocate((10,), np.int32, consumers=["g"], device=0).seal()
    got = node.connect("g").get(ref, copy=True)
    assert isinstance(got, np.ndarray) and got.dtype == np.int32 and got.flags.writeable


@pytest.mark.node_config(devices="null:0", device_pool_floor_bytes=0)
def test_arena_handles_are_closed_once_the_daemon_frees_the_arena(node: Any) -> None:
    f = node.connect("f", device_mapper=(fm := FakeMapper()))
    g = node.connect("g", device_mapper=(gm := FakeMapper()))
    buf = f.allocate(100 * MiB, np.uint8, consumers=["g"], device=0)  # an arena of its own
    ref = buf.seal()
    v = g.get(ref)
    base = gm.bases[gm.calls[0][2]]
    del v, buf  # the object was read by its only consumer; both views are gone now
    f.allocate(16, np.uint8, device=0)  # tells the daemon f let go (the block stays: g holds it)
    assert node.stats()["device_bytes_held"] >= 100 * MiB
    g.allocate(16, np.uint8, device=0)  # g lets go: block freed, empty arena above the floor returned
    assert ("close", 0, base) in gm.calls and [c[0] for c in gm.calls].count("close") == 1
    f.allocate(16, np.uint8, device=0)
    assert [c for c in fm.calls if c[0] == "close"] == [("close", 0, fm.bases[fm.calls[0][2]])]
    assert node.stats()["device_bytes_held"] == 64 * MiB


def test_errors_name_the_fix(node: Any) -> None:
    f = node.connect("f", device_mapper=FakeMapper())
    with pytest.raises(ConfigError, match="GPU 5 has no memory pool"):
        f.allocate(16, np.uint8, device=5)
    with pytest.raises(ConfigError, match="device=-1"):
        f.allocate(16, np.uint8, device=-1)
    ref = f.put(np.zeros(4))
    with pytest.raises(ConfigError, match="use None"):
        f.get(ref, device="gpu")
    with pytest.raises(ConfigError, match="drop them"):
        f.get(ref, device=0, copy=True)
    buf = f.allocate(16, np.uint8, device=0)
    buf.seal()
    with pytest.raises(ObjectStateError):
        buf.seal()
    with pytest.raises(ConfigError, match="GPU 3 has no memory pool"):
        f.get(ref, device=3)
    assert f.get(ref).shape == (4,)  # the refused get did not consume or lose it


def test_gpu_to_gpu_delivery_uses_the_peer_copy(node: Any) -> None:
    f = node.connect("f", device_mapper=FakeMapper())
    ref = f.allocate((256, 256), np.float32, consumers=["g"], device=0).seal()
    gm = FakeMapper()
    v = node.connect("g", device_mapper=gm).get(ref, device=1)
    assert (v.device, v.shape, v.readonly) == (1, (256, 256), True)
    # The daemon waited for the producer's event before its copy; the reader has nothing to wait on.
    assert gm.kinds() == ["open"] and gm.calls[0][1] == 1


@pytest.mark.node_config(devices="")
def test_a_node_without_gpu_pools_stages_device_tensors_through_host(node: Any) -> None:
    f = node.connect("f", device_mapper=(fm := FakeMapper()))
    assert f.devices == frozenset()
    with pytest.raises(ConfigError, match="cannot put a FakeTensor"):  # the host path refuses it
        f.put(FakeTensor(0, (4,), "<f4"))
    assert fm.calls == []  # it never asked the daemon for a device allocation


def test_the_welcome_names_the_nodes_gpus(node: Any) -> None:
    assert node.connect("f", device_mapper=FakeMapper()).devices == frozenset({0, 1})


def test_a_readers_deadline_reaches_the_copy_into_its_gpu(make_config: Any, thread_daemon: Any) -> None:
    """get(device=k, deadline_s=...) hands the reader's deadline to the GPU's copy (the ring's
    SLO-aware sharing orders copies by it); without one the copy is best effort (inf). Bad values
    are refused before anything is read."""
    import math
    import time

    import gfaas

    cfg = make_config(devices="null:0", device_capacity_bytes=64 * MiB)
    with thread_daemon(cfg) as d:
        admin = gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir)
        inv = admin.open_invocation("wf", ["f", "g"])
        f = gfaas.connect(inv.credentials("f"))
        g = gfaas.connect(inv.credentials("g"), device_mapper=FakeMapper())
        refs = [f.put(np.full(1 << 20, k, np.uint8), consumers=["g"]) for k in range(3)]
        for bad in (-1.0, math.inf, math.nan):
            with pytest.raises(gfaas.ConfigError, match="deadline_s="):
                g.get(refs[0], device=0, deadline_s=bad)
        log = d.store.devices[0].log
        before = time.monotonic()
        g.get(refs[0], device=0, deadline_s=0.25)
        after = time.monotonic()
        g.get(refs[1], device=0)
        copies = [x for x in log if x.kind == "copy_in"]
        assert len(copies) == 2
        assert before + 0.25 <= copies[0].deadline <= after + 0.25
        assert copies[1].deadline == math.inf
        g.close()
        f.close()
        admin.close()


def test_the_daemon_refuses_a_bad_deadline_on_the_wire(node: Any) -> None:
    """A client that sends a negative or infinite deadline gets ProtocolError; nothing is consumed."""
    import math

    import gfaas
    from gfaas.dataplane import protocol as P

    f, g = node.connect("f"), node.connect("g")
    ref = f.put(np.arange(10), consumers=["g"])
    for bad in (-1.0, math.inf):
        with pytest.raises(gfaas.ProtocolError, match="deadline_s"):
            g._call(P.Get(ref.id, -1, P.HOST, bad))
    np.testing.assert_array_equal(g.get(ref, copy=True), np.arange(10))  # still there, read once


# ---- the real mapper over the asynchronous fake runtime -------------------------------------
@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRuntime]:
    """This process's mapper is a ``CudaMapper`` over the asynchronous fake (one per process)."""
    rt = FakeRuntime()
    cp = FakeCupy(rt)
    monkeypatch.setattr(device_client, "_process_mapper", None)
    monkeypatch.setattr(device_client, "_cupy", lambda: cp)
    yield rt
    rt.close()


def _slowly(fn: Any) -> Any:
    """A kernel that takes a while: anything not ordered after it runs first."""
    return lambda: (time.sleep(0.05), fn())


def test_two_clients_in_a_process_share_its_mapper(node: Any, fake_gpu: FakeRuntime) -> None:
    """Each arena is opened once per process and closed when the last client using it closes;
    events are created once per GPU and process, whichever client seals or drops a view."""
    rt = fake_gpu
    f1, f2 = node.connect("f"), node.connect("g")
    refs = [c.allocate(64, np.uint8, consumers=["h"], device=0).seal() for c in (f1, f2, f1)]
    reader = node.connect("h")
    views = [reader.get(r) for r in refs]
    opens = [c for c in rt.calls if c[0] == "ipc-open"]
    assert len(opens) == 1  # one arena, three clients, one open
    del views
    f2.allocate(64, np.uint8, consumers=["h"], device=0).seal()
    # Per GPU and process, whichever client: one event for seals, and one per dropped view whose
    # mark had not completed when the view died (completed ones are used again: test_cuda_backend_fake);
    # seven views died here (four producers', three reader's).
    assert [c[0] for c in rt.calls].count("event-create") <= 1 + 7
    f1.close()
    reader.close()
    assert [c for c in rt.calls if c[0] == "ipc-close"] == []  # f2 still uses it
    f2.close()
    assert len([c for c in rt.calls if c[0] == "ipc-close"]) == 1


@pytest.mark.node_config(devices="null:0,1", device_capacity_bytes=512 * MiB, device_pool_floor_bytes=0)
def test_two_clients_of_a_process_close_a_freed_arena_once(node: Any, fake_gpu: FakeRuntime) -> None:
    """The GPU test of the same name, on the fake: a 100 MiB arena two clients of one process opened
    (once: the process's mapper counts two users) is closed once, after both let go. The 16-byte
    device allocations that carry the releases open an arena of their own (the pool keeps no empty
    one at floor 0), which stays open: the H200 run's whole-table comparison took it for a leak."""
    from gfaas.dataplane.device_client import process_mapper

    p, c = node.connect("f"), node.connect("g")
    buf = p.allocate((100 * MiB,), np.uint8, consumers=["g"], device=0)
    v = c.get(buf.seal())
    ours = set(process_mapper()._opened)
    assert [n for _, n in process_mapper()._opened.values()] == [2]  # one open, two users
    del v, buf
    deadline = time.monotonic() + 10  # the fake completes the drops' marks a little later
    while ours & set(process_mapper()._opened) and time.monotonic() < deadline:
        p.allocate(16, np.uint8, device=0)  # each drops a view (and marks) right away
        c.allocate(16, np.uint8, device=0)
    assert not ours & set(process_mapper()._opened)  # ours closed
    assert len([x for x in fake_gpu.calls if x[0] == "ipc-close"]) == 1  # once, for both clients
    assert [n for _, n in process_mapper()._opened.values()] == [2]  # the small blocks' arena


def test_a_seal_waits_for_the_producers_queued_writes(node: Any, fake_gpu: FakeRuntime) -> None:
    rt = fake_gpu
    f, g = node.connect("f"), node.connect("g")
    buf = f.allocate(4096, np.uint8, consumers=["g"], device=0)
    ptr = buf.view.ptr
    rt.launch(0, _slowly(lambda: ctypes.memset(ptr, 7, 4096)))  # the producer's kernel, still queued
    ref = buf.seal()
    v = g.get(ref)
    assert ctypes.string_at(v.ptr, 4096) == b"\x07" * 4096  # the reader needs no event: it is there


def test_a_put_copies_after_the_work_on_the_tensors_stream(monkeypatch: pytest.MonkeyPatch, node: Any,
                                                           fake_gpu: FakeRuntime) -> None:
    """put of a torch tensor queues its copy on the tensor's (torch's current) stream, after the
    kernel still writing the tensor there, and seals once that copy is done."""
    rt = fake_gpu
    s = rt.streamCreateWithFlags(rt.streamNonBlocking)
    torch = types.ModuleType("torch")

    class Tensor:
        device = 0

        def __init__(self, ptr: int) -> None:
            self.ptr = ptr

        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, 0)

        @property
        def __cuda_array_interface__(self) -> dict[str, Any]:
            return {"shape": (4096,), "typestr": "|u1", "data": (self.ptr, False), "version": 3, "strides": None}

    torch.Tensor = Tensor  # type: ignore[attr-defined]
    torch.cuda = types.SimpleNamespace(current_stream=lambda dev: types.SimpleNamespace(cuda_stream=s))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    src = ctypes.create_string_buffer(4096)
    rt.launch(s, _slowly(lambda: ctypes.memset(src, 9, 4096)))  # the kernel producing the tensor
    ref = node.connect("f").put(Tensor(ctypes.addressof(src)), consumers=["g"])
    v = node.connect("g").get(ref)
    assert ctypes.string_at(v.ptr, 4096) == b"\x09" * 4096
    assert ("memcpy", rt.memcpyDeviceToDevice, 4096, s) in rt.calls


@pytest.mark.node_config(devices="null:0", device_pool_floor_bytes=0)
def test_a_block_is_reused_only_after_the_readers_queued_work(node: Any, fake_gpu: FakeRuntime) -> None:
    """A reader drops its view while a kernel reading the block is still queued: the block goes
    back (and is written by the next object) only after that kernel ran."""
    rt = fake_gpu
    f, g = node.connect("f"), node.connect("g")
    buf = f.allocate(4096, np.uint8, consumers=["g"], device=0)
    ctypes.memset(buf.view.ptr, 1, 4096)
    ref = buf.seal()
    del buf
    v = g.get(ref)
    ptr, seen = v.ptr, ctypes.create_string_buffer(4096)
    rt.launch(0, _slowly(lambda: ctypes.memmove(seen, ptr, 4096)))  # the reader's kernel, queued
    del v
    g.allocate(16, np.uint8)  # a request: releases what may be released
    f.allocate(16, np.uint8)
    nxt = f.allocate(4096, np.uint8, device=0)
    ctypes.memset(nxt.view.ptr, 2, 4096)  # the next object's bytes, written now
    CudaMapper.finish(device_client.process_mapper(), 0)
    assert seen.raw == b"\x01" * 4096  # the kernel read the object it was queued on
    g.close()  # waits for the reader's work, then releases: the block is reused now
    again = f.allocate(4096, np.uint8, device=0)
    assert again.view.ptr == ptr


def test_an_event_that_never_completes_is_an_error_and_blocks_no_one(make_config: Any,
                                                                     thread_daemon: Any) -> None:
    """A seal sent with an IPC event (a client that does not finish its writes itself) is held
    until the event completes, off the daemon's loop and lock: other clients are served meanwhile;
    one that never completes fails that seal with an error naming it after the bound."""
    import gfaas
    from gfaas.dataplane import protocol as P

    cfg = make_config(devices="null:0", device_capacity_bytes=64 * MiB)
    with thread_daemon(cfg) as d:
        dev = d.store.devices[0]
        gate = threading.Event()
        dev.event_timeout_s = 0.5
        dev._event_done = lambda e: e == b"later" and gate.is_set()
        admin = gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir)
        inv = admin.open_invocation("wf", ["f", "g", "h"])
        f = gfaas.connect(inv.credentials("f"), device_mapper=FakeMapper())
        h = gfaas.connect(inv.credentials("h"))
        stuck = f.allocate(16, np.uint8, consumers=["g"], device=0)
        with pytest.raises(DataPlaneError, match="producer event 737475636b on GPU 0 did not complete within 0.5 s"):
            f._call(P.SealAllocated(stuck._id, b"stuck"))
        later = f.allocate(16, np.uint8, consumers=["g"], device=0)
        out: list[Any] = []
        t = threading.Thread(target=lambda: out.append(f._call(P.SealAllocated(later._id, b"later"))))
        t.start()
        for k in range(3):  # the loop serves others while that seal waits
            ref = h.put(np.full(1000, k), consumers=["h"])
            np.testing.assert_array_equal(h.get(ref), np.full(1000, k))
        assert out == []
        gate.set()
        t.join(30)
        assert isinstance(out[0], P.Ok)
        assert d.store.objects[later._id].event == b""  # nobody waits on it again
        for c in (f, h, admin):
            c.close()


def test_a_trimmed_arena_is_freed_after_every_holder_closed_it(make_config: Any, thread_daemon: Any) -> None:
    """trim/set_target return an arena two processes have open: each hears ``gone`` in its next
    device reply; the memory is freed only after both have closed it (their next request, or
    leaving)."""
    import gfaas

    cfg = make_config(devices="null:0", device_capacity_bytes=512 * MiB, device_pool_floor_bytes=512 * MiB)
    with thread_daemon(cfg) as d:
        dev = d.store.devices[0]
        admin = gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir)
        inv = admin.open_invocation("wf", ["f", "g"])
        f = gfaas.connect(inv.credentials("f"), device_mapper=(fm := FakeMapper()))
        g = gfaas.connect(inv.credentials("g"), device_mapper=(gm := FakeMapper()))
        buf = f.allocate(100 * MiB, np.uint8, consumers=["g"], device=0)
        v = g.get(buf.seal())
        (base,) = [b for b, n in dev.raw.items() if n >= 100 * MiB]
        del v, buf
        f.allocate(16, np.uint8)
        g.allocate(16, np.uint8)  # both let go: the block is free, the arena kept (the floor)
        assert base in dev.raw
        with d.lock:
            dev.pool.set_target(0)  # returns it
        g.allocate(16, np.uint8)  # g hears gone and closes its handle
        assert [c[0] for c in gm.calls].count("close") == 1
        assert base in dev.raw  # f has not closed it yet
        f.allocate(16, np.uint8)  # f hears it
        assert [c[0] for c in fm.calls].count("close") == 1
        g.allocate(16, np.uint8)  # g's next request: it had closed
        assert base in dev.raw
        f.close()  # f leaves
        deadline = time.monotonic() + 10
        while base in dev.raw and time.monotonic() < deadline:
            time.sleep(0.01)  # the daemon sees f's socket close on its loop
        assert base not in dev.raw
        g.close()
        admin.close()
