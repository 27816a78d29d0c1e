"""Seed 004 §6 model: work counts, rooflines, storage paths, cost efficiency, the chain's phases, the rack
run and the experiments (with a test-only DSCS provider: the real one is the accelerator model)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from gfaas.errors import ConfigError
from gfaas.sim import dscs as d
from gfaas.sim.dscs_work import graph_work, zoo_work
from gfaas.sim.experiments import REGISTRY, run_experiment
from gfaas.sim.experiments import dscs as ex
from gfaas.sim.kernel import EventLog, Simulator

DSCS_NAMES = ("dscs-platforms", "dscs-batch", "dscs-tail", "dscs-functions", "dscs-cold", "dscs-rack")


def placeholder_provider(model: str, batch: int) -> tuple[float, float]:
    """TEST PLACEHOLDER, not a result: 1 ms per inference per item and 4.2 mJ (4.2 W x 1 ms)."""
    return 1e-3 * batch, 4.2e-3 * batch


# ---- work counts ----------------------------------------------------------------------------------


def _tiny_model() -> object:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w", (4, 3, 3, 3)), ("g", (256, 10)), ("m", (10, 5)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Flatten", ["c"], ["f"]),
             helper.make_node("Gemm", ["f", "g"], ["h"]),
             helper.make_node("MatMul", ["h", "m"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "tiny", [x], [y], initializer=inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_graph_work_counts_conv_gemm_matmul_macs() -> None:
    """Conv 3->4 3x3 on 8x8 (256 outputs x 27), Gemm 256->10, MatMul 10->5; params are the initializers."""
    w = graph_work(_tiny_model(), "tiny")  # type: ignore[arg-type]
    assert (w.macs, w.params, w.in_bytes, w.out_bytes) == (256 * 27 + 2560 + 50, 108 + 2560 + 50, 768, 20)
    assert w.flops == 2 * w.macs and w.weight_bytes(1.0) == w.params


def test_zoo_work_matches_published_macs_and_scales_with_batch() -> None:
    """ResNet-50 at 224x224 is 4.089 GMAC (torchvision's resnet50 metadata, 4.09 'GFLOPS' = MACs); batch 4 is 4x."""
    r1 = zoo_work("resnet50", 1)
    assert r1.macs == pytest.approx(4.089e9, rel=1e-3)
    assert r1.params == pytest.approx(25_557_032, rel=0.01)  # + BN running statistics, read too
    assert zoo_work("resnet50", 4).macs == 4 * r1.macs
    assert zoo_work("logreg").macs == 32  # 32 features x 1 output
    with pytest.raises(ConfigError, match="batch=0"):
        zoo_work("logreg", 0)


# ---- rooflines, storage, cost ---------------------------------------------------------------------------


def test_roofline_is_the_slower_of_compute_and_memory() -> None:
    """max(flops / (peak * eff), bytes / (bw * eff)), exactly."""
    p = d.Platform("t", "t", peak_flops=100.0, mem_bw=10.0, eff_compute=0.5, eff_memory=0.5, power_w=1.0,
                   price_usd=0.0, near=False)
    assert d.roofline_seconds(100.0, 1.0, p) == 2.0  # compute-bound: 100 / 50
    assert d.roofline_seconds(1.0, 20.0, p) == 4.0  # memory-bound: 20 / 5
    with pytest.raises(ConfigError, match="eff_compute=0"):
        d.Platform("bad", "x", 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, near=False)
    with pytest.raises(ConfigError, match="both must be >= 0"):
        d.roofline_seconds(-1.0, 0.0, p)


def test_table2_peaks_follow_from_cores_and_clocks() -> None:
    """CPU 16 x 3 GHz x 32 FLOP; RTX 2080 Ti 4352 x 2 x 1.35 GHz; SmartSSD 256 PEs x 2 x 250 MHz."""
    assert d.PLATFORMS["cpu"].peak_flops == pytest.approx(1.536e12)
    assert d.PLATFORMS["gpu"].peak_flops == pytest.approx(11.7504e12)
    assert d.PLATFORMS["ns-fpga"].peak_flops == pytest.approx(128e9)
    assert [d.PLATFORMS[p].power_w for p in d.PLATFORM_ORDER[:-1]] == [240, 250, 225, 15, 15, 18]


def test_dscs_preprocessing_is_the_vector_unit_roofline() -> None:
    """f1 on DSCS: 10 op/byte on 128 lanes x 1 GHz (compute-bound) vs 38 GB/s x 0.7 (the shared dscs preset)."""
    assert d.dscs_vector_seconds(1.28e10) == pytest.approx(1.0)  # memory alone: 1.28e10 / 26.6e9 = 0.48 s


def test_s3_fit_reproduces_its_sources() -> None:
    """The lognormal has p90 = 20 ms (s3-benchmark) and p99 = 2.1 x p50 (seed 004 Fig. 3)."""
    med, sig = d.S3_MEDIAN_S, d.S3_SIGMA
    assert d.lognormal_quantile(med, sig, 0.9) == pytest.approx(0.020)
    assert d.lognormal_quantile(med, sig, 0.99) / d.lognormal_quantile(med, sig, 0.5) == pytest.approx(2.1)
    paths = d.StoragePaths()
    assert paths.remote(93e6) == pytest.approx(d.lognormal_quantile(med, sig, 0.95) + 1.0)
    assert paths.stack_s == pytest.approx(2 / 3 * d.lognormal_quantile(med, sig, 0.95))
    assert paths.p2p(3.94e9) == pytest.approx(d.lognormal_quantile(90e-6, sig, 0.95) + 1.0)
    with pytest.raises(ConfigError, match="quantile 1.0 must be in"):
        d.StoragePaths(quantile=1.0)
    with pytest.raises(ConfigError, match="remote_bw=0"):
        d.StoragePaths(remote_bw=0)


def test_cost_efficiency_closed_form() -> None:
    """Requests per dollar: busy time / latency over CAPEX + energy x $/kWh (3 years at 30%)."""
    busy = 3 * 365 * 24 * 3600 * 0.3
    req = busy / 0.5
    want = req / (1000.0 + req * 360.0 / 3.6e6 * 0.0975)
    assert d.cost_efficiency(0.5, 360.0, 1000.0) == pytest.approx(want, rel=1e-12)
    # no energy: just throughput x T / CAPEX
    assert d.cost_efficiency(1.0, 0.0, 10.0, years=1.0, utilisation=1.0) == pytest.approx(365 * 24 * 3600 / 10.0)
    with pytest.raises(ConfigError, match="latency must be > 0"):
        d.cost_efficiency(0.0, 1.0, 1.0)


# ---- the chain ---------------------------------------------------------------------------------------------


def test_cpu_chain_phases_in_order() -> None:
    """On the CPU every function pays stack, remote read, compute, remote write; f3 likewise."""
    b = d.phases(d.APPS["credit-risk"], "cpu", d.StoragePaths())
    kinds = [(p.func, p.kind) for p in b.phases]
    per = ["stack", "remote-read", "compute", "remote-write"]
    assert kinds == [(f, k) for f in ("f1", "f2", "f3") for k in per]
    assert b.seconds == pytest.approx(sum(p.seconds for p in b.phases))


def test_dscs_chain_stays_on_the_drive_until_f3() -> None:
    """DSCS: f1/f2 use P2P and the provider's compute (seconds and joules); only f3 touches remote storage."""
    paths = d.StoragePaths()
    b = d.phases(d.APPS["asset-damage"], "dscs", paths, provider=placeholder_provider)
    remote = [(p.func, p.kind) for p in b.phases if p.kind.startswith("remote")]
    assert remote == [("f3", "remote-read"), ("f3", "remote-write")]
    f2 = [p for p in b.phases if p.func == "f2" and p.kind == "compute"]
    assert [p.seconds for p in f2] == [1e-3] and f2[0].watts == 0.0
    assert b.extra_joules == pytest.approx(4.2e-3)
    # Amdahl: whatever the accelerator does, stack + f3 bound the speed-up
    base = d.phases(d.APPS["asset-damage"], "cpu", paths)
    bound = sum(p.seconds for p in b.phases if p.func == "f3" or p.kind == "stack")
    assert base.seconds / b.seconds < base.seconds / bound


def test_dscs_needs_a_provider_and_checks_it() -> None:
    """No provider: a ConfigError that names the hook; a provider returning nonsense is named too."""
    with pytest.raises(ConfigError, match="dscs_provider"):
        d.phases(d.APPS["chatbot"], "dscs", d.StoragePaths())
    with pytest.raises(ConfigError, match=r"returned \(-1.0 s"):
        d.phases(d.APPS["chatbot"], "dscs", d.StoragePaths(), provider=lambda m, b: (-1.0, 0.0))
    with pytest.raises(ConfigError, match="unknown platform 'tpu'"):
        d.phases(d.APPS["chatbot"], "tpu", d.StoragePaths())


def test_extra_functions_and_batch_grow_the_chain() -> None:
    """Each duplicated f2 adds one stack; batch multiplies the objects moved."""
    app = d.APPS["remote-sensing"]
    one = d.phases(app, "cpu", d.StoragePaths(), extra_f2=0)
    three = d.phases(app, "cpu", d.StoragePaths(), extra_f2=2)
    assert sum(p.kind == "stack" for p in three.phases) - sum(p.kind == "stack" for p in one.phases) == 2
    assert app.objects(8) == tuple(8 * x for x in app.objects(1))
    with pytest.raises(ConfigError, match="extra_f2=-1"):
        d.phases(app, "cpu", d.StoragePaths(), extra_f2=-1)


# ---- the rack ----------------------------------------------------------------------------------------------


def test_rack_event_log_busy_flag_failover_and_fcfs() -> None:
    """Two drives, one CPU: busy drive fails over to the CPU, then queues; a freed drive takes its waiter."""
    sim = Simulator()
    log = EventLog(sim)
    r = d.simulate_rack([0.0, 0.0, 0.25, 0.5], ["a"] * 4, [0, 0, 0, 1], {"a": 1.0}, {"a": 2.0}, drives=2, cpus=1,
                        sample_every_s=0, log=log, sim=sim)
    assert log.entries == [
        (0.0, "arrive", 0, "a"), (0.0, "start", 0, "accel", 0),
        (0.0, "arrive", 1, "a"), (0.0, "start", 1, "cpu"),
        (0.25, "arrive", 2, "a"),
        (0.5, "arrive", 3, "a"), (0.5, "start", 3, "accel", 1),
        (1.0, "done", 0), (1.0, "start", 2, "accel", 0),
        (1.5, "done", 3),
        (2.0, "done", 1), (2.0, "done", 2),
    ]
    assert (r.completed, r.on_accel, r.on_cpu, r.rejected) == (4, 3, 1, 0)
    assert sorted(r.latencies.tolist()) == [1.0, 1.0, 1.75, 2.0]


def test_rack_rejects_beyond_queue_depth_and_baseline_uses_cpus_only() -> None:
    """Depth 1: the third request at once is refused; every drive absent sends everything to the CPU."""
    sim = Simulator()
    log = EventLog(sim)
    r = d.simulate_rack([0.0, 0.0, 0.0], ["a"] * 3, [0, 0, 0], {"a": 1.0}, {"a": 3.0}, drives=1, cpus=1,
                        queue_depth=1, healthy=[False], sample_every_s=0, log=log, sim=sim)
    assert log.of("reject") == [(0.0, "reject", 2)]
    assert log.of("start") == [(0.0, "start", 0, "cpu"), (3.0, "start", 1, "cpu")]
    assert (r.on_accel, r.on_cpu, r.rejected, r.completed, r.makespan_s) == (0, 2, 1, 2, 6.0)


def test_rack_queue_samples_and_bad_inputs() -> None:
    """Queue length is sampled each second until a sample finds the run empty; mismatched inputs are named."""
    r = d.simulate_rack([0.0, 0.0, 0.0], ["a"] * 3, [0, 0, 0], {"a": 1.5}, {"a": 1.5}, drives=1, cpus=0)
    # completions at 1.5, 3.0 and 4.5 s; the sample at 5 s finds nothing pending and stops
    assert r.queue_samples == [(0.0, 2), (1.0, 2), (2.0, 1), (3.0, 0), (4.0, 0), (5.0, 0)]
    with pytest.raises(ConfigError, match="3 arrival times but 2 applications"):
        d.simulate_rack([0.0, 1.0, 2.0], ["a", "a"], [0, 0, 0], {"a": 1.0}, {"a": 1.0}, drives=1, cpus=1)
    with pytest.raises(ConfigError, match="no positive finite service time for application 'b'"):
        d.simulate_rack([0.0], ["b"], [0], {"a": 1.0}, {"a": 1.0}, drives=1, cpus=1)
    with pytest.raises(ConfigError, match="need at least one platform"):
        d.simulate_rack([0.0], ["a"], [0], {"a": 1.0}, {"a": 1.0}, drives=0, cpus=0)


def test_rack_matches_erlang_c_on_poisson_input() -> None:
    """CPUs only, Poisson arrivals, deterministic service: mean wait lies between M/D/c (~half M/M/c) and M/M/c."""
    rng = np.random.default_rng(3)
    lam, c, s = 8.0, 4, 0.4  # utilisation 0.8
    t = np.cumsum(rng.exponential(1 / lam, 40_000))
    r = d.simulate_rack(t, ["a"] * t.size, [0] * t.size, {"a": s}, {"a": s}, drives=1, cpus=c,
                        healthy=[False], sample_every_s=0)
    a = lam * s
    rho = a / c
    tail = a**c / math.factorial(c) / (1 - rho)
    pw = tail / (sum(a**k / math.factorial(k) for k in range(c)) + tail)
    wq_mmc = pw * s / (c * (1 - rho))
    wait = float(r.latencies.mean()) - s
    assert 0.45 * wq_mmc < wait < 0.75 * wq_mmc  # M/D/c waits are about half M/M/c's (Cosmetatos)


# ---- experiments ---------------------------------------------------------------------------------------------


def test_experiments_refuse_without_a_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Until the accelerator model is wired, every DSCS experiment raises a ConfigError naming the hook."""
    monkeypatch.setattr(ex, "dscs_provider", None)
    for name in DSCS_NAMES:
        with pytest.raises(ConfigError, match="gfaas.sim.experiments.dscs.dscs_provider"):
            run_experiment(name, quick=True)
        assert REGISTRY[name].in_all is ex.IN_ALL


def test_platform_experiment_with_injected_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows for 8 apps x 7 platforms; CPU rows are 1x; DSCS f2 compute is the provider's; 12 comparisons."""
    monkeypatch.setattr(ex, "dscs_provider", placeholder_provider)
    res = run_experiment("dscs-platforms", quick=True)
    assert len(res.rows) == 8 * 7 and len(res.paper) == 12
    assert all(r["speedup"] == 1.0 and r["cost_efficiency"] == 1.0 for r in res.rows if r["platform"] == "cpu")
    dscs_rows = [r for r in res.rows if r["platform"] == "dscs"]
    assert all(r["speedup"] < res.data["amdahl_bound"][r["app"]] for r in dscs_rows)
    f1 = {a: d.phases(d.APPS[a], "dscs", d.StoragePaths(), provider=placeholder_provider).phases
          for a in d.APPS}
    for r in dscs_rows:
        pre = next(p.seconds for p in f1[r["app"]] if p.func == "f1" and p.kind == "compute")
        f3 = next(p.seconds for p in f1[r["app"]] if p.func == "f3" and p.kind == "compute")
        assert r["compute_ms"] == pytest.approx((1e-3 + pre + f3) * 1e3)


def test_sensitivity_experiments_with_injected_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch, tail, functions and cold runs give one row per app and setting, ordered as the paper's trends."""
    monkeypatch.setattr(ex, "dscs_provider", placeholder_provider)
    tail = run_experiment("dscs-tail", quick=True)
    mean_at = {p: np.mean([r["speedup"] for r in tail.rows if r["percentile"] == p]) for p in (50, 95, 99)}
    assert mean_at[50] < mean_at[95] < mean_at[99]  # remote tails hurt the CPU more than DSCS
    funcs = run_experiment("dscs-functions", quick=True)
    by = [np.mean([r["speedup"] for r in funcs.rows if r["extra_functions"] == e]) for e in range(4)]
    assert by == sorted(by) and len(funcs.rows) == 32
    cold = run_experiment("dscs-cold", quick=True)
    assert all(r["cpu_ms"] > 0 for r in cold.rows) and len(cold.rows) == 16
    batch = run_experiment("dscs-batch", quick=True)
    assert sorted({r["batch"] for r in batch.rows}) == [1, 8, 64]


def test_rack_experiment_small(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A 1-minute, 10-platform rack: both systems see the same requests; DSCS runs most on drives; files written."""
    monkeypatch.setattr(ex, "dscs_provider", placeholder_provider)
    res = run_experiment("dscs-rack", params={"minutes": "1", "platforms": "10", "failover": "2"})
    base, dscs = res.rows
    assert base["system"] == "baseline-cpu" and dscs["system"] == "dscs"
    assert base["requests"] == dscs["requests"] > 0
    assert base["on_accelerator"] == 0 and dscs["on_accelerator"] > dscs["on_cpu"]
    assert base["completed"] + base["rejected"] == base["requests"]
    assert len(res.data["trace"]["t_s"]) == len(res.data["series"]["dscs"]["queue"]) == 6
    names = {p.rsplit("/", 1)[-1] for p in res.write(str(tmp_path))}
    assert {"dscs-rack.json", "dscs-rack.md"} <= names
    with pytest.raises(ConfigError, match="platforms='0'"):
        run_experiment("dscs-rack", params={"platforms": "0"})


def test_provider_is_called_once_per_model_and_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run asks the provider once per (model, batch), however many chains use it."""
    calls: list[tuple[str, int]] = []

    def counting(model: str, batch: int) -> tuple[float, float]:
        calls.append((model, batch))
        return placeholder_provider(model, batch)

    monkeypatch.setattr(ex, "dscs_provider", counting)
    run_experiment("dscs-functions", quick=True)
    assert sorted(calls) == sorted((a.model, 1) for a in d.APPS.values())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 2)), min_size=1, max_size=30),
       st.integers(1, 3), st.integers(0, 2), st.integers(1, 4))
def test_rack_conserves_requests_and_serves_each_queue_in_order(
        arrivals: list[tuple[int, int]], drives: int, cpus: int, depth: int) -> None:
    """Every request finishes or is refused once; none waits less than nothing; per drive and on the CPUs,
    requests start in arrival order (FCFS), and no drive runs two at once (busy flag)."""
    arrivals = sorted(arrivals)
    times = [t / 4 for t, _ in arrivals]
    homes = [h % drives for _, h in arrivals]
    sim = Simulator()
    log = EventLog(sim)
    r = d.simulate_rack(times, ["a"] * len(times), homes, {"a": 0.75}, {"a": 1.25}, drives=drives, cpus=cpus,
                        queue_depth=depth, sample_every_s=0, log=log, sim=sim)
    assert r.completed + r.rejected == len(times) and r.on_accel + r.on_cpu == r.completed
    assert all(lat >= 0.75 for lat in r.latencies)
    starts = log.of("start")
    for drv in range(drives):
        rids = [e[2] for e in starts if e[3] == "accel" and e[4] == drv]
        assert rids == sorted(rids)
    cpu_rids = [e[2] for e in starts if e[3] == "cpu"]
    assert cpu_rids == sorted(cpu_rids)  # a CPU is free only while nobody waits
    busy_until: dict[int, float] = {}
    for t, _, _rid, where, *rest in starts:
        if where == "accel":
            assert busy_until.get(rest[0], 0.0) <= t
            busy_until[rest[0]] = t + 0.75


def test_default_provider_is_the_accelerator_model() -> None:
    """The experiments' DSCS compute comes from compiling the model and timing it, not a stand-in."""
    from gfaas.accel.arch import preset
    from gfaas.accel.estimate import dscs_seconds_joules, estimate

    assert ex.dscs_provider is dscs_seconds_joules
    small = estimate("logreg", preset("dscs"), 1, scale="small")
    assert small.seconds == small.timing.seconds(preset("dscs")) > 0
    assert small.joules == small.energy.total_j > 0
    assert estimate("logreg", preset("dscs"), 8, scale="small").timing.macs == 8 * small.timing.macs
