"""Local detection: `nvidia-smi topo -m` matrices become the same topologies the presets describe."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from itertools import combinations
from pathlib import Path

import pytest

from gfaas.errors import ConfigError
from gfaas.topology import Topology, preset
from gfaas.topology.detect import detect, parse_nvidia_smi_topo, topology_from_smi
from gfaas.topology.presets import GiB

# (a) DGX-1V (8x V100 SXM2, hybrid cube mesh, 4 ConnectX-4 on the 4 PCIe switches), an older
# driver that names NIC columns after the device. NVLinked pairs show NV# and hide their PCIe
# relation, so only the NIC columns reveal that GPU0/GPU1 share mlx5_0's switch.
DGX1V = """\
	GPU0	GPU1	GPU2	GPU3	GPU4	GPU5	GPU6	GPU7	mlx5_0	mlx5_1	mlx5_2	mlx5_3	CPU Affinity
GPU0	 X 	NV1	NV1	NV2	NV2	SYS	SYS	SYS	PIX	PHB	SYS	SYS	0-19,40-59
GPU1	NV1	 X 	NV2	NV1	SYS	NV2	SYS	SYS	PIX	PHB	SYS	SYS	0-19,40-59
GPU2	NV1	NV2	 X 	NV2	SYS	SYS	NV1	SYS	PHB	PIX	SYS	SYS	0-19,40-59
GPU3	NV2	NV1	NV2	 X 	SYS	SYS	SYS	NV1	PHB	PIX	SYS	SYS	0-19,40-59
GPU4	NV2	SYS	SYS	SYS	 X 	NV1	NV1	NV2	SYS	SYS	PIX	PHB	20-39,60-79
GPU5	SYS	NV2	SYS	SYS	NV1	 X 	NV2	NV1	SYS	SYS	PIX	PHB	20-39,60-79
GPU6	SYS	SYS	NV1	SYS	NV1	NV2	 X 	NV2	SYS	SYS	PHB	PIX	20-39,60-79
GPU7	SYS	SYS	SYS	NV1	NV2	NV1	NV2	 X 	SYS	SYS	PHB	PIX	20-39,60-79
mlx5_0	PIX	PIX	PHB	PHB	SYS	SYS	SYS	SYS	 X 	PHB	SYS	SYS
mlx5_1	PHB	PHB	PIX	PIX	SYS	SYS	SYS	SYS	PHB	 X 	SYS	SYS
mlx5_2	SYS	SYS	SYS	SYS	PIX	PIX	PHB	PHB	SYS	SYS	 X 	PHB
mlx5_3	SYS	SYS	SYS	SYS	PHB	PHB	PIX	PIX	SYS	SYS	PHB	 X
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe switches (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing a single PCIe switch
  NV#  = Connection traversing a bonded set of # NVLinks
"""

# (b) One H100 PCIe on a recent driver, which underlines the header with ANSI escapes.
H100_PCIE = (
    "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \t0-63\t0\t\tN/A\n"
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)

# (c) Four PCIe GPUs on two sockets, a dual-port ConnectX-6 (NIC0/NIC1) below GPU0/GPU1's switch
# tree, the affinity columns of recent drivers and the NIC legend naming the ports.
PCIE4 = """\
	GPU0	GPU1	GPU2	GPU3	NIC0	NIC1	CPU Affinity	NUMA Affinity	GPU NUMA ID
GPU0	 X 	PXB	SYS	SYS	PXB	PXB	0-15,32-47	0		N/A
GPU1	PXB	 X 	SYS	SYS	PXB	PXB	0-15,32-47	0		N/A
GPU2	SYS	SYS	 X 	PIX	SYS	SYS	16-31,48-63	1		N/A
GPU3	SYS	SYS	PIX	 X 	SYS	SYS	16-31,48-63	1		N/A
NIC0	PXB	PXB	SYS	SYS	 X 	PIX
NIC1	PXB	PXB	SYS	SYS	PIX	 X
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1
"""


def rate(t: Topology, src: str, dst: str) -> float:
    """The directed edge's GB/s; fails the test if the two are not linked."""
    e = t.edge(src, dst)
    assert e is not None, f"{src} -> {dst} not linked"
    return e.gbps


def square(labels: list[str], cell: Callable[[str, str], str], tail: str = "") -> str:
    """A tab-separated matrix as nvidia-smi prints it (for synthetic cases)."""
    out = ["\t" + "\t".join(labels) + tail]
    out += [lab + "\t" + "\t".join(" X " if lab == c else cell(lab, c) for c in labels) for lab in labels]
    return "\n".join(out) + "\n"


def gpu_pairs(t: Topology) -> list[tuple[str, str]]:
    return list(combinations(t.gpus, 2))


def link_set(t: Topology) -> set[tuple[str, str, str, float, float, int]]:
    """Links as unordered pairs with both rates, so that the order of devices and links does not matter."""
    out: set[tuple[str, str, str, float, float, int]] = set()
    for ln in t.links:
        a, b = sorted((ln.a, ln.b))
        fwd, back = (ln.gbps, ln.reverse_gbps) if a == ln.a else (ln.reverse_gbps, ln.gbps)
        out.add((a, b, ln.kind, fwd, back, ln.bricks))
    return out


# ---- parsing -------------------------------------------------------------------------------------
def test_parse_dgx1v_matrix() -> None:
    """(a) columns in order, NIC names map to themselves, cells and bricks read both ways."""
    d = parse_nvidia_smi_topo(DGX1V)
    assert d.gpus == tuple(f"GPU{i}" for i in range(8)) and d.nics == ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
    assert d.nic_names["mlx5_2"] == "mlx5_2"
    assert (d.cell("GPU0", "GPU3"), d.cell("GPU3", "GPU0"), d.cell("GPU0", "GPU5")) == ("NV2", "NV2", "SYS")
    assert (d.nvlink_bricks("GPU0", "GPU1"), d.nvlink_bricks("GPU0", "mlx5_0")) == (1, 0)
    assert d.cell("GPU6", "mlx5_3") == "PIX" and d.cell("GPU6", "GPU6") == "X"


def test_parse_ignores_affinity_columns_and_ansi() -> None:
    """(b) and (c): CPU/NUMA affinity columns and escape codes are not matrix columns; legend names NICs."""
    assert parse_nvidia_smi_topo(H100_PCIE).columns == ("GPU0",)
    d = parse_nvidia_smi_topo(PCIE4)
    assert d.columns == ("GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1")
    assert d.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert d.cell("GPU1", "NIC1") == "PXB"


def test_parse_accepts_space_aligned_text() -> None:
    """Output pasted from a terminal (tabs expanded to spaces) parses to the same matrix."""
    assert parse_nvidia_smi_topo(DGX1V.expandtabs(8)) == parse_nvidia_smi_topo(DGX1V)


# ---- (a) DGX-1V == preset dgx-v100 -----------------------------------------------------------------
def test_dgx1v_has_the_nvlink_matrix_of_the_preset() -> None:
    """(a): nvlink_gbps(a, b) equals preset('dgx-v100') for all 56 ordered pairs (24 GB/s bricks)."""
    t, p = topology_from_smi(DGX1V, "Tesla V100-SXM2-16GB", 16 * GiB), preset("dgx-v100")
    assert t.gpus == p.gpus
    assert [t.nvlink_gbps(a, b) for a in t.gpus for b in t.gpus if a != b] == [
        p.nvlink_gbps(a, b) for a in p.gpus for b in p.gpus if a != b]
    assert {t.links[i].bricks for i in range(len(t.links)) if t.links[i].kind == "nvlink"} == {1, 2}


def test_dgx1v_has_the_pcie_pairing_of_the_preset() -> None:
    """(a): GPU pairs share switches as in the preset; devices and every link equal the preset's."""
    t, p = topology_from_smi(DGX1V, "V100-16GB", 16 * GiB), preset("dgx-v100")
    assert [t.pcie_switch_of(g) for g in t.gpus] == [p.pcie_switch_of(g) for g in p.gpus]
    assert [(d.name, d.kind) for d in t.devices] == [(d.name, d.kind) for d in p.devices]
    assert link_set(t) == link_set(p)
    assert [t.device(g) for g in t.gpus] == [p.device(g) for g in p.gpus]
    assert [t.device(f"nic{i}").model for i in range(4)] == [f"mlx5_{i}" for i in range(4)]
    assert t.name == "local"


def test_brick_rate_is_a_parameter() -> None:
    """brick_gbps=25 (NVLink 2 nominal) scales every NVLink: 50 and 25 GB/s."""
    t = topology_from_smi(DGX1V, brick_gbps=25.0)
    assert {t.nvlink_gbps(a, b) for a, b in gpu_pairs(t)} == {0.0, 25.0, 50.0}


# ---- (b) single H100, (c) 4-GPU PCIe box ----------------------------------------------------------
def test_single_h100() -> None:
    """(b): host, one switch, gpu0 with the given model and size; at 50 GB/s the links equal h100-x1's."""
    t = topology_from_smi(H100_PCIE, "NVIDIA H100 PCIe", 81559 << 20, pcie_gbps=50.0)
    assert [d.name for d in t.devices] == ["host", "pcie0", "gpu0"]
    assert t.device("gpu0").model == "NVIDIA H100 PCIe" and t.device("gpu0").memory_bytes == 81559 << 20
    assert link_set(t) == link_set(preset("h100-x1"))
    assert rate(topology_from_smi(H100_PCIE), "host", "pcie0") == 12.0


def test_four_pcie_gpus_with_nics() -> None:
    """(c): PXB/PIX pairs share a switch (NICs included), SYS pairs do not; no NVLink."""
    t = topology_from_smi(PCIE4, "NVIDIA A10", 24 * GiB)
    assert [d.name for d in t.devices] == ["host", "pcie0", "gpu0", "gpu1", "nic0", "nic1", "pcie1", "gpu2", "gpu3"]
    assert [t.pcie_switch_of(g) for g in t.gpus] == ["pcie0", "pcie0", "pcie1", "pcie1"]
    assert t.neighbours("nic1") == ["pcie0"] and t.device("nic1").model == "mlx5_1"
    assert rate(t, "pcie0", "nic0") == 12.5
    assert all(t.nvlink_gbps(a, b) == 0.0 for a, b in gpu_pairs(t))
    assert not any(ln.kind == "nvlink" for ln in t.links)


def test_phb_node_sys_put_each_gpu_on_its_own_switch() -> None:
    """Four GPUs that are PHB/NODE/SYS to one another get four switches, like the 4xa10 preset."""
    rel = {frozenset(("GPU0", "GPU1")): "PHB", frozenset(("GPU2", "GPU3")): "NODE"}
    text = square([f"GPU{i}" for i in range(4)], lambda a, b: rel.get(frozenset((a, b)), "SYS"), "\tCPU Affinity")
    t = topology_from_smi(text, pcie_gbps=24.0)
    assert [t.pcie_switch_of(g) for g in t.gpus] == ["pcie0", "pcie1", "pcie2", "pcie3"]
    four = preset("4xa10")
    assert link_set(t) == {x for x in link_set(four) if "nic0" not in x}


def test_nvswitch_machine_becomes_one_nvswitch() -> None:
    """8 GPUs all NV12 (DGX A100): one nvswitch; at 25 GB/s per brick every pair is 300 GB/s as in dgx-a100."""
    text = square([f"GPU{i}" for i in range(8)], lambda a, b: "NV12")
    t = topology_from_smi(text, brick_gbps=25.0)
    assert t.of_kind("nvswitch") == ["nvswitch"]
    assert all(t.nvlink_gbps(a, b) == 300.0 and t.edge(a, b) is None for a, b in gpu_pairs(t))
    p = preset("dgx-a100")
    assert {x for x in link_set(t) if x[2] == "nvlink"} == {x for x in link_set(p) if x[2] == "nvlink"}


def test_small_full_mesh_stays_direct() -> None:
    """4 GPUs all NV2 (6 bricks per GPU, possible without a switch) stay direct links."""
    t = topology_from_smi(square([f"GPU{i}" for i in range(4)], lambda a, b: "NV2"))
    assert t.of_kind("nvswitch") == [] and rate(t, "gpu0", "gpu3") == 48.0


# ---- malformed text ------------------------------------------------------------------------------
def lines_of(text: str) -> list[str]:
    return text.split("\n")


def test_no_header_is_rejected() -> None:
    """Without the header line: the GPU0 row is named; without any GPU0 at all: 'no header row'."""
    with pytest.raises(ConfigError, match=r"line 1: row 'GPU0' comes before any header row"):
        parse_nvidia_smi_topo("\n".join(lines_of(DGX1V)[1:]))
    with pytest.raises(ConfigError, match=r"no header row naming GPU0"):
        parse_nvidia_smi_topo("No devices were found\n")


def test_ragged_row_is_rejected() -> None:
    """A row with a cell missing is named with its line and the counts."""
    rows = lines_of(DGX1V)
    rows[4] = "\t".join(rows[4].split("\t")[:7])  # the GPU3 row cut off after 6 cells
    with pytest.raises(ConfigError, match=r"line 5: row 'GPU3' has 6 cells for 12 columns"):
        parse_nvidia_smi_topo("\n".join(rows))
    rows = lines_of(DGX1V)
    rows[4] = rows[4].replace("\tNV1\t", "\t", 1)  # one cell lost mid-row: the affinity pads the count
    with pytest.raises(ConfigError, match=r"line 5: row 'GPU3' has 'X' \(self\) in column 'GPU2'; .* misaligned"):
        parse_nvidia_smi_topo("\n".join(rows))


def test_unknown_cell_is_rejected() -> None:
    """'NVX' (and NV0) in a row is named with row, column and the cells expected."""
    with pytest.raises(ConfigError, match=r"line 2: row 'GPU0', column 'GPU1' has unknown cell 'NVX'; expected NV<n>"):
        parse_nvidia_smi_topo(DGX1V.replace("NV1", "NVX", 1))
    with pytest.raises(ConfigError, match=r"unknown cell 'NV0'"):
        parse_nvidia_smi_topo(DGX1V.replace("NV1", "NV0", 1))


def test_inconsistent_matrices_are_rejected() -> None:
    """Asymmetric cells, a missing row, an unknown row and a non-X diagonal are each named."""
    with pytest.raises(ConfigError, match=r"row 'GPU0' says 'NV2' for 'GPU1' but row 'GPU1' says 'NV1'"):
        parse_nvidia_smi_topo(DGX1V.replace("NV1", "NV2", 1))
    rows = lines_of(DGX1V)
    with pytest.raises(ConfigError, match=r"no row for mlx5_3"):
        parse_nvidia_smi_topo("\n".join(rows[:12] + rows[13:]))
    with pytest.raises(ConfigError, match=r"line 13: row 'mlx5_9' is not a column of the header"):
        parse_nvidia_smi_topo(DGX1V.replace("\nmlx5_3", "\nmlx5_9"))
    with pytest.raises(ConfigError, match=r"row 'GPU0' has 'NV1' on the diagonal"):
        parse_nvidia_smi_topo(DGX1V.replace(" X ", "NV1", 1))


# ---- detect() with a fake nvidia-smi -----------------------------------------------------------------
def fake_smi(tmp_path: Path, topo: str, query: str = "", rc: int = 0, sleep: float = 0.0) -> None:
    """An executable 'nvidia-smi' on PATH printing canned output (topo -m, or the GPU query)."""
    (tmp_path / "topo.txt").write_text(topo)
    (tmp_path / "query.txt").write_text(query)
    body = f"exec sleep {sleep}\n" if sleep else ""
    body += (f'if [ "$1" = topo ]; then cat "{tmp_path}/topo.txt"; else cat "{tmp_path}/query.txt"; fi\n'
             f"exit {rc}\n")
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The fake comes first; the system directories after it provide sh, cat and sleep.
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.defpath}")
    return tmp_path


def test_detect_builds_the_local_machine(on_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A working nvidia-smi: 'local', per-GPU model and MiB -> bytes from the query, logged at INFO."""
    fake_smi(on_path, DGX1V, "".join(f"Tesla V100-SXM2-16GB, {16160 + i}\n" for i in range(8)))
    with caplog.at_level(logging.INFO, logger="gfaas.topology.detect"):
        t = detect()
    assert t.name == "local" and len(t.gpus) == 8
    assert t.device("gpu7").model == "Tesla V100-SXM2-16GB" and t.device("gpu7").memory_bytes == 16167 << 20
    assert t.description == "detected by nvidia-smi: 8x Tesla V100-SXM2-16GB"
    assert [t.nvlink_gbps("gpu0", g) for g in t.gpus[1:]] == [24.0, 24.0, 48.0, 48.0, 0.0, 0.0, 0.0]
    assert "detected 8 GPU(s) (Tesla V100-SXM2-16GB), 4 PCIe switch(es), 16 NVLink link(s)" in caplog.text


def test_detect_mismatched_query_leaves_models_blank(on_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A query that lists another number of GPUs than topo -m is logged and ignored."""
    fake_smi(on_path, H100_PCIE, "NVIDIA H100 PCIe, 81559\nNVIDIA H100 PCIe, 81559\n")
    t = detect()
    assert t.device("gpu0").model == "" and "listed 2 GPUs but topo -m 1" in caplog.text


def host_only(t: Topology) -> bool:
    return t.name == "local" and [d.name for d in t.devices] == ["host"] and t.links == ()


def test_detect_without_nvidia_smi(on_path: Path, caplog: pytest.LogCaptureFixture,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No nvidia-smi on PATH: host only, and INFO says why; nothing raised."""
    (on_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(on_path / "bin"))  # only the empty directory, even on a GPU machine
    with caplog.at_level(logging.INFO, logger="gfaas.topology.detect"):
        t = detect()
    assert host_only(t) and "nvidia-smi is not on PATH" in caplog.text


def test_detect_without_a_driver(on_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """nvidia-smi exiting 9 (no driver): host only, the first line of its message logged."""
    fake_smi(on_path, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", rc=9)
    with caplog.at_level(logging.INFO, logger="gfaas.topology.detect"):
        t = detect()
    assert host_only(t)
    assert "`nvidia-smi topo -m` exited 9: NVIDIA-SMI has failed because it couldn't communicate" in caplog.text
    assert t.description.startswith("host memory only: `nvidia-smi topo -m` exited 9")


def test_detect_without_devices_or_answer(on_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """'No devices were found' with rc 0, or a hung nvidia-smi (timeout): host only."""
    fake_smi(on_path, "No devices were found\n")
    with caplog.at_level(logging.INFO, logger="gfaas.topology.detect"):
        assert host_only(detect())
    assert "nvidia-smi lists no GPU" in caplog.text
    (on_path / "bin" / "nvidia-smi").unlink()
    (on_path / "bin").rmdir()
    fake_smi(on_path, DGX1V, sleep=5)
    with caplog.at_level(logging.INFO, logger="gfaas.topology.detect"):
        assert host_only(detect(timeout=0.3))
    assert "did not answer within 0.3 s" in caplog.text


def test_detect_unparseable_output_raises(on_path: Path) -> None:
    """Output that names GPUs but does not parse is a ConfigError that points to presets/files."""
    fake_smi(on_path, DGX1V.replace("NV1", "NVX", 1))
    with pytest.raises(ConfigError, match=r"unknown cell 'NVX'.*pass a preset or YAML file instead"):
        detect()
