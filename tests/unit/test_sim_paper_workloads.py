"""The papers' workloads table (gfaas/sim/data/paper_workloads.toml) and what the simulator makes of it."""

from __future__ import annotations

import pytest

from gfaas.errors import ConfigError
from gfaas.sim.paper_workloads import bursts, on_gpu, parse, parse_bursts
from gfaas.sim.profiles import CVCUDA, GPU_MEM_GBPS, Profile
from gfaas.sim.workflows import edge_sizes, touched_bytes, workflow


def test_the_shipped_table_names_real_cpu_functions_with_their_sources() -> None:
    table = on_gpu()
    assert set(table) == {("traffic", "preprocess"), ("driving", "denoise"), ("driving", "colour"),
                          ("image", "denoise"), ("image", "aggregate")}
    for (wf, fn), e in table.items():
        runtime = workflow(wf).function(fn)
        assert runtime.kind == "cpu", (wf, fn)  # the runtime's spec runs it on the host
        assert "§" in e.where and e.paper.startswith("GROUTER")


def test_the_papers_version_runs_them_on_gpus_as_cvcuda_operators() -> None:
    rt, paper = workflow("driving"), workflow("driving", paper=True)
    assert rt.gpu_functions == ["segment"]
    assert paper.gpu_functions == ["denoise", "segment", "colour"]
    d = paper.function("denoise")
    assert d.model == CVCUDA
    # denoise reads the request's four 1080p frames and writes its frames once (two readers)
    assert d.batch == 2 * 4 * 1080 * 1920 * 3 == touched_bytes(edge_sizes()["driving"], "denoise")
    assert d.input_bytes == 4 * 1080 * 1920 * 3
    c = paper.function("colour")  # reads frames and logits, writes the overlay and the classes
    assert c.batch == 4 * 1080 * 1920 * 3 + 4 * 21 * 224 * 224 * 4 + 4 * 1080 * 1920 * 3 + 4 * 1080 * 1920
    assert c.output_bytes == 4 * 1080 * 1920 * 3 + 4 * 1080 * 1920
    assert [(e.src, e.dst) for e in paper.edges] == [(e.src, e.dst) for e in rt.edges]  # one spec, same edges
    # the workflows the papers' tables leave alone are the runtime's
    assert workflow("video", paper=True).gpu_functions == workflow("video").gpu_functions


def test_a_cvcuda_operator_costs_its_bytes_at_memory_bandwidth() -> None:
    p = Profile()
    assert p.gpu_ms(CVCUDA, "V100-16GB", 900_000_000) == pytest.approx(1.0)  # 0.9 GB at 900 GB/s
    assert p.gpu_ms(CVCUDA, "A100-40GB", 1_555_000_000) == pytest.approx(1.0)
    assert Profile(scale=2).gpu_ms(CVCUDA, "V100-16GB", 0) == 0.0
    assert set(GPU_MEM_GBPS) >= {"V100-16GB", "A100-40GB", "A10-24GB", "H100-80GB", "H800-80GB"}
    with pytest.raises(ConfigError, match="memory bandwidth for GPU 'Z1'"):
        p.gpu_ms(CVCUDA, "Z1", 10)


@pytest.mark.parametrize(("text", "match"), [
    ("[x]\non_gpu = []\n", r"\[x\] needs paper"),
    ('[x]\npaper = "P"\n[[x.on_gpu]]\nworkflow = "a"\nfunction = "b"\nstep = "s"\n', r"entry 1 lacks where"),
    ('[x]\npaper = "P"\n' + '[[x.on_gpu]]\nworkflow = "a"\nfunction = "b"\nstep = "s"\nwhere = "w"\n' * 2,
     r"a\.b is listed twice"),
    ("[x\n", "not valid TOML"),
])
def test_a_bad_table_is_refused_with_what_to_fix(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse(text, "t.toml")


def test_tail_parts_decomposes_the_requests_at_or_above_the_percentile() -> None:
    from gfaas.sim.cluster import FnStats, RequestRecord
    from gfaas.sim.experiments.workloads import tail_parts

    recs = []
    for k in range(100):  # latency k ms; each request's parts: queue k/2, get 1, put 1, compute k/4 (in ms)
        r = RequestRecord("wf", k, 0.0, k / 1e3)
        r.fns = {"a": FnStats(queue_s=k / 2e3, get_s=1e-3, compute_s=k / 4e3, put_s=1e-3)}
        recs.append(r)
    recs.append(RequestRecord("wf", 100, 0.0))  # never finished: not counted
    t = tail_parts(recs, 98.0)  # the 98th percentile of 0..99 ms is 97.02: requests 98 and 99
    assert t["tail_queue_ms"] == pytest.approx((98 + 99) / 2 / 2)
    assert t["tail_passing_ms"] == pytest.approx(2.0)
    assert t["tail_compute_ms"] == pytest.approx((98 + 99) / 2 / 4)


def test_mean_parts_averages_every_finished_request() -> None:
    from gfaas.sim.cluster import FnStats, RequestRecord
    from gfaas.sim.experiments.workloads import mean_parts

    a = RequestRecord("wf", 0, 0.0, 0.010)
    a.fns = {"x": FnStats(queue_s=0.002, get_s=0.001, compute_s=0.004, put_s=0.001),
             "y": FnStats(queue_s=0.001, compute_s=0.001)}
    b = RequestRecord("wf", 1, 1.0, 1.020)
    b.fns = {"x": FnStats(queue_s=0.0, get_s=0.003, compute_s=0.004, put_s=0.001)}
    parts = mean_parts([a, b, RequestRecord("wf", 2, 0.0)])
    assert parts == pytest.approx({"mean_ms": 15.0, "queue_ms": 1.5, "passing_ms": 3.0, "compute_ms": 4.5})


def test_the_shipped_bursts_restate_faascales_fig9_and_the_experiment_uses_it() -> None:
    b = bursts()["scaling-ttft"]
    assert (b.requests, b.paper.startswith("FaaScale"), "§7.3" in b.where) == (50, True, True)
    from gfaas.sim.experiments.scaling import _burst

    runs = _burst("7b", 1, 1.0, 2.0, 16, 0, systems=("gfaas",), requests=b.requests)
    reqs = runs["gfaas"].requests
    assert len(reqs) == 50
    # at the 2 s burst's rate: 50 arrivals take about 50 / rate (a Poisson count's spread, 14% here)
    rate = len(_burst("7b", 1, 1.0, 2.0, 16, 0, systems=("gfaas",))["gfaas"].requests) / 2.0
    assert 0.6 * 50 / rate < max(r.arrival for r in reqs) < 1.4 * 50 / rate


@pytest.mark.parametrize(("text", "match"), [
    ('[x]\npaper = "P"\n[[x.burst]]\nrequests = 5\nwhere = "w"\n', r"entry 1 needs experiment and where"),
    ('[x]\npaper = "P"\n[[x.burst]]\nexperiment = "e"\nrequests = 0\nwhere = "w"\n', r"requests = 0; give a whole"),
    ('[x]\npaper = "P"\n[[x.burst]]\nexperiment = "e"\nrequests = 2.5\nwhere = "w"\n', r"requests = 2\.5"),
    ('[x]\npaper = "P"\n' + '[[x.burst]]\nexperiment = "e"\nrequests = 3\nwhere = "w"\n' * 2, r"listed twice"),
])
def test_a_bad_burst_is_refused_with_what_to_fix(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_bursts(text, "t.toml")
