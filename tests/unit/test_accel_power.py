"""The accelerator energy and area model: cited anchor points and closed forms."""

from __future__ import annotations

import math

import pytest

from gfaas.accel.arch import PRESETS, AccelConfig, MiB
from gfaas.accel.layers import MatLayer, VecLayer
from gfaas.accel.power import (
    ENERGY_SCALE,
    area_mm2,
    energy,
    peak_power_w,
    sram_access_pj,
    sram_leakage_w,
)
from gfaas.accel.timing import time_model


def test_sram_leakage_anchors() -> None:
    """CACTI 7 at 45 nm: 4 MB of HP cells leak 4.23 W (the whole 4.2 W budget), LP cells 54 mW."""
    assert sram_leakage_w(4 * MiB, "hp", 45) == pytest.approx(4.23)
    assert sram_leakage_w(1 * MiB, "hp", 45) == pytest.approx(1.06)
    assert sram_leakage_w(4 * MiB, "lp", 45) == pytest.approx(0.054)
    assert sram_leakage_w(2 * MiB, "lp", 45) == pytest.approx(0.027)


def test_sram_access_interpolation() -> None:
    """Cited points are exact; between them energy follows the power law through its neighbours."""
    assert sram_access_pj(8 * 1024, "hp") == pytest.approx(20.0)
    assert sram_access_pj(1 * MiB, "hp") == pytest.approx(121.0)
    assert sram_access_pj(4 * MiB, "hp") == pytest.approx(240.0)
    assert sram_access_pj(4 * MiB, "lp") == pytest.approx(145.0)
    assert sram_access_pj(2 * MiB, "hp") == pytest.approx(math.sqrt(121.0 * 240.0))  # log midpoint
    assert sram_access_pj(16 * MiB, "hp") == pytest.approx(240.0 * (240.0 / 121.0))  # extended
    assert sram_access_pj(4 * MiB, "hp", 14) == pytest.approx(240.0 * ENERGY_SCALE[14])


def test_scaling_factors_are_cv2() -> None:
    """45 -> 28 nm and 14 nm energy factors are (L ratio) x (V ratio)^2."""
    assert ENERGY_SCALE[28] == pytest.approx(28 / 45)
    assert ENERGY_SCALE[14] == pytest.approx(14 / 45 * (0.8 / 0.9) ** 2)


def test_dscs_peak_power_within_drive_budget() -> None:
    """The DSCS point (128x128 int8, 4 MB LP, 14 nm, 1 GHz) peaks under seed 004's 4.2 W, by the
    closed form: PEs x MAC + operand reads + result writes + vector lanes + leakage."""
    c = PRESETS["dscs"]
    s = ENERGY_SCALE[14]
    read = sram_access_pj(3 * MiB / 2 / 16, "lp", 14) * 8 / 128
    write = sram_access_pj(1 * MiB / 16, "lp", 14) * 8 / 128
    expect = (16384 * 0.3 * s + 256 * read + 128 * write + 128 * 4.6 * s) * 1e-3 + 0.054 * s
    assert peak_power_w(c) == pytest.approx(expect)
    assert 1.0 < peak_power_w(c) < 4.2
    # the same chip with HP cells at 45 nm leaks more than the budget on its own
    assert sram_leakage_w(c.sram_bytes, "hp", 45) > 4.2


def test_energy_components_and_leakage() -> None:
    """Energy = MACs x MAC energy + scratchpad + vector + DRAM + leakage power x time."""
    c = AccelConfig(rows=32, cols=32, tech_nm=45, cell="hp")
    mt = time_model(c, [MatLayer("g", "Gemm", 100, 64, 70), VecLayer("v", "Relu", 1280)])
    e = energy(c, mt)
    assert e.dynamic_j["mac"] == pytest.approx(100 * 64 * 70 * 0.3e-12)
    assert e.dynamic_j["vector"] == pytest.approx(10 * 128 * 4.6e-12)  # ceil(1280/128) cycles x lanes
    assert e.dynamic_j["dram"] == pytest.approx(mt.dram_bytes * 162.5e-12)
    assert e.leakage_j == pytest.approx(sram_leakage_w(4 * MiB, "hp", 45) * mt.seconds(c))
    assert e.total_j == pytest.approx(sum(e.dynamic_j.values()) + e.leakage_j)
    assert e.avg_power_w == pytest.approx(e.total_j / mt.seconds(c))
    fp32 = energy(c.with_(precision="fp32"), time_model(c.with_(precision="fp32"), mt_layers()))
    assert fp32.dynamic_j["mac"] == pytest.approx(100 * 64 * 70 * 4.6e-12)


def mt_layers() -> list[MatLayer]:
    return [MatLayer("g", "Gemm", 100, 64, 70)]


def test_area_by_component() -> None:
    """Area: PEs x (8-bit mult + 32-bit add), SRAM per MB, fp32 lanes; scaled by the cell-size ratio."""
    a45 = area_mm2(AccelConfig(rows=128, cols=128, tech_nm=45))
    assert a45.by_component["pe_array"] == pytest.approx(16384 * 419e-6)
    assert a45.by_component["sram"] == pytest.approx(4 * 8 * MiB * 0.346e-6 / 0.5)
    assert a45.total_mm2 == pytest.approx(sum(a45.by_component.values()))
    a14 = area_mm2(AccelConfig(rows=128, cols=128, tech_nm=14))
    assert a14.total_mm2 == pytest.approx(a45.total_mm2 * 0.0588 / 0.346)
