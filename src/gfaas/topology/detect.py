"""Detect the local machine's topology from ``nvidia-smi``.

``nvidia-smi topo -m`` prints a matrix with one row and one column per GPU (and per NIC on
machines with RDMA NICs), followed by CPU/NUMA affinity columns and a legend::

            GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity   GPU NUMA ID
    GPU0     X      NV2     PIX     0-23    0               N/A
    GPU1    NV2      X      PIX     0-23    0               N/A
    NIC0    PIX     PIX      X

    Legend: ...
    NIC Legend:
      NIC0: mlx5_0

Each cell says how two devices are connected: ``NV#`` a bonded set of # NVLinks ("bricks");
``PIX`` at most one PCIe bridge and ``PXB`` several bridges without the host bridge (both: the
two sit below the same PCIe switch tree); ``PHB`` through a PCIe host bridge, ``NODE`` between
host bridges of one NUMA node, ``SYS`` (``SOC`` on old drivers) across the CPU interconnect
(all three: different switches). Older drivers name NIC columns after the device (``mlx5_0``).

How the matrix becomes a :class:`Topology`:

* ``NV#`` -> an ``nvlink`` link of ``# * brick_gbps`` GB/s with ``bricks=#``. The per-brick rate
  depends on the GPU generation, which the matrix does not say, so it is a parameter: about 25
  GB/s per direction for NVLink 2 (V100; 24 measured, the dgx-v100 preset's figure), NVLink 3
  (A100) and NVLink 4 (H100) alike, but 20 GB/s for NVLink 1 (P100).
* If every GPU pair shows the same ``NV#`` and the bricks per GPU would exceed what one GPU has
  (``# * (n-1) > 18``), the GPUs hang off NVSwitches (DGX A100/H100); that becomes one
  ``nvswitch`` device with one link per GPU, as in the dgx-a100 preset, because the per-pair
  rate is shared by all of a GPU's peers.
* PCIe switches: two devices (GPUs or NICs) whose cell is ``PIX``/``PXB`` share a switch,
  transitively. A pair joined by NVLink shows ``NV#`` instead of its PCIe relation, so on a DGX-1
  the GPU pairs are found through the NIC both are ``PIX`` to. Every device without such a
  partner gets a switch of its own. Each switch links to ``host`` at ``pcie_gbps`` (default 12
  GB/s: pinned copies over PCIe 3.0 x16, seed 000 §2.2 - conservative on newer machines) and to
  its GPUs at the same rate; NICs link to their switch at ``nic_gbps`` (default 12.5 = 100 Gb/s).

Switches are numbered by their lowest GPU (then NIC) and devices listed host, then per switch
the switch, its GPUs, its NICs: the order the presets use, so a detected DGX-1V compares
directly with ``preset("dgx-v100")``.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError
from .model import Device, Link, Topology

log = logging.getLogger(__name__)

#: Default per-brick NVLink rate, GB/s per direction (V100 NVLink 2 as the dgx-v100 preset uses).
BRICK_GBPS = 24.0
#: Default host<->switch and switch<->GPU rate: pinned PCIe 3.0 x16 (seed 000 §2.2, "12GB/s").
PCIE_GBPS = 12.0
#: Default NIC rate: 100 Gb/s.
NIC_GBPS = 100 / 8
#: Most NVLinks one GPU has (H100: 18); more bricks per GPU than this means NVSwitches.
MAX_NVLINKS_PER_GPU = 18
#: Seconds any one nvidia-smi call may take before detection gives up on it.
SMI_TIMEOUT_S = 10.0

_PCIE_CELLS = ("PIX", "PXB", "PHB", "NODE", "SYS", "SOC")
_SAME_SWITCH = ("PIX", "PXB")
_NV = re.compile(r"NV(\d+)")
# A matrix column is a GPU index or a NIC (NIC0, or the device name on old drivers: mlx5_0);
# "CPU Affinity" etc. start the columns to ignore.
_COLUMN = re.compile(r"[A-Za-z][\w.:-]*\d")
_GPU = re.compile(r"GPU(\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")


@dataclass(frozen=True)
class DetectedTopo:
    """The parsed matrix of ``nvidia-smi topo -m``.

    ``columns`` are the matrix labels in order (``GPU0``.., then NICs); ``cells`` maps every
    ordered pair of different labels to its cell (``NV2``, ``PIX``, ...); ``nic_names`` maps a
    NIC label to its device name (``NIC0`` -> ``mlx5_0`` from the NIC legend; old-style labels
    map to themselves).
    """

    columns: tuple[str, ...]
    cells: Mapping[tuple[str, str], str] = field(repr=False)
    nic_names: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if _GPU.fullmatch(c))

    @property
    def nics(self) -> tuple[str, ...]:
        return tuple(c for c in self.columns if not _GPU.fullmatch(c))

    def cell(self, a: str, b: str) -> str:
        return "X" if a == b else self.cells[(a, b)]

    def nvlink_bricks(self, a: str, b: str) -> int:
        """Bonded NVLinks between a and b (0 when the cell is a PCIe relation)."""
        m = _NV.fullmatch(self.cell(a, b))
        return int(m.group(1)) if m else 0


def _valid_cell(cell: str) -> bool:
    return cell in _PCIE_CELLS or (_NV.fullmatch(cell) is not None and int(cell[2:]) > 0)


def parse_nvidia_smi_topo(text: str) -> DetectedTopo:
    """Parse the output of ``nvidia-smi topo -m``; malformed text raises ConfigError naming the row."""
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    header_at = None
    for i, ln in enumerate(lines):
        toks = ln.split()
        if toks[:1] != ["GPU0"]:
            continue
        # The header starts with GPU0 followed by more column names; the GPU0 row with its 'X'.
        if len(toks) > 1 and toks[1] == "X":
            raise ConfigError(f"nvidia-smi topo -m line {i + 1}: row 'GPU0' comes before any header row; expected"
                              " a header like '\\tGPU0\\tGPU1\\tCPU Affinity' above the matrix")
        header_at = i
        break
    if header_at is None:
        raise ConfigError("nvidia-smi topo -m output has no header row naming GPU0; expected a matrix like"
                          " '\\tGPU0\\tGPU1\\tCPU Affinity' (is this the output of `nvidia-smi topo -m`?)")
    columns: list[str] = []
    # Split on any whitespace: the matrix cells are single words, and the affinity columns
    # (whose names contain spaces) come after them and are ignored.
    for tok in lines[header_at].split():
        if not _COLUMN.fullmatch(tok):
            break
        columns.append(tok)
    if len(set(columns)) != len(columns):
        raise ConfigError(f"nvidia-smi topo -m header (line {header_at + 1}) repeats a column: {columns}")
    rows: dict[str, list[str]] = {}
    for lineno, ln in enumerate(lines[header_at + 1:], start=header_at + 2):
        toks = ln.split()
        # The matrix ends at the first blank line (the legend follows it).
        if not toks or toks[0].rstrip(":") == "Legend":
            break
        label = toks[0]
        if label not in columns:
            raise ConfigError(f"nvidia-smi topo -m line {lineno}: row {label!r} is not a column of the header"
                              f" ({' '.join(columns)}); the matrix must be square")
        if label in rows:
            raise ConfigError(f"nvidia-smi topo -m line {lineno}: row {label!r} appears twice")
        cells = toks[1:1 + len(columns)]
        if len(cells) < len(columns):
            raise ConfigError(f"nvidia-smi topo -m line {lineno}: row {label!r} has {len(cells)} cells for"
                              f" {len(columns)} columns ({' '.join(columns)}); the output looks truncated")
        for col, cell in zip(columns, cells, strict=True):
            if col == label:
                if cell != "X":
                    raise ConfigError(f"nvidia-smi topo -m line {lineno}: row {label!r} has {cell!r} on the"
                                      " diagonal where 'X' (self) was expected")
            elif cell == "X":
                raise ConfigError(f"nvidia-smi topo -m line {lineno}: row {label!r} has 'X' (self) in column {col!r};"
                                  " the row's cells are misaligned (one missing or extra)")
            elif not _valid_cell(cell):
                raise ConfigError(f"nvidia-smi topo -m line {lineno}: row {label!r}, column {col!r} has unknown"
                                  f" cell {cell!r}; expected NV<n>, {', '.join(_PCIE_CELLS)}")
        rows[label] = cells
    missing = [c for c in columns if c not in rows]
    if missing:
        raise ConfigError(f"nvidia-smi topo -m: no row for {', '.join(missing)}; the matrix must have a row per"
                          " column")
    cells_by_pair = {(r, c): cell for r, cs in rows.items() for c, cell in zip(columns, cs, strict=True) if r != c}
    for (a, b), cell in cells_by_pair.items():
        if cells_by_pair[(b, a)] != cell:
            raise ConfigError(f"nvidia-smi topo -m: row {a!r} says {cell!r} for {b!r} but row {b!r} says"
                              f" {cells_by_pair[(b, a)]!r} for {a!r}; the matrix must be symmetric")
    nic_names = {c: c for c in columns if not _GPU.fullmatch(c)}
    for ln in lines[header_at + 1:]:
        m = _NIC_LEGEND.match(ln)
        if m and m.group(1) in nic_names:
            nic_names[m.group(1)] = m.group(2)
    return DetectedTopo(tuple(columns), cells_by_pair, nic_names)


def _nvswitch_bricks(det: DetectedTopo) -> int:
    """The bricks per GPU if the GPUs hang off NVSwitches, else 0."""
    gpus = det.gpus
    if len(gpus) < 3:
        return 0
    bricks = {det.nvlink_bricks(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]}
    if len(bricks) != 1:
        return 0
    k = bricks.pop()
    return k if k * (len(gpus) - 1) > MAX_NVLINKS_PER_GPU else 0


def _build(det: DetectedTopo, models: Sequence[str], memories: Sequence[int], *, name: str, brick_gbps: float,
           pcie_gbps: float, nic_gbps: float, description: str) -> Topology:
    gpus, nics = det.gpus, det.nics
    members = gpus + nics
    # Union-find over devices that share a PCIe switch tree.
    parent = {m: m for m in members}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, a in enumerate(members):
        for b in members[i + 1:]:
            if det.cell(a, b) in _SAME_SWITCH:
                parent[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for m in members:  # GPUs first, so switches are numbered by their lowest GPU
        groups.setdefault(find(m), []).append(m)
    gpu_name = {g: f"gpu{g[3:]}" for g in gpus}  # GPU3 -> gpu3: keep nvidia-smi's index
    nic_name = {n: f"nic{i}" for i, n in enumerate(nics)}
    devices = [Device("host", "host")]
    links: list[Link] = []
    for s, group in enumerate(groups.values()):
        sw = f"pcie{s}"
        devices.append(Device(sw, "pcie"))
        links.append(Link("host", sw, "pcie", pcie_gbps))
        for g in (m for m in group if m in gpu_name):
            i = gpus.index(g)
            devices.append(Device(gpu_name[g], "gpu", model=models[i], memory_bytes=memories[i]))
            links.append(Link(sw, gpu_name[g], "pcie", pcie_gbps))
        for n in (m for m in group if m in nic_name):
            devices.append(Device(nic_name[n], "nic", model=det.nic_names.get(n, n)))
            links.append(Link(sw, nic_name[n], "nic", nic_gbps))
    per_gpu = _nvswitch_bricks(det)
    if per_gpu:
        devices.append(Device("nvswitch", "nvswitch"))
        links += [Link(gpu_name[g], "nvswitch", "nvlink", per_gpu * brick_gbps, bricks=per_gpu) for g in gpus]
    else:
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                k = det.nvlink_bricks(a, b)
                if k:
                    links.append(Link(gpu_name[a], gpu_name[b], "nvlink", k * brick_gbps, bricks=k))
    return Topology(name, tuple(devices), tuple(links), description=description)


def topology_from_smi(text: str, gpu_model: str = "", memory_bytes: int = 0, brick_gbps: float = BRICK_GBPS, *,
                      pcie_gbps: float = PCIE_GBPS, nic_gbps: float = NIC_GBPS, name: str = "local") -> Topology:
    """A Topology from ``nvidia-smi topo -m`` output; every GPU gets ``gpu_model`` and ``memory_bytes``.

    ``brick_gbps`` is one NVLink's rate per direction (about 25 GB/s for NVLink 2, 3 and 4; 20 for
    NVLink 1), ``pcie_gbps`` every PCIe link's, ``nic_gbps`` every NIC's (see the module docstring).
    """
    det = parse_nvidia_smi_topo(text)
    n = len(det.gpus)
    return _build(det, [gpu_model] * n, [memory_bytes] * n, name=name, brick_gbps=brick_gbps,
                  pcie_gbps=pcie_gbps, nic_gbps=nic_gbps,
                  description=f"detected by nvidia-smi: {n} GPU(s){', ' + gpu_model if gpu_model else ''}")


def _host_only(why: str) -> Topology:
    log.info("no GPU topology detected (%s); using a host-only topology", why)
    return Topology("local", (Device("host", "host"),), (), description=f"host memory only: {why}")


def _smi(exe: str, *args: str, timeout: float) -> str:
    """stdout of one nvidia-smi call; raises OSError/SubprocessError/RuntimeError on any failure."""
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        # nvidia-smi reports "couldn't communicate with the NVIDIA driver" and the like on stdout.
        msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise RuntimeError(f"`nvidia-smi {' '.join(args)}` exited {proc.returncode}: {msg[0] if msg else ''}")
    return proc.stdout


def _parse_query(text: str) -> tuple[list[str], list[int]]:
    """``name, memory.total`` lines (MiB, no units) -> models and byte counts."""
    models: list[str] = []
    memories: list[int] = []
    for ln in text.splitlines():
        if not ln.strip():
            continue
        model, _, mib = ln.rpartition(",")
        try:
            memories.append(int(float(mib.strip())) << 20)
        except ValueError:
            # "[N/A]" on some virtual GPUs: the model still helps, the size is unknown.
            memories.append(0)
        models.append(model.strip())
    return models, memories


def detect(*, brick_gbps: float = BRICK_GBPS, pcie_gbps: float = PCIE_GBPS, nic_gbps: float = NIC_GBPS,
           timeout: float = SMI_TIMEOUT_S) -> Topology:
    """The local machine, named ``local``: from nvidia-smi if it works, else host memory only.

    Having no GPU (no nvidia-smi, no driver, no devices) is not an error: it returns a topology
    with only ``host`` and logs why at INFO. Output that nvidia-smi did print but that does not
    parse raises :class:`ConfigError`, since guessing would misstate the machine.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return _host_only("nvidia-smi is not on PATH")
    try:
        topo_text = _smi(exe, "topo", "-m", timeout=timeout)
        query_text = _smi(exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits", timeout=timeout)
    except subprocess.TimeoutExpired:
        return _host_only(f"nvidia-smi did not answer within {timeout:g} s")
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        return _host_only(str(exc))
    if "GPU0" not in topo_text.split():
        return _host_only("nvidia-smi lists no GPU")
    try:
        det = parse_nvidia_smi_topo(topo_text)
    except ConfigError as exc:
        raise ConfigError(f"{exc}. Could not read this machine's topology; pass a preset or YAML file instead"
                          " (see docs/topology.md)") from None
    n = len(det.gpus)
    models, memories = _parse_query(query_text)
    if len(models) != n:
        log.warning("nvidia-smi --query-gpu listed %d GPUs but topo -m %d; GPU models and sizes left blank",
                    len(models), n)
        models, memories = [""] * n, [0] * n
    kinds = sorted(set(models))
    topo = _build(det, models, memories, name="local", brick_gbps=brick_gbps, pcie_gbps=pcie_gbps,
                  nic_gbps=nic_gbps, description=f"detected by nvidia-smi: {n}x {' / '.join(kinds)}".rstrip())
    log.info("detected %d GPU(s) (%s), %d PCIe switch(es), %d NVLink link(s)", n, ", ".join(kinds), len(
        topo.of_kind("pcie")), sum(1 for ln in topo.links if ln.kind == "nvlink"))
    return topo
