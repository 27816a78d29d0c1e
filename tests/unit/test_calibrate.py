"""Calibration of the h100-x1 preset from a benchmark document (synthetic rows; exact fits)."""

from __future__ import annotations

import pytest

from gfaas.bench.gpu import _row
from gfaas.errors import ConfigError
from gfaas.policy.pool import MiB
from gfaas.topology.calibrate import calibrate_h100, fit_link


def _rows(system: str, lat: float, gbps: float) -> list[dict[str, object]]:
    return [_row(k, system, n, lat + n / (gbps * 1e9)) for k in ("h2d", "d2h") for n in (MiB, 64 * MiB, 1024 * MiB)]


def test_fit_recovers_latency_and_rate() -> None:
    lat, g = fit_link(_rows("cuda-pinned", 10e-6, 52.0), "h2d", "cuda-pinned")
    assert lat == pytest.approx(10e-6, abs=2e-8) and g == pytest.approx(52.0, rel=1e-4)


def test_calibrated_preset_uses_measured_rates() -> None:
    doc = {"device": "NVIDIA H100 PCIe", "rows": _rows("cuda-pinned", 8e-6, 50.0) + _rows("cuda-pageable", 20e-6, 18.0)
           + _rows("gfaas-ring", 30e-6, 47.0)}
    topo, rec = calibrate_h100(doc)
    assert rec["pcie_gbps"] == pytest.approx(50.0, rel=1e-3) and rec["pageable_gbps"] == pytest.approx(18.0, rel=1e-3)
    assert "calibrated on NVIDIA H100 PCIe" in topo.description


def test_too_few_points() -> None:
    with pytest.raises(ConfigError, match=">= 2 sizes"):
        fit_link([_row("h2d", "cuda-pinned", MiB, 1e-4)], "h2d", "cuda-pinned")
