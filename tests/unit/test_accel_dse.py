"""Design-space exploration: the Pareto function, the space, a tiny sweep, and ``gfaas accel dse``."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.accel import dse
from gfaas.accel.arch import KiB, MiB, preset
from gfaas.accel.compiler import compile_model
from gfaas.accel.layers import MatLayer
from gfaas.accel.power import area_mm2, peak_power_w
from gfaas.accel.timing import time_layer, time_model
from gfaas.cli import main
from gfaas.errors import ConfigError
from gfaas.models import zoo


def _dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[0] and a[1] >= b[1] and a != b


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), max_size=40))
def test_pareto_front_properties(pts: list[tuple[int, int]]) -> None:
    """No frontier point is dominated; every other point is dominated by a frontier point."""
    front = dse.pareto_front([float(c) for c, _ in pts], [float(p) for _, p in pts])
    assert front == sorted(set(front))
    on = set(front)
    for i in front:
        assert not any(_dominates(q, pts[i]) for q in pts)
    for i in set(range(len(pts))) - on:
        assert any(_dominates(pts[j], pts[i]) for j in front)


def test_pareto_front_exact_and_bad_input() -> None:
    """A worked example (ties kept, equal-perf costlier point dropped); NaN and length mismatch named."""
    cost = [1.0, 2.0, 2.0, 3.0, 3.0, 0.5, 3.0]
    perf = [1.0, 5.0, 4.0, 5.0, 6.0, 0.5, 6.0]
    assert dse.pareto_front(cost, perf) == [0, 1, 4, 5, 6]
    with pytest.raises(ConfigError, match="nan is not a finite number"):
        dse.pareto_front([1.0], [math.nan])
    with pytest.raises(ConfigError, match="2 costs but 1 performances"):
        dse.pareto_front([1.0, 2.0], [1.0])


def test_space_scales_scratchpads_with_the_array() -> None:
    """The default space: 9 arrays x 33 sizes x 3 memories, minus sizes one fold of the array does not fit."""
    sizes = dse.sram_sizes()
    assert (len(sizes), sizes[0], sizes[-1], sizes[20]) == (33, 128 * KiB, 32 * MiB, 4 * MiB)
    space = dse.design_space()
    assert len(space) == 651
    per_side = {s: sum(1 for c, _ in space if c.rows == s) for s in dse.ARRAY_SIDES}
    # 32 bytes of scratchpad per PE at least: 128x128 from 512 KiB (25 sizes), 1024x1024 only 32 MiB.
    assert per_side == {4: 99, 8: 99, 16: 99, 32: 99, 64: 99, 128: 75, 256: 51, 512: 27, 1024: 3}
    smallest = min(c.sram_bytes for c, _ in space if c.rows == 256)
    assert smallest == 32 * 256 * 256
    assert not dse.fits(preset("dscs").with_(rows=256, cols=256, ofmap_sram=smallest // 4 - KiB))
    cfg, mem = next((c, m) for c, m in space if c.name == "128x128-4096KiB-ddr5")
    base = preset("dscs")
    assert (cfg.vector_lanes, cfg.ifmap_sram, cfg.filter_sram, cfg.ofmap_sram, cfg.dram_gbps, mem) == \
        (128, MiB, 2 * MiB, MiB, 38.0, "ddr5")
    assert cfg.with_(name="dscs") == base  # the paper's point is the dscs preset
    with pytest.raises(ConfigError, match="memories \\['ddr3'\\]: choose from ddr4, ddr5, hbm2"):
        dse.design_space(memories=["ddr3"])


def test_layer_shapes_do_not_depend_on_the_array() -> None:
    """Why one compilation serves every point: the layers compiled for two very different configs are equal."""
    model = zoo.build("yolo", "small")
    a = compile_model(model, preset("dscs")).layers
    b = compile_model(model, preset("dscs").with_(rows=8, cols=8, vector_lanes=8, ifmap_sram=32 * KiB,
                                                  filter_sram=64 * KiB, ofmap_sram=32 * KiB, dram_gbps=460.0)).layers
    assert a == b


@pytest.fixture(scope="module")
def tiny() -> dse.DseResult:
    return dse.explore(["logreg"], sides=(8, 128), memories=("ddr4", "ddr5"), steps_per_octave=1, scale="small")


def test_tiny_sweep_structure(tiny: dse.DseResult) -> None:
    """2 arrays x 2 memories x 1 model: every point timed and costed as the library does it, exact JSON keys."""
    res = tiny
    prog = compile_model(zoo.build("logreg", "small"), preset("dscs")).layers
    # 8x8 takes all 9 sizes; 128x128 the 7 from 512 KiB.
    assert len(res.points) == (9 + 7) * 2
    assert [p.name for p in res.points[:3]] == ["8x8-128KiB-ddr4", "8x8-128KiB-ddr5", "8x8-256KiB-ddr4"]
    for p in res.points:
        t = time_model(p.config, prog)
        assert p.latency_s == {"logreg": t.seconds(p.config)}
        assert p.geomean_ips == pytest.approx(1 / t.seconds(p.config)) == pytest.approx(p.mean_ips)
        assert (p.peak_power_w, p.area_mm2) == (peak_power_w(p.config), area_mm2(p.config).total_mm2)
        assert p.feasible == (p.peak_power_w <= 4.2)
    doc = res.to_dict()
    assert set(doc) == {"points", "feasible_points", "models", "seconds", "budget_w", "chosen", "best_perf_per_w",
                        "paper_point", "frontier_power", "frontier_area"}
    assert (doc["points"], doc["models"], doc["budget_w"]) == (32, ["logreg"], 4.2)
    feas = res.feasible
    assert doc["chosen"]["geomean_ips"] == max(p.geomean_ips for p in feas)
    assert doc["best_perf_per_w"]["perf_per_w"] == max(p.perf_per_w for p in feas)
    pp = doc["paper_point"]
    assert pp["name"] == "128x128-4096KiB-ddr5" and res.paper in res.points
    assert pp["rank"] == 1 + sum(p.geomean_ips > res.paper.geomean_ips for p in feas)
    assert pp["perf_vs_chosen"] == pytest.approx(res.paper.geomean_ips / doc["chosen"]["geomean_ips"])
    want = dse.pareto_front([p.avg_power_w for p in feas], [p.geomean_ips for p in feas])
    assert sorted(p["name"] for p in doc["frontier_power"]) == sorted(feas[i].name for i in want)
    assert [p["area_mm2"] for p in doc["frontier_area"]] == sorted(p["area_mm2"] for p in doc["frontier_area"])


def test_sweep_times_each_config() -> None:
    """A bigger array never has more compute cycles on a layer that fills it; memory changes latency."""
    layers = [x for x in compile_model(zoo.build("yolo", "small"), preset("dscs")).layers if isinstance(x, MatLayer)]
    space = dse.design_space(sides=(4, 8, 16), memories=("ddr4",), steps_per_octave=1)
    by_side = {c.rows: c for c, _ in space if c.sram_bytes == MiB}
    checked = 0
    for small, big in ((4, 8), (8, 16)):
        for lay in layers:
            if lay.m >= big and lay.n >= big:
                assert time_layer(by_side[big], lay).compute_cycles <= time_layer(by_side[small], lay).compute_cycles
                checked += 1
    assert checked >= 5
    res = dse.explore(["yolo"], sides=(4, 32), memories=("ddr4", "hbm2"), steps_per_octave=1, scale="small",
                      programs={"yolo": layers})
    lat = {p.name: p.latency_s["yolo"] for p in res.points}
    assert lat["32x32-1024KiB-hbm2"] < lat["32x32-1024KiB-ddr4"] < lat["4x4-1024KiB-ddr4"]
    assert lat["4x4-1024KiB-hbm2"] < lat["4x4-1024KiB-ddr4"]


def test_cli_dse_json_and_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """accel dse --json --out: the summary document, a CSV row per point and a PNG."""
    assert main(["accel", "dse", "--models", "logreg", "--scale", "small", "--steps", "1", "--budget", "2",
                 "--json", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert (doc["points"], doc["models"], doc["budget_w"]) == (183, ["logreg"], 2.0)
    assert "dse: evaluated 100/183 points" in out.err
    assert json.loads((tmp_path / "dse.json").read_text())["points"] == 183
    rows = list(csv.DictReader((tmp_path / "dse_rows.csv").open()))
    assert len(rows) == 183 and {"latency_s:logreg", "energy_j:logreg", "on_power_frontier"} <= set(rows[0])
    assert sum(r["on_area_frontier"] == "True" for r in rows) == len(doc["frontier_area"])
    assert (tmp_path / "dse_frontiers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv,message", [
    (["--budget", "-1"], "--budget -1: give the accelerator's power budget in watts, > 0"),
    (["--budget", "nan"], "--budget nan"),
    (["--models", "logreg,nope"], "--models 'logreg,nope': nope not in the zoo"),
])
def test_cli_dse_bad_inputs(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad options are named with the fix, before any compilation."""
    assert main(["accel", "dse", *argv]) == 1
    assert message in capsys.readouterr().err


def test_explore_bad_inputs() -> None:
    """The library names a bad budget, steps and sides."""
    with pytest.raises(ConfigError, match="budget 0 W must be a number > 0"):
        dse.explore(["logreg"], budget_w=0)
    with pytest.raises(ConfigError, match="steps per octave 0 must be a positive integer"):
        dse.sram_sizes(0)
    with pytest.raises(ConfigError, match="array side -4 must be a positive integer"):
        dse.design_space(sides=(-4,))
