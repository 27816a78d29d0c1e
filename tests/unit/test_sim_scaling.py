"""Simulated PipeCast scale-out (gfaas.sim.scaling): closed forms, plan fidelity, serving, bad inputs."""

from __future__ import annotations

import math

import pytest

from gfaas.errors import ConfigError
from gfaas.policy.multicast import plan
from gfaas.policy.pipelines import pipeline_changes
from gfaas.sim.experiments import run_experiment
from gfaas.sim.scaling import (
    H800,
    LLAMA2,
    NODE_STATES,
    SSD_GBPS,
    Fleet,
    block_bytes,
    multicast_seconds,
    run_burst,
    run_trace,
)
from gfaas.topology import GB, preset

NIC = 50e9  # 400 Gb/s, the narrowest link of every GPU-to-GPU path on the H800 presets


def test_one_block_over_one_link_takes_size_over_rate() -> None:
    secs, mc = multicast_seconds(preset("h800x1*2"), LLAMA2["7b"], "binomial", blocks=1)
    assert secs == pytest.approx(LLAMA2["7b"].weight_bytes / NIC, rel=1e-9)
    assert mc.arrivals == [[], [(secs, 0)]]


@pytest.mark.parametrize("scheme", ["binomial", "tree", "chain", "sequential"])
@pytest.mark.parametrize(("nodes", "blocks", "sources"), [(2, 1, 1), (4, 3, 1), (8, 16, 1), (12, 16, 1),
                                                         (12, 16, 2), (12, 8, 4), (7, 5, 3)])
def test_multicast_takes_its_step_count_in_block_times(scheme: str, nodes: int, blocks: int, sources: int) -> None:
    """On an idle uniform cluster every transfer runs at line rate and every plan's critical path is
    as long as the plan: seconds = steps x block bytes / link rate."""
    model = LLAMA2["7b"]
    secs, mc = multicast_seconds(preset(f"h800x1*{nodes}"), model, scheme, sources=sources, blocks=blocks)
    block_s = block_bytes(model, blocks) / NIC
    assert secs == pytest.approx(mc.schedule.num_steps * block_s, rel=1e-9)


@pytest.mark.parametrize(("scheme", "nodes", "sources"), [("binomial", 8, 1), ("binomial", 12, 2), ("tree", 12, 1),
                                                          ("chain", 6, 1), ("binomial", 6, 4)])
def test_blocks_arrive_in_the_plans_order_at_the_plans_steps(scheme: str, nodes: int, sources: int) -> None:
    model, blocks = LLAMA2["13b"], 8
    secs, mc = multicast_seconds(preset(f"h800x1*{nodes}"), model, scheme, sources=sources, blocks=blocks)
    block_s = block_bytes(model, blocks) / NIC
    want = mc.schedule.arrivals()
    for node in range(nodes):
        assert [b for _, b in mc.arrivals[node]] == [b for _, b in want[node]]
        if scheme == "binomial":  # lockstep: the block of step t lands at (t + 1) block times
            assert [t for t, _ in mc.arrivals[node]] == pytest.approx([(s + 1) * block_s for s, _ in want[node]])


def test_multi_gpu_nodes_send_each_block_between_its_owner_gpus() -> None:
    """70B on four-GPU nodes: block b travels between the GPUs that run it, through one NIC per node."""
    fleet = Fleet(preset("h800x4*2"), LLAMA2["70b"], "gfaas", blocks=8)
    assert [fleet.owner_gpu(1, b) for b in range(8)] == ["n1.gpu0"] * 2 + ["n1.gpu1"] * 2 + ["n1.gpu2"] * 2 + ["n1.gpu3"] * 2
    assert fleet.route("n0.gpu2", "n1.gpu2") == ["n0.gpu2", "n0.pcie0", "n0.nic0", "fabric", "n1.nic0", "n1.pcie0", "n1.gpu2"]
    assert fleet.route("n0.gpu0", "n0.gpu3") == ["n0.gpu0", "n0.nvswitch", "n0.gpu3"]
    secs, _ = multicast_seconds(preset("h800x4*2"), LLAMA2["70b"], "binomial", blocks=8)
    assert secs == pytest.approx(LLAMA2["70b"].weight_bytes / NIC, rel=1e-9)


@pytest.mark.parametrize(("nodes", "sources"), [(12, 1), (12, 2), (8, 4)])
def test_pipelines_form_at_the_planners_steps(nodes: int, sources: int) -> None:
    """With no requests, each new node starts serving (in a pipeline or alone) at the step the
    planner says, in block times."""
    model, blocks = LLAMA2["7b"], 16
    res = run_burst(preset(f"h800x1*{nodes}"), model, "gfaas", sources, [], blocks=blocks)
    block_s = block_bytes(model, blocks) / NIC
    first: dict[int, int] = {}
    for ch in pipeline_changes(plan(nodes, blocks, sources, "binomial")):
        for n in (ch.pipeline.nodes if ch.kind == "formed" and ch.pipeline else (ch.node,) if ch.kind == "local" else ()):
            assert n is not None
            first.setdefault(n, ch.step)
    assert set(first) == set(range(sources, nodes))
    for n, step in first.items():
        assert res.first_serving[n] == pytest.approx(step * block_s, rel=1e-9), n
    if sources > 1:  # k-way transmission: some node serves before any node holds the whole model
        assert min(first.values()) < min(plan(nodes, blocks, sources, "binomial").completion_step()[sources:])


def test_first_request_ttft_and_finish_in_closed_form() -> None:
    """One request on an idle source: the prefill iteration, then one decode iteration per token,
    each the roofline max of weight + KV reads and FLOPs."""
    m, prompt, out = LLAMA2["7b"], 1000, 3
    res = run_burst(preset("h800x1*2"), m, "faasnet", 1, [(0.0, prompt, out)])
    bw, flops = H800.hbm_gbps * GB * H800.hbm_eff, H800.tflops * 1e12 * H800.mfu
    t1 = max(m.weight_bytes / bw, 2 * m.params * prompt / flops)
    decode = [max((m.weight_bytes + (prompt + g) * m.kv_bytes_per_token) / bw, 2 * m.params / flops)
              for g in (1, 2)]
    req = res.requests[0]
    assert req.ttft == pytest.approx(t1, rel=1e-9)
    assert req.finished == pytest.approx(t1 + sum(decode), rel=1e-9)
    assert len(res.tokens) == out


def test_ttft_splits_into_waiting_and_prefill_in_closed_form() -> None:
    """On a loaded node a request arriving alone starts its prefill at once (waits 0) and its
    prefill takes the prefill iteration; a second prompt that does not fit the first batch
    (2 x 5000 > MAX_PREFILL_TOKENS) waits exactly that iteration, then shares a batch with the
    first request's decode step."""
    m, prompt = LLAMA2["7b"], 5000
    bw, flops = H800.hbm_gbps * GB * H800.hbm_eff, H800.tflops * 1e12 * H800.mfu
    t1 = max(m.weight_bytes / bw, 2 * m.params * prompt / flops)
    alone = run_burst(preset("h800x1*2"), m, "faasnet", 1, [(0.5, prompt, 2)]).requests[0]
    assert alone.placed == alone.prefill_start == 0.5 and alone.waited == 0.0
    assert alone.prefill == pytest.approx(t1, rel=1e-9)
    first, second = run_burst(preset("h800x1*2"), m, "faasnet", 1, [(0.0, prompt, 2), (0.0, prompt, 2)]).requests
    assert first.waited == 0.0 and first.prefill == pytest.approx(t1, rel=1e-9)
    assert second.placed == 0.0 and second.waited == pytest.approx(t1, rel=1e-9)
    t2 = max((m.weight_bytes + (prompt + 1) * m.kv_bytes_per_token) / bw, 2 * m.params * (prompt + 1) / flops)
    assert second.prefill == pytest.approx(t2, rel=1e-9)


@pytest.mark.parametrize("system", ["gfaas", "faasnet", "nccl", "serverlessllm"])
def test_waiting_and_prefill_sum_to_the_ttft_of_every_request(system: str) -> None:
    reqs = [(0.01 * i, 400 + 37 * i % 900, 1 + i % 9) for i in range(120)]
    res = run_burst(preset("h800x1*8"), LLAMA2["7b"], system, 2, reqs)
    for r in res.requests:
        assert r.arrival <= r.placed <= r.prefill_start < r.first_token
        assert r.waited + r.prefill == pytest.approx(r.ttft, rel=1e-12, abs=1e-12)
    assert any(r.waited > 0 for r in res.requests)  # the burst queues


def test_serverlessllm_loads_from_ssd_at_its_rate() -> None:
    res = run_burst(preset("h800x1*3"), LLAMA2["13b"], "serverlessllm", 1, [])
    assert res.first_serving[1] == res.first_serving[2] == pytest.approx(LLAMA2["13b"].weight_bytes / (SSD_GBPS * GB))
    assert math.isnan(res.multicast_s)


def test_every_request_is_served_once_and_gfaas_serves_new_nodes_first() -> None:
    reqs = [(0.01 * i, 400 + 37 * i % 900, 1 + i % 9) for i in range(120)]
    runs = {s: run_burst(preset("h800x1*8"), LLAMA2["7b"], s, 2, reqs) for s in ("gfaas", "faasnet", "nccl", "serverlessllm")}
    for s, res in runs.items():
        assert len(res.tokens) == sum(o for _, _, o in reqs), s
        assert all(r.generated == r.output and r.first_token >= r.arrival for r in res.requests), s
    start = {s: min(t for n, t in r.first_serving.items() if n >= 2) for s, r in runs.items()}
    assert start["gfaas"] < min(v for k, v in start.items() if k != "gfaas")


def test_ideal_scaling_uses_the_least_gpu_time() -> None:
    res = run_experiment("scaling-gpu-time", quick=True)
    gpu = {r["system"]: r["gpu_hours"] for r in res.rows}
    assert set(gpu) == {"ideal", "gfaas", "faasnet", "nccl", "serverlessllm"}
    assert all(gpu["ideal"] <= v for v in gpu.values()), gpu
    assert res.data["timeline"] and {c.metric for c in res.paper} >= {"largest gap to ideal scaling"}


def test_gpu_time_splits_into_what_the_nodes_did_and_the_gap_into_its_parts() -> None:
    """The state split sums to the GPU time the allocation intervals give (allocations change only at
    ticks); ideal scaling never loads; each gap to ideal is loading + idle + serving points exactly."""
    res = run_experiment("scaling-gpu-time", quick=True)
    rows = {r["system"]: r for r in res.rows}
    assert rows["ideal"]["loading_gpu_h"] == 0 and rows["ideal"]["gap_pct"] == 0
    for s, r in rows.items():
        assert 0 <= r["loading_gpu_h"] + r["idle_gpu_h"] <= r["gpu_hours"], s
        assert r["gap_pct"] == pytest.approx((r["gpu_hours"] / rows["ideal"]["gpu_hours"] - 1) * 100)
        parts = r["gap_loading_pts"] + r["gap_idle_pts"] + r["gap_serving_pts"]
        assert parts == pytest.approx(r["gap_pct"], abs=1e-9), s
    assert all(rows[s]["loading_gpu_h"] > 0 for s in ("gfaas", "faasnet", "nccl", "serverlessllm"))
    # gfaas loads from host memory or by PipeCast from replicas: the least GPU time loading of all
    assert rows["gfaas"]["loading_gpu_h"] < min(rows[s]["loading_gpu_h"] for s in ("faasnet", "nccl", "serverlessllm"))


def test_a_trace_s_state_split_sums_to_its_gpu_seconds() -> None:
    topo = preset("h800x1*4")
    reqs = [(0.1 * k, 200, 20) for k in range(60)] + [(30.0 + 0.2 * k, 200, 20) for k in range(20)]
    idle: dict[str, float] = {}
    for system in ("ideal", "gfaas", "serverlessllm"):
        res = run_trace(topo, LLAMA2["7b"], system, reqs)
        assert set(res.states) == set(NODE_STATES)
        assert sum(res.states.values()) == pytest.approx(res.gpu_seconds, rel=1e-12), system
        idle[system] = res.states["idle"]
        if system == "ideal":
            assert res.states["loading"] == res.states["loading_serving"] == 0
    # between the bursts the others keep nodes warm for their scale-in window; ideal lets them go
    assert idle["gfaas"] > idle["ideal"] and idle["serverlessllm"] > idle["ideal"], idle


def test_gpu_load_sweep_runs_the_trace_once_per_load() -> None:
    """Each load is scaling-gpu-time at that load (same rows); the cut is against gfaas's GPU-hours."""
    sweep = run_experiment("scaling-gpu-load", quick=True, params={"loads": "0.3,0.8"})
    one = run_experiment("scaling-gpu-time", quick=True, params={"load": "0.3"})
    at = [r for r in sweep.rows if r["load"] == 0.3]
    assert [r["gpu_hours"] for r in at] == [r["gpu_hours"] for r in one.rows]
    ours = next(r["gpu_hours"] for r in at if r["system"] == "gfaas")
    for r in at:
        assert r["gfaas_cut_pct"] == pytest.approx((1 - ours / r["gpu_hours"]) * 100)
    assert sorted({r["load"] for r in sweep.rows}) == [0.3, 0.8]
    with pytest.raises(ConfigError, match="loads='0.3,x'"):
        run_experiment("scaling-gpu-load", quick=True, params={"loads": "0.3,x"})


def test_quick_experiments_run_and_compare_to_the_paper() -> None:
    mc = run_experiment("multicast-latency", quick=True)
    assert {r["system"] for r in mc.rows} == {"gfaas", "faasnet", "nccl", "nccl-sequential"}
    assert all(r["vs_gfaas"] >= 1 for r in mc.rows)
    ttft = run_experiment("scaling-ttft", quick=True)
    assert {r["system"] for r in ttft.rows} == {"gfaas", "faasnet", "nccl", "serverlessllm"}
    assert len(ttft.paper) == 3
    for r in ttft.rows:
        assert r["wait_s"] + r["prefill_s"] == pytest.approx(r["mean_ttft_s"], rel=1e-9)
        assert 0 <= r["wait_instance_s"] <= r["wait_s"] and r["prefill_share"] == r["prefill_s"] / r["mean_ttft_s"]
    ramp = run_experiment("scaling-ramp", quick=True)
    assert ramp.paper and ramp.data["throughput"]


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ConfigError, match="system='tcp' is unknown"):
        Fleet(preset("h800x1*2"), LLAMA2["7b"], "tcp")
    with pytest.raises(ConfigError, match="needs 138 GB per GPU"):
        Fleet(preset("h800x1*2"), LLAMA2["70b"], "gfaas")
    with pytest.raises(ConfigError, match="sources=3"):
        run_burst(preset("h800x1*3"), LLAMA2["7b"], "gfaas", 3, [])
    with pytest.raises(ConfigError, match="blocks=0"):
        block_bytes(LLAMA2["7b"], 0)
    with pytest.raises(ConfigError, match="'99b' is not one of"):
        run_experiment("scaling-ttft", quick=True, params={"models": "99b"})
    with pytest.raises(ConfigError, match="blocks='0'"):
        run_experiment("multicast-latency", quick=True, params={"blocks": "0"})


def test_moa_kv_passing_orders_the_systems_and_adds_the_same_first_token() -> None:
    """gfaas passes the KV cache faster than INFless+ and Mooncake+ in every case; TFTT is passing
    plus the same closed-form decode iteration for every system."""
    from gfaas.sim.experiments.moa import first_token_s

    res = run_experiment("moa", quick=True)
    for case in {r["case"] for r in res.rows}:
        got = {r["system"]: r for r in res.rows if r["case"] == case}
        assert got["gfaas"]["tftt_ms"] < min(got["infless+pinned"]["tftt_ms"], got["mooncake+"]["tftt_ms"]), case
        assert got["infless+pinned"]["passing_ms"] < got["infless+"]["passing_ms"], case
        model, tp, k = case.split()
        extra = first_token_s(model, int(tp[2:]), int(k[:-1]) * 1024) * 1e3
        for r in got.values():
            assert r["tftt_ms"] - r["passing_ms"] == pytest.approx(extra, rel=1e-9)
    # Sharding never slows gfaas down: two shards share the node's NICs (busy-path balancing).
    gf = {r["case"]: r["passing_ms"] for r in res.rows if r["system"] == "gfaas"}
    assert gf["13b TP2 4K"] <= gf["13b TP1 4K"] * 1.01
    m = LLAMA2["7b"]  # 4096 tokens x 2 (K, V) x 32 layers x 4096 x 2 bytes, the MoA default of gfaas.sim.workflows
    assert 4096 * m.kv_bytes_per_token == 4096 * 2 * 32 * 4096 * 2


def test_gpu_timeline_keeps_only_change_points_and_the_last_sample() -> None:
    """The saved timeline is the sampled step function without its repeats: same post-step plot."""
    from gfaas.sim.experiments.scaling import _change_points

    assert _change_points([(0.0, 1), (0.5, 1), (1.0, 2), (1.5, 2), (2.0, 2)]) == ([0.0, 1.0, 2.0], [1, 2, 2])
    assert _change_points([(0.0, 3)]) == ([0.0], [3])
    assert _change_points([]) == ([], [])
