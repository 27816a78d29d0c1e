"""Topology model and presets: the machines the papers describe, and every rejected input named."""

from __future__ import annotations

import json
from itertools import combinations

import pytest

from gfaas.errors import ConfigError
from gfaas.topology import PRESETS, Device, Link, Topology, preset
from gfaas.topology.presets import GiB


def rate(t: Topology, src: str, dst: str) -> float:
    """The directed edge's GB/s; fails the test if the two are not linked."""
    e = t.edge(src, dst)
    assert e is not None, f"{src} -> {dst} not linked"
    return e.gbps


def pairs(topo: Topology) -> list[tuple[str, str]]:
    return list(combinations(topo.gpus, 2))


# ---- presets --------------------------------------------------------------------------------------
def test_dgx_v100_bandwidth_classes_match_seed_000_fig_6a() -> None:
    """dgx-v100: 8 GPUs; of 28 pairs 8 have 48 GB/s, 8 half that (~28%), 12 no NVLink (~42%)."""
    t = preset("dgx-v100")
    assert t.gpus == [f"gpu{i}" for i in range(8)]
    rates = [t.nvlink_gbps(a, b) for a, b in pairs(t)]
    assert len(rates) == 28
    assert (rates.count(48.0), rates.count(24.0), rates.count(0.0)) == (8, 8, 12)
    # The paper's "28%" and "42%" are 8/28 and 12/28 truncated to whole percent.
    assert (100 * rates.count(24.0) // 28, 100 * rates.count(0.0) // 28) == (28, 42)
    assert t.nvlink_gbps("gpu0", "gpu3") == 48.0 and t.nvlink_gbps("gpu0", "gpu1") == 24.0
    assert t.nvlink_gbps("gpu0", "gpu5") == 0.0
    assert all(t.nvlink_gbps(a, b) == t.nvlink_gbps(b, a) for a, b in pairs(t))


def test_dgx_v100_each_gpu_shares_its_switch_with_exactly_its_pair_partner() -> None:
    """dgx-v100: gpu2k and gpu2k+1 hang off pcie<k> and no other GPU does."""
    t = preset("dgx-v100")
    for g in range(8):
        sw = t.pcie_switch_of(f"gpu{g}")
        assert sw == f"pcie{g // 2}"
        assert [x for x in t.gpus if t.pcie_switch_of(x) == sw] == [f"gpu{g - g % 2}", f"gpu{g - g % 2 + 1}"]
    assert t.neighbours("nic1") == ["pcie1"]
    assert rate(t, "host", "pcie0") == 12.0
    assert (t.pcie_p2p_gbps, t.pageable_gbps) == (7.9, 3.0)
    assert t.device("gpu0").memory_bytes == 16 * GiB


def test_pcie_switch_of_a_nic() -> None:
    """pcie_switch_of('nic1') on dgx-v100 is pcie1, as its docstring says ('a GPU (or NIC)')."""
    assert preset("dgx-v100").pcie_switch_of("nic1") == "pcie1"


def test_dgx_a100_every_pair_300_gbps_through_the_nvswitch() -> None:
    """dgx-a100: no direct GPU-GPU edge, yet every pair reads 300 GB/s via the nvswitch."""
    t = preset("dgx-a100")
    assert len(t.gpus) == 8
    assert all(t.nvlink_gbps(a, b) == 300.0 and t.edge(a, b) is None for a, b in pairs(t))
    assert t.of_kind("nvswitch") == ["nvswitch"]
    assert len(t.nics_of(0)) == 8


def test_4xa10_has_no_nvlink_and_a_switch_per_gpu() -> None:
    """4xa10: 4 GPUs, no NVLink at all, each on its own PCIe switch."""
    t = preset("4xa10")
    assert len(t.gpus) == 4
    assert all(t.nvlink_gbps(a, b) == 0.0 for a, b in pairs(t))
    assert not any(e.kind == "nvlink" for e in t.edges())
    assert len({t.pcie_switch_of(g) for g in t.gpus}) == 4


def test_h100_and_cpu_only() -> None:
    """h100-x1 has one GPU of 80e9 bytes; cpu-only has no GPU and no link, only host."""
    h = preset("h100-x1")
    assert h.gpus == ["gpu0"] and h.device("gpu0").memory_bytes == 80 * 10**9
    c = preset("cpu-only")
    assert (c.gpus, c.links, [d.name for d in c.devices]) == ([], (), ["host"])
    assert c.host_of(0) == "host"


def test_every_preset_is_a_fresh_equal_value() -> None:
    """Each preset builds, is a single node, and two builds compare equal (dataclass equality)."""
    for name in PRESETS:
        t = preset(name)
        assert t.name == name and t.nodes == [0] and t == preset(name)


# ---- replicate ------------------------------------------------------------------------------------
def test_replicate_renames_devices_and_joins_nics_to_the_fabric() -> None:
    """dgx-v100*4: n<i>.x names, node ids 0..3, every NIC linked to 'fabric' at its own rate."""
    t = preset("dgx-v100*4")
    assert t.name == "dgx-v100x4" and t.nodes == [0, 1, 2, 3]
    assert len(t.gpus) == 32 and "n1.gpu3" in t and t.device("n1.gpu3").node == 1
    assert t.device("n3.nic2").node == 3
    assert sorted(t.neighbours("fabric")) == sorted(f"n{i}.nic{k}" for i in range(4) for k in range(4))
    e = t.edge("n2.nic0", "fabric")
    assert e is not None and (e.kind, e.gbps) == ("net", 12.5)
    # NVLink stays inside a node: the copies are not linked to one another.
    assert t.nvlink_gbps("n1.gpu0", "n1.gpu3") == 48.0 and t.nvlink_gbps("n0.gpu0", "n1.gpu3") == 0.0
    assert t.pcie_switch_of("n1.gpu3") == "n1.pcie1"


def test_replicate_fabric_rate_and_one() -> None:
    """replicate(n, fabric_gbps) overrides NIC rates; replicate(1) is the topology itself."""
    base = preset("dgx-a100")
    t = base.replicate(2, fabric_gbps=50.0)
    assert {e.gbps for e in t.out_edges("fabric")} == {50.0}
    assert base.replicate(1) is base


def test_replicate_refuses_clusters_and_non_positive_counts() -> None:
    """replicate(0) and replicating a cluster again are ConfigErrors naming the count / span."""
    with pytest.raises(ConfigError, match=r"replicate a topology 0 times"):
        preset("dgx-v100").replicate(0)
    with pytest.raises(ConfigError, match=r"already spans 2 nodes"):
        preset("4xa10*2").replicate(2)


# ---- summary --------------------------------------------------------------------------------------
def test_summary_is_json_serialisable() -> None:
    """summary() survives json.dumps for every preset and a cluster, with per-node NVLink rows."""
    for name in [*PRESETS, "dgx-v100*2"]:
        s = preset(name).summary()
        back = json.loads(json.dumps(s))
        assert back["name"] == s["name"] and back["unit"] == "GB/s"
    s = preset("dgx-v100*2").summary()
    assert s["nodes"] == 2
    nv = s["nvlink_gbps"]
    assert isinstance(nv, dict) and nv["n0.gpu0"]["n0.gpu3"] == 48.0 and "n1.gpu0" not in nv["n0.gpu0"]


# ---- rejected inputs --------------------------------------------------------------------------------
def test_self_link_is_rejected() -> None:
    """A link from gpu0 to gpu0 names gpu0."""
    with pytest.raises(ConfigError, match=r"gpu0-gpu0 joins a device to itself"):
        Link("gpu0", "gpu0", "nvlink", 24.0)


def test_link_to_unknown_device_is_rejected() -> None:
    """A link naming an undeclared device names that device."""
    with pytest.raises(ConfigError, match=r"unknown device 'gpu9'"):
        Topology("t", (Device("host", "host"), Device("gpu0", "gpu")), (Link("host", "gpu9", "pcie", 12.0),))


def test_duplicate_device_and_link_are_rejected() -> None:
    """Two devices called gpu0, or two links gpu0-gpu1 (either direction), are named."""
    with pytest.raises(ConfigError, match=r"names device 'gpu0' twice"):
        Topology("t", (Device("gpu0", "gpu"), Device("gpu0", "gpu")), ())
    devs = (Device("gpu0", "gpu"), Device("gpu1", "gpu"))
    with pytest.raises(ConfigError, match=r"two links between gpu1 and gpu0"):
        Topology("t", devs, (Link("gpu0", "gpu1", "nvlink", 24.0), Link("gpu1", "gpu0", "nvlink", 24.0)))


@pytest.mark.parametrize(("gbps", "back", "shown"), [(0.0, None, "0.0"), (-1.0, None, "-1.0"),
                                                     (12.0, 0.0, "0.0"), (float("nan"), None, "nan")])
def test_non_positive_bandwidth_is_rejected(gbps: float, back: float | None, shown: str) -> None:
    """Zero, negative or NaN bandwidth in either direction is named in the error."""
    with pytest.raises(ConfigError, match=rf"bandwidth {shown} GB/s; it must be > 0"):
        Link("a", "b", "pcie", gbps, back)


def test_unknown_kinds_are_rejected() -> None:
    """Unknown device and link kinds are named, with the allowed kinds listed."""
    with pytest.raises(ConfigError, match=r"kind 'tpu'; use one of host, gpu, pcie"):
        Device("x", "tpu")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"kind 'infiniband'; use one of pcie, nvlink, nic, net"):
        Link("a", "b", "infiniband", 12.0)  # type: ignore[arg-type]


def test_bad_device_names_and_sizes_are_rejected() -> None:
    """Names with spaces, empty names and negative memory are named."""
    with pytest.raises(ConfigError, match=r"'gpu 0' must be non-empty"):
        Device("gpu 0", "gpu")
    with pytest.raises(ConfigError, match=r"device 'gpu0': memory_bytes and node must be >= 0"):
        Device("gpu0", "gpu", memory_bytes=-1)


def test_bad_topology_rates_are_rejected() -> None:
    """pcie_p2p_gbps <= 0 is named with the topology."""
    with pytest.raises(ConfigError, match=r"topology 't': pcie_p2p_gbps and pageable_gbps must be > 0"):
        Topology("t", (Device("host", "host"),), (), pcie_p2p_gbps=0.0)


def test_unknown_preset_and_bad_count_are_rejected() -> None:
    """An unknown preset lists the presets; 'dgx-v100*x' names the spec; '*0' the count."""
    with pytest.raises(ConfigError, match=r"unknown topology preset 'dgx-v200'; choose one of dgx-v100, dgx-a100"):
        preset("dgx-v200")
    with pytest.raises(ConfigError, match=r"'dgx-v100\*x': the node count after '\*' must be an integer"):
        preset("dgx-v100*x")
    with pytest.raises(ConfigError, match=r"replicate a topology 0 times"):
        preset("dgx-v100*0")


def test_unknown_device_lookup_lists_devices() -> None:
    """device('gpu9') names gpu9 and lists what exists."""
    with pytest.raises(ConfigError, match=r"has no device 'gpu9'; it has gpu0, host, pcie0"):
        preset("h100-x1").device("gpu9")
