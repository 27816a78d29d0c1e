"""gfaas bench ray-serve's bookkeeping: sizes, per-size p50s and the targets (both systems stubbed:
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


def test_rows_compare_p50s_and_judge_the_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = [64 * KiB, 64 * MiB]

    def gfaas(sizes: list[int], samples: int, warmup: int, say: Any) -> dict[int, dict[str, Any]]:
        return {64 * KiB: {"p50_us": 2000.0, "breakdown_p50_ms": {}}, 64 * MiB: {"p50_us": 30000.0,
                                                                            "breakdown_p50_ms": {"compute": 20.0}}}

    def ray(sizes: list[int], samples: int, warmup: int, say: Any) -> tuple[dict[int, list[float]], str]:
        return {64 * KiB: [0.010] * 3, 64 * MiB: [0.060, 0.070, 0.080]}, "2.60.0"

    monkeypatch.setattr(rs, "measure_gfaas", gfaas)
    monkeypatch.setattr(rs, "measure_ray_serve", ray)
    monkeypatch.setattr(rs, "measure_bare", lambda sizes, samples, warmup: {64 * KiB: 1.0, 64 * MiB: 20.0})
    doc = rs.measure(sizes, samples=3, warmup=0)
    assert [r["ray_serve_over_gfaas"] for r in doc["rows"]] == [5.0, 2.33]
    # what each adds to the bare work: (10 - 1) / (2 - 1) and (70 - 20) / (30 - 20)
    assert [r["ray_serve_added_over_gfaas_added"] for r in doc["rows"]] == [9.0, 5.0]
    assert [(t["size_bytes"], t["bound"], t["value"], t["met"]) for t in doc["targets"]] == [
        (64 * KiB, 10.0, 5.0, False), (64 * MiB, 4.0, 2.33, False)]
    assert doc["ray_version"] == "2.60.0"
    only_small = rs.measure([64 * KiB], samples=3, warmup=0)
    assert [t["met"] for t in only_small["targets"]] == [False, None]  # 64 MiB not measured


def test_the_bare_work_runs_the_workflow_s_own_functions() -> None:
    """The baseline calls tiny's gen and red in this process: positive p50s, larger for more data."""
    bare = rs.measure_bare([64 * KiB, 4 * MiB], samples=5, warmup=1)
    assert 0 < bare[64 * KiB] < bare[4 * MiB]
