"""The accelerator's energy, power and area, from per-action energies and cited constants.

Energy = sum over actions (MACs, scratchpad element reads and writes, DRAM bytes, vector lane-ops)
of count x energy per action, plus leakage power x time. Every constant below names its source;
``docs/accel-timing.md`` lists them with the interpolation and scaling rules. Constants are at
45 nm (the paper's FreePDK baseline, seed 004 §4.2) and scaled to 28 and 14 nm by one factor per
node (:data:`ENERGY_SCALE`, :data:`AREA_SCALE`).

Scratchpad access energy depends on the size of the array read: each scratchpad is split into
``banks`` (seed 004 §4.1: one bank per PE row), so an access costs what one bank of that size costs.
Between cited sizes the energy is interpolated linearly in log(size)-log(energy) (a power law, which
is how CACTI's per-access energy grows with wire length); outside them the nearest segment's power
law is extended.

Scope: the accelerator chip (matrix unit, vector unit, scratchpads) plus the DRAM traffic it causes.
:func:`peak_power_w` is the chip alone at full activity, the number seed 004 compares with the
drive's 4.2 W budget; DRAM energy is reported as its own component by :func:`energy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .arch import AccelConfig, MiB
from .timing import ModelTiming

__all__ = ["AreaReport", "EnergyReport", "area_mm2", "energy", "peak_power_w", "sram_access_pj",
           "sram_leakage_w"]

PJ = 1e-12

# ---- arithmetic at 45 nm, 0.9 V (Horowitz, "Computing's energy problem", ISSCC 2014, Fig. 1.1.9) --
#: int8 multiply 0.2 pJ + int32 accumulate 0.1 pJ (the int8 figures as commonly quoted from
#: Horowitz's table; anchors.md notes they were not verified in the primary text).
MAC_PJ = {"int8": 0.2 + 0.1, "fp32": 3.7 + 0.9}  # fp32: multiply 3.7 pJ + add 0.9 pJ (Horowitz)
#: One vector-lane operation: an fp32 multiply-add (activations and normalisations run in fp32):
#: 3.7 + 0.9 pJ (Horowitz).
VECTOR_OP_PJ = 3.7 + 0.9

# ---- SRAM at 45 nm, energy per 128-bit access in pJ ----------------------------------------------
#: (bytes, pJ) for high-performance cells: 8 KB from Horowitz ISSCC'14 (10 pJ per 64-bit access,
#: doubled for 128 bits: energy per access grows with the bits read); 1 MB 121 pJ and 4 MB 240 pJ
#: from CACTI 7 (anchors.md).
SRAM_HP_POINTS = ((8 * 1024, 20.0), (1 * MiB, 121.0), (4 * MiB, 240.0))
#: Low-power cells: CACTI 7 gives 145 pJ for 4 MB (anchors.md); other sizes take the same ratio to
#: the HP curve (145/240), our assumption, stated.
LP_ACCESS_RATIO = 145.0 / 240.0
#: Leakage at 45 nm: CACTI 7, 1 MB HP 1.06 W, 4 MB HP 4.23 W, 4 MB LP 54 mW (anchors.md).
LEAK_HP_POINTS = ((1 * MiB, 1.06), (4 * MiB, 4.23))
LEAK_LP_W_PER_BYTE = 0.054 / (4 * MiB)  # one cited point: leakage taken proportional to cells

# ---- DRAM ------------------------------------------------------------------------------------------
#: Horowitz ISSCC'14 Fig. 1.1.9: a 64-bit DRAM access costs 1.3-2.6 nJ; the low end per byte. Off-chip
#: energy is not scaled with the logic node.
DRAM_PJ_PER_BYTE = 1300.0 / 8

# ---- technology scaling from 45 nm -----------------------------------------------------------------
#: Dynamic energy per action ~ C V^2 (Dennard et al., IEEE JSSC 1974): C with the feature size, V the
#: node's nominal supply (45 nm 0.9 V as in Horowitz; 28 nm 0.9 V; 14 nm FinFET 0.8 V). Factors:
#: 28 nm (28/45)(0.9/0.9)^2 = 0.622; 14 nm (14/45)(0.8/0.9)^2 = 0.246. Stillmaker & Baas (Integration
#: 58, 2017) fit such factors to HSPICE/PTM data; their tables were not at hand, so this is the
#: classical C V^2 estimate that their equations refine. Leakage power uses the same factor.
ENERGY_SCALE = {45: 1.0, 28: (28 / 45) * (0.9 / 0.9) ** 2, 14: (14 / 45) * (0.8 / 0.9) ** 2}
#: Area by the published 6T SRAM cell sizes (logic takes the same factor): 45 nm 0.346 um^2 (Intel,
#: Mistry et al., IEDM 2007) to 14 nm 0.0588 um^2 (Intel, Natarajan et al., IEDM 2014): 0.170;
#: 28 nm by ideal (28/45)^2 = 0.387, our assumption for want of a cited cell at hand.
AREA_SCALE = {45: 1.0, 28: (28 / 45) ** 2, 14: 0.0588 / 0.346}

# ---- area at 45 nm ----------------------------------------------------------------------------------
#: Horowitz ISSCC'14 Fig. 1.1.9 areas: 8-bit multiply 282 um^2, 32-bit add 137 um^2, fp32 multiply
#: 7700 um^2, fp32 add 4184 um^2. A PE is its multiplier plus accumulator (pipeline registers not
#: counted: no cited figure).
PE_UM2 = {"int8": 282.0 + 137.0, "fp32": 7700.0 + 4184.0}
VECTOR_LANE_UM2 = 7700.0 + 4184.0  # an fp32 multiply-add per lane (Horowitz)
#: 6T cell 0.346 um^2 (Intel 45 nm, Mistry et al., IEDM 2007) over an array efficiency of 50% (cells
#: over the whole macro with decoders, sense amplifiers and wiring; our assumption, typical of CACTI
#: outputs for MB-sized arrays).
SRAM_MM2_PER_MB = MiB * 8 * 0.346e-6 / 0.5


def _loglog(points: tuple[tuple[int, float], ...], size: float) -> float:
    """Power-law interpolation through ``points`` (sorted by size), extended past both ends."""
    if size <= 0:
        raise ValueError(f"size={size!r} must be > 0")
    seg = 0
    while seg < len(points) - 2 and size > points[seg + 1][0]:
        seg += 1
    (s0, e0), (s1, e1) = points[seg], points[seg + 1]
    slope = math.log(e1 / e0) / math.log(s1 / s0)
    return e0 * (size / s0) ** slope


def sram_access_pj(size_bytes: float, cell: str, tech_nm: int = 45) -> float:
    """Energy of one 128-bit access to an SRAM array of ``size_bytes`` in pJ."""
    e = _loglog(SRAM_HP_POINTS, size_bytes) * (LP_ACCESS_RATIO if cell == "lp" else 1.0)
    return e * ENERGY_SCALE[tech_nm]


def sram_leakage_w(size_bytes: float, cell: str, tech_nm: int = 45) -> float:
    """Leakage power of ``size_bytes`` of SRAM in watts."""
    w = _loglog(LEAK_HP_POINTS, size_bytes) if cell == "hp" else LEAK_LP_W_PER_BYTE * size_bytes
    return w * ENERGY_SCALE[tech_nm]


@dataclass(frozen=True)
class EnergyReport:
    """Joules by component (``mac``, ``sram``, ``vector``, ``dram``), leakage, total, mean power."""

    dynamic_j: dict[str, float]
    leakage_j: float
    total_j: float
    avg_power_w: float


@dataclass(frozen=True)
class AreaReport:
    """Square millimetres by component (``pe_array``, ``sram``, ``vector``) and in total."""

    by_component: dict[str, float]
    total_mm2: float


def _elem_pj(cfg: AccelConfig, size: int) -> float:
    """One element's scratchpad access: a bank of the scratchpad, energy per bit of a 128-bit access."""
    return sram_access_pj(size / cfg.banks, cfg.cell, cfg.tech_nm) * (8 * cfg.element_bytes) / 128


def energy(cfg: AccelConfig, timing: ModelTiming) -> EnergyReport:
    """The energy of a timed model on ``cfg`` (module docstring). Vector layers (no MACs) are charged
    ``compute_cycles x vector_lanes`` lane-operations."""
    scale = ENERGY_SCALE[cfg.tech_nm]
    read_pj = _elem_pj(cfg, (cfg.ifmap_sram + cfg.filter_sram) // 2)  # operands come from these two
    write_pj = _elem_pj(cfg, cfg.ofmap_sram)  # results go here; writes cost as reads (CACTI: similar)
    reads = sum(lt.sram_reads for lt in timing.layers)
    writes = sum(lt.sram_writes for lt in timing.layers)
    lane_ops = sum(lt.compute_cycles * cfg.vector_lanes for lt in timing.layers if lt.macs == 0)
    dyn = {
        "mac": timing.macs * MAC_PJ[cfg.precision] * scale * PJ,
        "sram": (reads * read_pj + writes * write_pj) * PJ,
        "vector": lane_ops * VECTOR_OP_PJ * scale * PJ,
        "dram": timing.dram_bytes * DRAM_PJ_PER_BYTE * PJ,
    }
    seconds = timing.seconds(cfg)
    leak = sram_leakage_w(cfg.sram_bytes, cfg.cell, cfg.tech_nm) * seconds
    total = sum(dyn.values()) + leak
    return EnergyReport(dyn, leak, total, total / seconds if seconds > 0 else 0.0)


def peak_power_w(cfg: AccelConfig) -> float:
    """The chip at full activity: every PE does a MAC each cycle, ``rows + cols`` operands are read
    and ``cols`` results written per cycle (one wavefront in, one out), every vector lane busy, plus
    leakage. DRAM is outside the chip's budget (module docstring)."""
    scale = ENERGY_SCALE[cfg.tech_nm]
    hz = cfg.freq_mhz * 1e6
    per_cycle_pj = (cfg.pes * MAC_PJ[cfg.precision] * scale
                    + (cfg.rows + cfg.cols) * _elem_pj(cfg, (cfg.ifmap_sram + cfg.filter_sram) // 2)
                    + cfg.cols * _elem_pj(cfg, cfg.ofmap_sram)
                    + cfg.vector_lanes * VECTOR_OP_PJ * scale)
    return per_cycle_pj * PJ * hz + sram_leakage_w(cfg.sram_bytes, cfg.cell, cfg.tech_nm)


def area_mm2(cfg: AccelConfig) -> AreaReport:
    """Silicon area by component at ``cfg.tech_nm`` (constants above)."""
    s = AREA_SCALE[cfg.tech_nm]
    parts = {
        "pe_array": cfg.pes * PE_UM2[cfg.precision] * 1e-6 * s,
        "sram": cfg.sram_bytes / MiB * SRAM_MM2_PER_MB * s,
        "vector": cfg.vector_lanes * VECTOR_LANE_UM2 * 1e-6 * s,
    }
    return AreaReport(parts, sum(parts.values()))
