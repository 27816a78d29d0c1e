"""Built-in machines. Every figure says where it comes from.

Rates are per direction, GB/s. "Seed 000" is FaaSTube, "seed 001" is GROUTER (see docs/design/policies.md).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigError
from ..units import GiB
from .model import Device, Link, Topology

#: One NVLink 2.0 brick on V100, per direction (seed 000 §6.2 and seed 001 §4.3.3: "24 or 48 GB/s").
V100_BRICK_GBPS = 24.0
#: Pinned host<->GPU over PCIe 3.0 x16 (seed 000 §2.2: "12GB/s under PCIe 3.0").
PCIE3_GBPS = 12.0
#: GPU<->GPU without NVLink on p3.16xlarge (seed 000 §3.2, Fig. 6a).
V100_P2P_PCIE_GBPS = 7.9
#: Pageable host memory over PCIe (seed 000 §3.2, Fig. 5b: 3 GB/s instead of 12).
PAGEABLE_GBPS = 3.0
#: NVLink 3.0 through NVSwitch on A100: 12 links x 25 GB/s per direction (NVIDIA A100 datasheet).
A100_NVSWITCH_GBPS = 300.0
#: PCIe 4.0 x16, pinned, as typically measured by CUDA's bandwidthTest (our assumption, ~80% of 32 GB/s).
PCIE4_GBPS = 24.0
#: NICs as seed 001 §6 describes its testbeds (4x 100 Gb/s on DGX-V100, 8x 200 Gb/s on DGX-A100);
#: note that stock p3.16xlarge / p4d.24xlarge instances list less (25 Gb/s; 4x 100 Gb/s EFA).
V100_NIC_GBPS = 100 / 8
A100_NIC_GBPS = 200 / 8
#: GPU<->GPU over PCIe without NVLink on PCIe 4.0 machines: our assumption (no source), 0.8 and 0.5 of
#: the host rate for a switch-attached and a root-complex path respectively.
#: PCIe 5.0 x16, pinned (our assumption for the lent H100 until issue 5 measures it).
PCIE5_GBPS = 50.0

#: DGX-V100 / p3.16xlarge hybrid cube mesh, as listed in issue 3 (seed 000 Fig. 4b, Fig. 6a).
V100_TWO_BRICKS = ((0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7))
V100_ONE_BRICK = ((0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7))


def _pcie_tree(n_switches: int, gpus_per_switch: int, host_gbps: float, gpu_gbps: float,
               gpu_model: str, gpu_mem: int, nics_per_switch: int = 0, nic_gbps: float = 0.0
               ) -> tuple[list[Device], list[Link]]:
    """Host memory, PCIe switches, the GPUs below them (in order) and NICs on the same switches."""
    devices = [Device("host", "host")]
    links: list[Link] = []
    g = 0
    for s in range(n_switches):
        sw = f"pcie{s}"
        devices.append(Device(sw, "pcie"))
        links.append(Link("host", sw, "pcie", host_gbps))
        for _ in range(gpus_per_switch):
            devices.append(Device(f"gpu{g}", "gpu", model=gpu_model, memory_bytes=gpu_mem))
            links.append(Link(sw, f"gpu{g}", "pcie", gpu_gbps))
            g += 1
        for k in range(nics_per_switch):
            nic = f"nic{s * nics_per_switch + k}"
            devices.append(Device(nic, "nic"))
            links.append(Link(sw, nic, "nic", nic_gbps))
    return devices, links


def dgx_v100() -> Topology:
    """p3.16xlarge: 8 V100 16 GB, hybrid cube-mesh NVLink, 4 PCIe switches, 4 x 100 Gb/s NICs."""
    devices, links = _pcie_tree(4, 2, PCIE3_GBPS, PCIE3_GBPS, "V100-16GB", 16 * GiB, 1, V100_NIC_GBPS)
    for bricks, pairs in ((2, V100_TWO_BRICKS), (1, V100_ONE_BRICK)):
        for a, b in pairs:
            links.append(Link(f"gpu{a}", f"gpu{b}", "nvlink", bricks * V100_BRICK_GBPS, bricks=bricks))
    return Topology("dgx-v100", tuple(devices), tuple(links), V100_P2P_PCIE_GBPS, PAGEABLE_GBPS,
                    "AWS p3.16xlarge: 8x V100 16 GB, NVLink hybrid cube mesh (24 GB/s per brick),"
                    " GPU pairs share 4 PCIe 3.0 switches, 4x 100 Gb/s NICs")


def dgx_a100() -> Topology:
    """p4d.24xlarge: 8 A100 40 GB on NVSwitch, 4 PCIe 4.0 switches, 8 x 200 Gb/s NICs."""
    devices, links = _pcie_tree(4, 2, PCIE4_GBPS, PCIE4_GBPS, "A100-40GB", 40 * GiB, 2, A100_NIC_GBPS)
    devices.append(Device("nvswitch", "nvswitch"))
    links += [Link(f"gpu{g}", "nvswitch", "nvlink", A100_NVSWITCH_GBPS, bricks=12) for g in range(8)]
    return Topology("dgx-a100", tuple(devices), tuple(links), PCIE4_GBPS * 0.8, PAGEABLE_GBPS,
                    "AWS p4d.24xlarge: 8x A100 40 GB on NVSwitch (300 GB/s per GPU per direction),"
                    " GPU pairs share 4 PCIe 4.0 switches, 8x 200 Gb/s NICs")


def four_a10() -> Topology:
    """4 A10 24 GB, PCIe only, each GPU on its own PCIe 4.0 link (seed 000 §9.3, seed 001 §6.5)."""
    devices, links = _pcie_tree(4, 1, PCIE4_GBPS, PCIE4_GBPS, "A10-24GB", 24 * GiB, 0)
    devices.append(Device("nic0", "nic"))
    links.append(Link("pcie0", "nic0", "nic", 100 / 8))
    return Topology("4xa10", tuple(devices), tuple(links), PCIE4_GBPS * 0.5, PAGEABLE_GBPS,
                    "4x A10 24 GB, no NVLink, one PCIe 4.0 link each (rates assumed), 1x 100 Gb/s NIC")


def h100_x1(pinned_gbps: float = PCIE5_GBPS, pageable_gbps: float = PAGEABLE_GBPS,
            description: str = "") -> Topology:
    """The GPU machine this project can borrow: one H100 (about 78 GiB usable). The rates are
    assumptions until :func:`gfaas.topology.calibrate.calibrate_h100` fits them to a measured run."""
    devices, links = _pcie_tree(1, 1, pinned_gbps, pinned_gbps, "H100-80GB", 80 * 10**9, 0)
    return Topology("h100-x1", tuple(devices), tuple(links), pinned_gbps, pageable_gbps,
                    description or "1x H100 80 GB on PCIe 5.0 (host rate assumed until measured on the lent machine)")


#: H800 SXM (NVIDIA H800 datasheet): NVLink 400 GB/s in all, i.e. 200 GB/s per direction per GPU
#: (the H100 SXM has 900 GB/s; the export variant cuts NVLink, not HBM or compute).
H800_NVLINK_GBPS = 200.0
#: One 400 Gb/s InfiniBand NIC per node, as both testbeds of seed 002 (Table 1) have.
H800_NIC_GBPS = 400 / 8
#: H800 GPU memory: 80 GB HBM3 (datasheet).
H800_MEMORY = 80 * 10**9


def h800_x1() -> Topology:
    """Seed 002 Testbed1 node: 1x H800 80 GB and one 400 Gb/s IB NIC on the GPU's PCIe 5.0 switch
    (so GPUDirect RDMA goes GPU -> switch -> NIC; the PCIe rate is our assumption, see PCIE5_GBPS)."""
    devices, links = _pcie_tree(1, 1, PCIE5_GBPS, PCIE5_GBPS, "H800-80GB", H800_MEMORY, 1, H800_NIC_GBPS)
    return Topology("h800x1", tuple(devices), tuple(links), PCIE5_GBPS * 0.8, PAGEABLE_GBPS,
                    "seed 002 Testbed1 node: 1x H800 80 GB, 1x 400 Gb/s InfiniBand NIC, PCIe 5.0 (rate assumed)")


def h800_x4() -> Topology:
    """Seed 002 Testbed2 node: 4x H800 80 GB on NVSwitch (200 GB/s per GPU per direction) and one
    400 Gb/s IB NIC. The PCIe layout is not in the paper; we put the four GPUs and the NIC under one
    PCIe 5.0 switch, each GPU on its own x16 link, so a GPU's RDMA traffic shares only the NIC."""
    devices, links = _pcie_tree(1, 4, PCIE5_GBPS, PCIE5_GBPS, "H800-80GB", H800_MEMORY, 1, H800_NIC_GBPS)
    devices.append(Device("nvswitch", "nvswitch"))
    links += [Link(f"gpu{g}", "nvswitch", "nvlink", H800_NVLINK_GBPS, bricks=8) for g in range(4)]
    return Topology("h800x4", tuple(devices), tuple(links), PCIE5_GBPS * 0.8, PAGEABLE_GBPS,
                    "seed 002 Testbed2 node: 4x H800 80 GB on NVSwitch (200 GB/s per GPU per direction),"
                    " 1x 400 Gb/s InfiniBand NIC, PCIe 5.0 (layout and rate assumed)")


def h800_x8() -> Topology:
    """Seed 001 §6.4's MoA nodes: 8x H800 80 GB on NVSwitch (200 GB/s per GPU per direction) and
    200 Gb/s networking; like a DGX, we give each pair of GPUs a PCIe 5.0 switch with two 200 Gb/s
    NICs (8 NICs; the paper says the nodes have several, not how they hang)."""
    devices, links = _pcie_tree(4, 2, PCIE5_GBPS, PCIE5_GBPS, "H800-80GB", H800_MEMORY, 2, 200 / 8)
    devices.append(Device("nvswitch", "nvswitch"))
    links += [Link(f"gpu{g}", "nvswitch", "nvlink", H800_NVLINK_GBPS, bricks=8) for g in range(8)]
    return Topology("h800x8", tuple(devices), tuple(links), PCIE5_GBPS * 0.8, PAGEABLE_GBPS,
                    "seed 001 §6.4 MoA node: 8x H800 80 GB on NVSwitch (200 GB/s per GPU per direction),"
                    " 4 PCIe 5.0 switches with 2 GPUs and 2x 200 Gb/s NICs each (layout and PCIe rate assumed)")


def cpu_only() -> Topology:
    """A machine without GPUs (CI): host memory only."""
    return Topology("cpu-only", (Device("host", "host"),), (), description="no GPU: host memory only")


PRESETS: dict[str, Callable[[], Topology]] = {
    "dgx-v100": dgx_v100,
    "dgx-a100": dgx_a100,
    "4xa10": four_a10,
    "h100-x1": h100_x1,
    "cpu-only": cpu_only,
    "h800x1": h800_x1,
    "h800x4": h800_x4,
    "h800x8": h800_x8,
}


def preset(name: str) -> Topology:
    """A preset by name; ``NAME*N`` (e.g. ``dgx-v100*4``) replicates it into an N-node cluster."""
    base, _, count = name.partition("*")
    if base not in PRESETS:
        raise ConfigError(f"unknown topology preset {base!r}; choose one of {', '.join(PRESETS)} (or a YAML file)")
    topo = PRESETS[base]()
    if count:
        try:
            n = int(count)
        except ValueError:
            raise ConfigError(f"{name!r}: the node count after '*' must be an integer, e.g. {base}*4") from None
        topo = topo.replicate(n)
    return topo
