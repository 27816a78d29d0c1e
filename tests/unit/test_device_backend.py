"""The null GPU backend and the store's device tier, in process (no daemon, no CUDA)."""

from __future__ import annotations

import pytest

from gfaas.clock import ManualClock
from gfaas.config import MiB, NodeConfig
from gfaas.dataplane.backends import NullBackend, NullDeviceBackend, make_device_backends
from gfaas.dataplane.staging import D2H, H2D, StagingModel, StagingPlanner, model_timeline
from gfaas.dataplane.store import Store
from gfaas.errors import ConfigError


def test_null_gpu_copies_take_the_staged_pipeline_time() -> None:
    m = StagingModel(link_gbps=20.0, stage_gbps=10.0, stagers=4, launch_s=2e-6)
    dev = NullDeviceBackend(0, model=m, target_bytes=0)
    seg = dev.alloc(64 * MiB)
    dev.copy_in(seg, 0, memoryview(bytearray(64 * MiB)))
    dev.copy_out(seg, 0, 8 * MiB, memoryview(bytearray(8 * MiB)))
    p = StagingPlanner(20 * MiB, capacity_gbps=20.0)
    p.add(0, 64 * MiB)
    want = model_timeline(p, H2D, m)[1][0]
    assert [(t.kind, t.nbytes) for t in dev.log] == [("copy_in", 64 * MiB), ("copy_out", 8 * MiB)]
    assert dev.log[0].seconds == want == dev.staged_seconds(H2D, 64 * MiB)
    assert dev.log[1].seconds == dev.staged_seconds(D2H, 8 * MiB)
    # Pipelined: much closer to the link time than to link + staging in sequence.
    assert want < 64 * MiB / 20e9 + 64 * MiB / 10e9 / 2


def test_export_is_an_arena_handle_and_offset() -> None:
    dev = NullDeviceBackend(1, target_bytes=0)
    a, b = dev.alloc(1000), dev.alloc(5000)
    ra, rb = dev.export(a, False), dev.export(b, False)
    assert ra.handle == rb.handle and ra.arena == rb.arena and ra.arena >> 32 == 1
    assert (ra.offset, rb.offset, rb.size) == (0, 1024, 5120)
    dev.free(a)
    dev.free(b)
    assert dev.collect_gone() == [ra.arena] and dev.collect_gone() == []


def test_store_refuses_unknown_gpus_and_keeps_host_accounting_apart(tmp_path: object) -> None:
    cfg = NodeConfig(node_id="n", socket_path="/tmp/x.sock", state_dir=str(tmp_path))
    store = Store(cfg, NullBackend(), ManualClock(), devices={0: NullDeviceBackend(0)})
    inv = store.open_invocation("wf", ["f", "g"])
    s = store.connect(inv.tokens["f"])
    rec, seg = store.allocate(s, 10 * MiB, "|u1", [10 * MiB], ["g"], device=0)
    assert seg.device == 0 and store.reserved == 0 and store.stats()["device_bytes_used"] == 10 * MiB
    store.seal(s, rec.id, b"ev")
    assert rec.event == b"ev"
    with pytest.raises(ConfigError, match="GPU 2 has no memory pool on node n"):
        store.allocate(s, 10, "|u1", [10], None, device=2)


@pytest.mark.parametrize("spec,want", [("", ("", ())), ("null", ("null", (0,))), ("null:0,2", ("null", (0, 2))),
                                       ("cuda", ("cuda", None)), ("cuda:1", ("cuda", (1,)))])
def test_device_spec(spec: str, want: object) -> None:
    assert NodeConfig(devices=spec).device_spec() == want


@pytest.mark.parametrize("spec", ["gpu:0", "cuda:a", "null:0,0", "cuda:-1"])
def test_bad_device_spec(spec: str) -> None:
    with pytest.raises(ConfigError, match="devices="):
        NodeConfig(devices=spec)


def test_make_device_backends_null() -> None:
    devs = make_device_backends("null", (0, 3), 64 * MiB, floor_bytes=0)
    assert sorted(devs) == [0, 3] and devs[3].pool.cap == 64 * MiB


def test_null_gpu_from_a_topology_preset_takes_its_link_rates() -> None:
    from gfaas.topology import preset

    dev = NullDeviceBackend.from_topology(preset("dgx-a100"), 3)
    topo = preset("dgx-a100")
    pcie = min(lk.gbps for lk in topo.links if "gpu3" in (lk.a, lk.b) and lk.kind == "pcie")
    assert dev.model.link_gbps == pcie and dev.device == 3
    with pytest.raises(ConfigError, match="no PCIe link to gpu9"):
        NullDeviceBackend.from_topology(preset("h100-x1"), 9)
