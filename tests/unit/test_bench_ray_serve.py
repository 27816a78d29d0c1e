"""gfaas bench ray-serve's bookkeeping: sizes, per-size p50s and the 64 MiB target (both systems stubbed:
the real run needs Ray Serve and takes minutes; `make ray-serve-results`)."""

from __future__ import annotations

from typing import Any

import pytest

import gfaas.bench.ray_serve as rs
from gfaas.errors import ConfigError
from gfaas.units import KiB, MiB


def test_sizes_parse_and_bad_ones_name_the_fix() -> None:
    assert rs._sizes("64KiB,4MiB") == [64 * KiB, 4 * MiB]
    for bad in ("", "1KiB", "lots"):
        with pytest.raises(ConfigError, match="64KiB,4MiB,64MiB"):
            rs._sizes(bad)


def test_rows_compare_p50s_and_judge_the_64_mib_target(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = [64 * KiB, 64 * MiB]

    def gfaas(sizes: list[int], samples: int, warmup: int, say: Any) -> dict[int, dict[str, Any]]:
        return {64 * KiB: {"p50_us": 2000.0, "breakdown_p50_ms": {}}, 64 * MiB: {"p50_us": 30000.0,
                                                                            "breakdown_p50_ms": {"compute": 20.0}}}

    def ray(sizes: list[int], samples: int, warmup: int, say: Any) -> tuple[dict[int, list[float]], str]:
        return {64 * KiB: [0.010] * 3, 64 * MiB: [0.060, 0.070, 0.080]}, "2.60.0"

    monkeypatch.setattr(rs, "measure_gfaas", gfaas)
    monkeypatch.setattr(rs, "measure_ray_serve", ray)
    doc = rs.measure(sizes, samples=3, warmup=0)
    assert [r["ray_serve_over_gfaas"] for r in doc["rows"]] == [5.0, 2.33]
    assert doc["target"]["value"] == 2.33 and doc["target"]["met"] is False and doc["ray_version"] == "2.60.0"
