"""Fit the simulator's transfer model to a measured ``gfaas bench dataplane --gpu`` run.

Each measured copy of ``n`` bytes taking ``t`` seconds is one point of ``t = latency + n / rate``;
a least-squares line through the points of one system gives its latency and rate. The ``h100-x1``
preset takes the pinned H2D rate as its PCIe link and the pageable rate as its pageable rate; the
staging model (``StagingModel``) takes the ring's measured rate.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .model import Topology
from .presets import h100_x1


def fit_link(rows: list[dict[str, Any]], kind: str, system: str) -> tuple[float, float]:
    """``(latency_s, rate_gbps)`` of ``t = latency + n / rate`` over the rows of one system."""
    pts = [(r["size_bytes"], r["p50_us"] * 1e-6) for r in rows
           if r.get("kind") == kind and r.get("system") == system and r.get("p50_us")]
    if len(pts) < 2:
        raise ConfigError(f"calibration needs >= 2 sizes of {kind}/{system}; the run has {len(pts)}")
    mx = sum(n for n, _ in pts) / len(pts)
    my = sum(t for _, t in pts) / len(pts)
    sxx = sum((n - mx) ** 2 for n, _ in pts)
    slope = sum((n - mx) * (t - my) for n, t in pts) / sxx
    if slope <= 0:
        raise ConfigError(f"{kind}/{system}: time does not grow with size in this run; re-measure")
    return max(0.0, my - slope * mx), 1.0 / slope / 1e9


def calibrate_h100(doc: dict[str, Any]) -> tuple[Topology, dict[str, Any]]:
    """The ``h100-x1`` topology with measured rates, and the fitted numbers (to record)."""
    rows = doc["rows"]
    fits = {f"{k}/{s}": fit_link(rows, k, s) for k in ("h2d", "d2h")
            for s in ("cuda-pinned", "cuda-pageable", "gfaas-ring")}
    pinned = min(fits["h2d/cuda-pinned"][1], fits["d2h/cuda-pinned"][1])
    pageable = min(fits["h2d/cuda-pageable"][1], fits["d2h/cuda-pageable"][1])
    record = {"device": doc.get("device"),
              "fits": {k: {"latency_us": round(lat * 1e6, 2), "gbps": round(g, 2)} for k, (lat, g) in fits.items()},
              "pcie_gbps": round(pinned, 2), "pageable_gbps": round(pageable, 2)}
    topo = h100_x1(pinned, pageable, f"1x H100 (calibrated on {doc.get('device')}: pinned {pinned:.1f} GB/s,"
                                     f" pageable {pageable:.1f} GB/s)")
    return topo, record
