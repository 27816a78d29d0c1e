"""Device objects through a real daemon process whose GPUs are modelled (``devices='null:0,1'``).

No CUDA here: the daemon's pools hand out fake addresses and fake IPC handles, and the client's
mapper records the CUDA calls it would make. What is checked is everything around them: one open
per arena per process, handles closed when the daemon frees an arena, the consumer waiting on the
producer's event before it reads, read-only views, deliveries between tiers, errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gfaas.config import MiB
from gfaas.dataplane.device_client import DeviceView
from gfaas.errors import ConfigError, ObjectStateError

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

    def record(self, device: int) -> bytes:
        self.calls.append(("record", device))
        return b"event-%d" % len(self.calls)

    def wait(self, device: int, event: bytes) -> None:
        self.calls.append(("wait", device, event))

    def copy(self, device: int, dst: int, src: int, nbytes: int) -> None:
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


def test_allocate_seal_get_maps_each_arena_once_and_orders_by_event(node: Any) -> None:
    pm, cm = FakeMapper(), FakeMapper()
    prod = node.connect("f", device_mapper=pm)
    cons = node.connect("g", device_mapper=cm)
    bufs = [prod.allocate((4, 1024), np.float32, consumers=["g"], device=0) for _ in range(3)]
    assert all(not b.view.readonly for b in bufs)
    refs = [b.seal() for b in bufs]
    assert pm.kinds() == ["open", "record", "record", "record"]  # one arena, opened once
    ptrs = [b.view.ptr for b in bufs]
    assert len(set(ptrs)) == 3 and all(p >= 0x7F0000000000 for p in ptrs)
    views = [cons.get(r) for r in refs]
    assert cm.kinds() == ["open", "wait", "wait", "wait"]
    assert [c[2] for c in cm.calls[1:]] == [b"event-2", b"event-3", b"event-4"]  # each producer's seal
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
    assert pm.kinds() == ["open", "copy", "record"]
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
