"""The accelerator timing model: closed forms, SCALE-Sim v3 cycle counts as an oracle, properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.accel.arch import AccelConfig, KiB, MiB
from gfaas.accel.layers import ConvGeom, MatLayer, VecLayer
from gfaas.accel.timing import LayerTiming, ModelTiming, fold_plan, time_layer, time_model
from gfaas.bench.accel import RESNET50, conv_layer
from gfaas.errors import ConfigError


def cfg(side: int = 32, df: str = "os", **kw: object) -> AccelConfig:
    return AccelConfig(rows=side, cols=side, dataflow=df, **kw)  # type: ignore[arg-type]


def gemm(m: int, k: int, n: int, groups: int = 1) -> MatLayer:
    return MatLayer("g", "Gemm", m=m, k=k, n=n, groups=groups)


# SCALE-Sim 3.0.0 compute cycles (total minus stall), measured once on this machine kind with
#   .cache/scalesim-venv/bin/python src/gfaas/bench/accel.py --driver < spec.json
# where spec.json = {"rows": R, "cols": R, "dataflow": DF, "sram_kb": [512, 512, 256],
#                    "layers": [[name, ifmap_h, ifmap_w, filter_h, filter_w, channels, filters, stride], ...]}
# (the venv is the one `gfaas bench accel` creates). Rows: (R, DF, topology row, cycles).
SCALESIM_ORACLE = [
    (128, "os", ("gemm512", 1, 512, 1, 1, 512, 512, 1), 12255),
    (128, "os", ("conv3x3_56", 56, 56, 3, 3, 64, 64, 1), 19089),
    (128, "os", ("gemm_odd", 1, 100, 1, 1, 300, 77, 1), 553),
    (32, "ws", ("g", 1, 100, 1, 1, 70, 50, 1), 1163),
    (32, "ws", ("c", 9, 9, 3, 3, 5, 40, 2), 439),
    (32, "ws", ("m1", 1, 1, 1, 1, 64, 33, 1), 379),
    (32, "ws", ("big", 1, 64, 1, 1, 96, 64, 1), 947),
    (32, "is", ("g", 1, 100, 1, 1, 70, 50, 1), 1727),
    (32, "is", ("c", 9, 9, 3, 3, 5, 40, 2), 267),
    (32, "is", ("m1", 1, 1, 1, 1, 64, 33, 1), 253),
    (32, "is", ("big", 1, 64, 1, 1, 96, 64, 1), 947),
]


@pytest.mark.parametrize(("side", "df", "row", "cycles"), SCALESIM_ORACLE)
def test_compute_cycles_match_scalesim(side: int, df: str, row: tuple, cycles: int) -> None:
    """Compute cycles equal SCALE-Sim v3's on recorded layers of all three dataflows."""
    assert time_layer(cfg(side, df), conv_layer(*row)).compute_cycles == cycles


def test_resnet50_matches_scalesim_total_and_macs() -> None:
    """SCALE-Sim's ResNet-50 on 128x128 OS: 611,561 cycles (anchors.md); unpadded convs 3.41 GMAC."""
    mt = time_model(cfg(128), [conv_layer(*r) for r in RESNET50])
    assert mt.compute_cycles == 611_561
    floor_macs = sum(((h - fh) // s + 1) * ((w - fw) // s + 1) * fh * fw * c * f
                     for _, h, w, fh, fw, c, f, s in RESNET50)
    assert round(floor_macs / 1e9, 2) == 3.41


def test_scalesim_output_size_convention() -> None:
    """A 1x1 stride-2 conv on 56x56 gives SCALE-Sim's ceil((56-1)/2)+1 = 29 rows of output."""
    assert conv_layer("s", 56, 56, 1, 1, 256, 512, 2).m == 29 * 29
    assert conv_layer("s", 56, 56, 3, 3, 64, 64, 1).m == 54 * 54


@pytest.mark.parametrize(("df", "extra"), [("os", 0), ("ws", 32), ("is", 32)])
def test_one_fold_exact(df: str, extra: int) -> None:
    """A GEMM that fills the array once takes T + rows + cols - 2 (+ rows to preload) - 1 cycles."""
    m, k, n = {"os": (32, 50, 32), "ws": (50, 32, 32), "is": (32, 32, 50)}[df]
    t = time_layer(cfg(32, df), gemm(m, k, n))
    assert fold_plan(df, 32, 32, m, k, n) == (1, 1, 50 + 62 + extra)
    assert t.compute_cycles == 50 + 62 + extra - 1


def test_k_doubling_adds_k_per_fold_in_os() -> None:
    """In OS, doubling k adds k cycles to each of the folds."""
    c1 = time_layer(cfg(), gemm(100, 64, 70)).compute_cycles
    c2 = time_layer(cfg(), gemm(100, 128, 70)).compute_cycles
    assert c2 - c1 == 4 * 3 * 64  # ceil(100/32) x ceil(70/32) folds


def test_one_more_row_costs_a_whole_fold() -> None:
    """m = rows fits one fold; m = rows + 1 needs two, each padded to the full array."""
    one = time_layer(cfg(), gemm(32, 40, 32)).compute_cycles
    two = time_layer(cfg(), gemm(33, 40, 32)).compute_cycles
    assert (one, two) == (40 + 62 - 1, 2 * (40 + 62) - 1)


def test_groups_run_back_to_back() -> None:
    """A grouped GEMM takes groups x (folds x per_fold - 1) cycles (one SCALE-Sim layer per group)."""
    t = time_layer(cfg(), gemm(64, 9, 1, groups=48))
    assert t.compute_cycles == 48 * (2 * (9 + 62) - 1)
    assert t.macs == 64 * 9 * 48


def test_dataflows_differ_as_expected() -> None:
    """Tall-skinny GEMM (m=1000, k=n=32): WS streams m once (1 fold); OS folds m 32 ways; IS folds
    m across columns and pays the preload each time."""
    layer = gemm(1000, 32, 32)
    got = {df: time_layer(cfg(32, df), layer).compute_cycles for df in ("os", "ws", "is")}
    assert got == {"os": 32 * (32 + 62) - 1, "ws": 1000 + 32 + 62 - 1, "is": 32 * (32 + 32 + 62) - 1}


def test_stalls_appear_with_tiny_bandwidth_and_vanish_with_huge() -> None:
    """Stalls grow to about DRAM time minus compute when bandwidth is tiny, and are 0 when it is huge."""
    layer = gemm(512, 512, 512)
    slow = time_layer(cfg(128, dram_gbps=0.1), layer)
    fast = time_layer(cfg(128, dram_gbps=1e7), layer)
    assert fast.stall_cycles == 0 and fast.compute_cycles == slow.compute_cycles == 12255
    bpc = cfg(128, dram_gbps=0.1).bytes_per_cycle
    dram_cycles = slow.dram_bytes / bpc
    assert dram_cycles - slow.compute_cycles <= slow.stall_cycles <= dram_cycles


def test_operands_that_fit_are_fetched_once() -> None:
    """With room for everything, DRAM traffic is inputs + weights + outputs once (int8: 1 B each)."""
    t = time_layer(cfg(32), gemm(100, 64, 70))
    assert t.dram_bytes == 100 * 64 + 64 * 70 + 100 * 70


def test_small_scratchpad_refetches() -> None:
    """When the inputs do not fit half the input scratchpad, each column fold fetches them again."""
    big = time_layer(cfg(32), gemm(1000, 64, 96))
    small = time_layer(cfg(32, ifmap_sram=16 * KiB), gemm(1000, 64, 96))
    assert big.dram_bytes == 1000 * 64 + 64 * 96 + 1000 * 96
    assert small.dram_bytes == 3 * 1000 * 64 + 64 * 96 + 1000 * 96  # ceil(96/32) = 3 column folds


def test_given_bytes_and_conv_feature_map_drive_traffic() -> None:
    """A layer's own byte counts are used when given; a conv without them reads its feature map."""
    t = time_layer(cfg(32), MatLayer("g", "Gemm", 64, 64, 64, weight_bytes=1000, input_bytes=2000,
                                     output_bytes=3000))
    assert t.dram_bytes == 6000
    conv = MatLayer("c", "Conv", m=54 * 54, k=576, n=64, conv=ConvGeom(56, 56, 3, 3, 64, 64, 1))
    assert time_layer(cfg(128, filter_sram=4 * MiB), conv).dram_bytes == 56 * 56 * 64 + 576 * 64 + 54 * 54 * 64


def test_vector_layer() -> None:
    """Vector work is ceil(elements x ops / lanes) cycles; DRAM streams alongside and stalls the rest."""
    c = cfg(32, vector_lanes=64)
    t = time_layer(c, VecLayer("v", "Relu", elements=1000, ops=3))
    assert (t.compute_cycles, t.stall_cycles, t.macs) == (47, 0, 0)
    slow = time_layer(c.with_(dram_gbps=1.0), VecLayer("v", "Add", 1000, 1, bytes_in=2000, bytes_out=1000))
    assert (slow.compute_cycles, slow.stall_cycles, slow.dram_bytes) == (16, 3000 - 16, 3000)


def test_model_totals_and_utilization() -> None:
    """ModelTiming sums its layers; utilization is MACs over cycles x PEs; seconds at the clock."""
    c = cfg(32, freq_mhz=500.0)
    mt = time_model(c, [gemm(32, 50, 32), VecLayer("v", "Relu", 640)])
    assert isinstance(mt.layers[0], LayerTiming)
    assert mt.compute_cycles == 111 + 640 // 128 and mt.cycles == mt.compute_cycles + mt.stall_cycles
    assert mt.macs == 32 * 50 * 32
    assert mt.seconds(c) == pytest.approx(mt.cycles / 5e8)
    assert mt.utilization(c) == pytest.approx(32 * 50 * 32 / (mt.cycles * 1024))
    assert ModelTiming(()).utilization(c) == 0.0


def test_bad_inputs() -> None:
    """Non-layers and non-positive dimensions are refused, naming the value."""
    with pytest.raises(ConfigError, match="neither a MatLayer nor a VecLayer"):
        time_layer(cfg(), "conv1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="k=0"):
        gemm(4, 0, 4)


dims = st.integers(min_value=1, max_value=700)


@settings(max_examples=150, deadline=None)
@given(m=dims, k=dims, n=dims, side=st.sampled_from([4, 16, 32, 128]), df=st.sampled_from(["os", "ws", "is"]))
def test_cycles_bound_and_monotone(m: int, k: int, n: int, side: int, df: str) -> None:
    """Cycles >= MACs / PEs, and compute cycles never drop when m, k or n grows."""
    c = cfg(side, df, dram_gbps=4.0)
    t = time_layer(c, gemm(m, k, n))
    assert t.cycles >= t.macs / (side * side)
    assert t.stall_cycles >= 0
    for bigger in (gemm(m + 1, k, n), gemm(m, k + 1, n), gemm(m, k, n + 1)):
        assert time_layer(c, bigger).compute_cycles >= t.compute_cycles


def test_double_buffering_closed_forms() -> None:
    """OS 64x50x32 on 32x32 (2 folds of 112 cycles; fold 1 moves 3200 B in + 1024 out, fold 2 moves
    1600 in (weights kept) + 1024 out). Compute-bound: only the first loads and last stores show
    (3200/100 + 1024/100 = 42 cycles). Bandwidth-bound: total = DRAM time (stall = 6848 - 224)."""
    layer = gemm(64, 50, 32)
    hidden = time_layer(cfg(32, dram_gbps=100.0), layer)
    assert (hidden.compute_cycles, hidden.dram_bytes, hidden.stall_cycles) == (223, 6848, 42)
    bound = time_layer(cfg(32, dram_gbps=1.0), layer)
    assert bound.stall_cycles == 6848 - 224


def test_bench_compare_reports_errors_and_speedup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's comparison (SCALE-Sim replaced by a fake 2% off on one layer) reports that 2%."""
    import io

    import gfaas.bench.accel as ba

    def fake(py: object, rows: int, cols: int, df: str, layers: tuple) -> dict:
        c = cfg(rows, df)
        cyc = [time_layer(c, conv_layer(*r)).compute_cycles for r in layers]
        cyc[1] = round(cyc[1] / 1.02)
        return {"layers": [{"total": x + 5, "stall": 5} for x in cyc], "wall_s": 2.0}

    monkeypatch.setattr(ba, "run_scalesim", fake)
    monkeypatch.setattr(ba, "ensure_venv", lambda log=None: "python")
    res = ba.run(quick=True, log=io.StringIO())
    assert [(b["array"], b["dataflow"]) for b in res["layers"]] == [("128x128", "os"), ("128x128", "ws")]
    assert res["max_rel_err"] == pytest.approx(0.02, abs=1e-3)  # rounding to whole cycles
    r50 = res["resnet50"][0]
    assert r50["ours_total"] == 611_561 and r50["layers"][1]["rel_err"] > 0.019
    assert res["speedup_vs_scalesim"] == pytest.approx(2.0 / r50["ours_wall_s"])
