"""The cluster-day experiment: its synthetic Azure-format trace, arrivals, replica rule and a quick run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gfaas.cli import main
from gfaas.errors import ConfigError
from gfaas.sim.arrivals import FunctionTrace, load_azure_functions_invocations
from gfaas.sim.experiments import REGISTRY, Result, run_experiment
from gfaas.sim.experiments import cluster_day as cd
from gfaas.sim.synthetic import WORKFLOW_SHARES, burst_counts, synthetic_azure_trace, write_azure_invocations
from gfaas.sim.workflows import REFERENCE, workflow

SIZE = {n: len(workflow(n).gpu_functions) for n in REFERENCE}


def test_synthetic_trace_round_trips_through_the_azure_loader(tmp_path: Path) -> None:
    """The generator's file loads back with the exact per-minute counts, one row per workflow, seeded."""
    counts = synthetic_azure_trace(tmp_path / "a.csv", requests=6000, minutes=10, seed=3)
    fns = load_azure_functions_invocations(tmp_path / "a.csv")
    assert [f.function for f in fns] == list(WORKFLOW_SHARES) == list(counts)
    for f in fns:
        assert f.counts.tolist() == counts[f.function].tolist() and f.minutes == 10
        assert f.owner == hashlib.sha256(b"gfaas").hexdigest() and f.trigger == "http"
        assert f.app == hashlib.sha256(f"gfaas/{f.function}".encode()).hexdigest()
    first = (tmp_path / "a.csv").read_text().splitlines()[0]
    assert first == "HashOwner,HashApp,HashFunction,Trigger," + ",".join(map(str, range(1, 11)))
    synthetic_azure_trace(tmp_path / "b.csv", requests=6000, minutes=10, seed=3)
    synthetic_azure_trace(tmp_path / "c.csv", requests=6000, minutes=10, seed=4)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert (tmp_path / "a.csv").read_bytes() != (tmp_path / "c.csv").read_bytes()


def test_burst_counts_keep_the_mean_and_are_bursty() -> None:
    """Over 100 hours the mean per minute is rate x 60; minutes vary far more than Poisson counts would."""
    c = burst_counts(10.0, 6000, seed=1)
    assert c.dtype == np.int64 and c.size == 6000
    assert c.mean() == pytest.approx(600.0, rel=0.05)
    # two-state model: variance of the per-minute rate 0.2 * 0.8 * (40 - 2.5)^2 per s^2, x 3600: ~800k
    assert c.var() / c.mean() > 100  # a Poisson process would give 1
    with pytest.raises(ConfigError, match=r"peak=6.0 must be in \[1, 5\]"):
        burst_counts(1.0, 10, seed=0, peak=6.0)
    with pytest.raises(ConfigError, match="minutes=0"):
        burst_counts(1.0, 0, seed=0)


def _trace(tmp_path: Path, counts: dict[str, list[int]]) -> Path:
    return write_azure_invocations(tmp_path / "inv.csv", {n: np.array(c, dtype=np.int64) for n, c in counts.items()})


def test_arrivals_per_minute_equal_the_trace_counts(tmp_path: Path) -> None:
    """Rows named after the workflows drive them; each minute's count lands inside that minute."""
    counts = {n: [(i + 1) * 3, 0, i + 2] for i, n in enumerate(reversed(REFERENCE))}
    setup = cd.Setup.parse(False, {"trace": str(_trace(tmp_path, counts)), "minutes": "3"})
    assert setup.rate is None and setup.requests is None  # a user trace is replayed as it is
    times = cd.arrivals(setup, str(setup.trace))
    assert list(times) == list(REFERENCE)
    for n, t in times.items():
        assert np.histogram(t, bins=[0, 60, 120, 180])[0].tolist() == counts[n]
        assert np.all(np.diff(t) >= 0)
    again = cd.arrivals(setup, str(setup.trace))
    assert all(np.array_equal(times[n], again[n]) for n in times)


def test_unnamed_rows_map_busiest_first_and_traces_are_only_thinned(tmp_path: Path) -> None:
    """Without workflow names the six busiest rows drive REFERENCE in order; thinning keeps counts <= the trace."""
    fns = [FunctionTrace("o", "a", f"f{i}", "http", np.array([i, 10 * i], dtype=np.int64)) for i in range(7)]
    rows = cd.workflow_rows(fns, 2)
    assert {n: f.function for n, f in rows.items()} == dict(zip(REFERENCE, ["f6", "f5", "f4", "f3", "f2", "f1"],
                                                                 strict=True))
    thinned = cd.thin(rows, 2, 100.0, seed=0)
    assert all(np.all(thinned[n].counts <= rows[n].counts) for n in rows)
    assert thinned["traffic"].counts.tolist() == cd.thin(rows, 2, 100.0, seed=0)["traffic"].counts.tolist()
    with pytest.raises(ConfigError, match="232 requests exceed the 231 invocations"):
        cd.thin(rows, 2, 232.0, seed=0)
    with pytest.raises(ConfigError, match="the trace has 5 functions; the 6 workflows need 6 rows"):
        cd.workflow_rows(fns[1:6], 2)
    with pytest.raises(ConfigError, match="fewer than minutes=3"):
        cd.workflow_rows(fns, 3)


SLOTS_128 = dict.fromkeys(range(128), 8)


def test_replica_rule_fills_the_gpus_in_proportion_to_gpu_work() -> None:
    """Every GPU holds a replica; each workflow's GPUs are its work share of them, to within one replica."""
    rates = {n: 167.0 * s for n, s in WORKFLOW_SHARES.items()}
    reps = cd.replica_counts(cd.replica_plan(rates, SLOTS_128, "A100-40GB"))
    assert sum(reps[n] * SIZE[n] for n in reps) == 1024 and min(reps.values()) >= 1
    work = {n: rates[n] * cd.gpu_work_s(n, "A100-40GB") for n in rates}
    for n in reps:
        assert abs(reps[n] * SIZE[n] - 1024 * work[n] / sum(work.values())) <= SIZE[n]
    # a workflow without requests keeps its one replica
    assert cd.replica_counts(cd.replica_plan({**rates, "video": 0.0}, SLOTS_128, "A100-40GB"))["video"] == 1
    with pytest.raises(ConfigError, match="14 GPUs cannot hold one replica of each workflow"):
        cd.replica_plan(rates, SLOTS_128, "A100-40GB", budget=14)
    assert cd.gpus_to_fill(rates, 1024, "A100-40GB", None) == 1024
    need = sum(work.values())
    assert cd.gpus_to_fill(rates, 1024, "A100-40GB", 0.01) == int(np.ceil(need / 0.01))
    assert cd.gpus_to_fill(rates, 1024, "A100-40GB", 1.0) == sum(SIZE.values())  # one replica each at least
    budget = cd.replica_plan(rates, SLOTS_128, "A100-40GB", budget=100)
    assert 100 - min(SIZE.values()) < sum(SIZE[n] for n, _ in budget) <= 100


def test_replica_plan_never_shares_a_gpu_when_deployed() -> None:
    """A mix whose three-GPU replicas cannot all fit whole (image-heavy, 2 nodes) gets no shared GPU:
    deploying the plan replica by replica lets the cluster choose the plan's nodes, on distinct GPUs."""
    from gfaas.sim.cluster import Cluster
    from gfaas.sim.systems import system
    from gfaas.topology import preset

    rates = {**dict.fromkeys(REFERENCE, 0.1), "image": 50.0}
    plan = cd.replica_plan(rates, {0: 8, 1: 8}, "A100-40GB")
    c = Cluster(preset("dgx-a100*2"), system("gfaas"))
    for n, node in plan:
        (d,) = c.deploy(workflow(n), 1, layout="pack")  # the cluster's own choice of node
        assert set(d.node.values()) == {node}
    used = [g for ds in c.deployments.values() for d in ds for g in d.gpu.values()]
    assert len(used) == len(set(used)) == sum(SIZE[n] for n, _ in plan) == 16


@pytest.fixture(scope="module")
def quick() -> Result:
    return run_experiment("cluster-day", quick=True)


def _rows(res: Result) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["system"], r["workflow"]): r for r in res.rows}


def test_quick_run_serves_the_same_requests_on_both_systems(quick: Result) -> None:
    """Both systems, every workflow and 'all'; equal request counts and deployments; sane percentiles."""
    rows = _rows(quick)
    assert list(rows) == [(s, w) for s in cd.SYSTEMS for w in (*REFERENCE, "all")]
    per_min = quick.data["arrivals_per_minute"]
    assert quick.data["requests_per_system"] == sum(map(sum, per_min.values())) > 0
    for w in (*REFERENCE, "all"):
        g, i = rows[("gfaas", w)], rows[("infless+", w)]
        assert g["requests"] == i["requests"]
        assert (g["replicas"], g["gpus"]) == (i["replicas"], i["gpus"])
        if w != "all":
            assert g["requests"] == sum(per_min[w])
    for r in quick.rows:
        assert r["p50_ms"] <= r["p99_ms"]
        assert 0 < r["gpu_busy_h"] <= r["gpu_alloc_h"]
        assert 0 <= r["passing_pct"] <= 100
    assert rows[("gfaas", "all")]["gpus"] == 32  # quick: 4 nodes, every GPU holds a replica
    for s in cd.SYSTEMS:
        assert rows[(s, "all")]["gpu_busy_h"] == pytest.approx(sum(rows[(s, w)]["gpu_busy_h"] for w in REFERENCE))


def test_quick_run_gfaas_passes_less_than_the_host_centric_baseline(quick: Result) -> None:
    """gfaas keeps GPU outputs on the GPU and reads host inputs through pinned buffers: a smaller passing share."""
    rows = _rows(quick)
    for w in ("all", "traffic", "video"):
        assert rows[("gfaas", w)]["passing_pct"] < rows[("infless+", w)]["passing_pct"]
        assert rows[("gfaas", w)]["gpu_busy_h"] < rows[("infless+", w)]["gpu_busy_h"]


def test_quick_run_writes_json_table_and_figure(quick: Result, tmp_path: Path) -> None:
    """--out writes cluster-day.json (with the per-minute arrivals), .md and a PNG from its own plotter."""
    pytest.importorskip("matplotlib")
    paths = quick.write(str(tmp_path))
    assert sorted(Path(p).name for p in paths) == ["cluster-day.json", "cluster-day.md", "cluster-day.png"]
    doc = json.loads((tmp_path / "cluster-day.json").read_text())
    assert doc["data"]["setup"]["nodes"] == 4 and set(doc["data"]["wall_s"]) == set(doc["data"]["build_s"]) == set(cd.SYSTEMS)
    assert (tmp_path / "cluster-day.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_user_trace_drives_a_small_run(tmp_path: Path) -> None:
    """trace= replays a file as it is (requests per workflow = its counts); rate= thins it."""
    counts = {n: [2, 1] for n in REFERENCE}
    path = str(_trace(tmp_path, counts))
    res = run_experiment("cluster-day", params={"trace": path, "nodes": "2", "minutes": "2"})
    assert {r["workflow"]: r["requests"] for r in res.rows if r["system"] == "gfaas"} == {
        **dict.fromkeys(REFERENCE, 3), "all": 18}
    params = {"trace": path, "nodes": "2", "minutes": "2", "rate": "0.075"}
    thinned = run_experiment("cluster-day", params=params)
    setup = cd.Setup.parse(False, params)
    assert setup.requests == pytest.approx(9.0)
    rows = cd.thin(cd.workflow_rows(load_azure_functions_invocations(path), 2), 2, setup.requests, setup.seed)
    assert thinned.data["requests_per_system"] == sum(f.total for f in rows.values()) <= 18


@pytest.mark.parametrize("args,needle", [
    (["--set", "nodes=0"], "nodes='0': give a whole number >= 1"),
    (["--set", "minutes=x"], "minutes='x': give a whole number >= 1"),
    (["--set", "rate=-5"], "rate='-5': give the mean number of requests per second"),
    (["--set", "util=2"], "util='2'"),
    (["--set", "trace=/nonexistent/inv.csv"], "trace='/nonexistent/inv.csv' is not a file"),
    (["--set", "colour=red"], "experiment 'cluster-day' has no parameter 'colour'"),
    (["--set", "nodes"], "write KEY=VALUE"),
    (["--set", "nodes=1"], "8 GPUs cannot hold one replica of each workflow (15 GPUs)"),
])
def test_bad_parameters_fail_before_simulating(capsys: pytest.CaptureFixture[str], args: list[str],
                                               needle: str) -> None:
    """Each bad --set value names itself and what to give instead."""
    assert main(["sim", "run", "cluster-day", "--json", *args]) == 1
    assert needle in capsys.readouterr().err


def test_cluster_day_is_listed_but_not_in_all(capsys: pytest.CaptureFixture[str]) -> None:
    """`gfaas sim list` shows it with its parameters; `sim run all` leaves it out; --set needs one experiment."""
    assert REGISTRY["cluster-day"].in_all is False and REGISTRY["cluster-day"].params == cd.PARAMS
    assert main(["sim", "list", "--json"]) == 0
    listed = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    assert listed["cluster-day"]["params"] == list(cd.PARAMS) and not listed["cluster-day"]["in_all"]
    assert main(["sim", "run", "all", "--set", "nodes=4"]) == 1
    assert "--set applies to one experiment" in capsys.readouterr().err
    assert main(["sim", "run", "a10", "--set", "nodes=4"]) == 1
    assert "experiment 'a10' has no parameter 'nodes'; it takes: none" in capsys.readouterr().err


def test_doc_block_is_generated_from_a_saved_result(quick: Result, monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """benchmarks/sim_tables.py fills docs/results/cluster-day.md's block from a --save file."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    import sim_tables  # type: ignore[import-not-found]
    from doc_blocks import write_blocks  # type: ignore[import-not-found]

    doc = {"provenance": {"commit": "c" * 40, "utc": "T", "machine": {"cpu_model": "cpu", "cores_usable": 2}},
           "experiments": [quick.as_json()]}
    block = sim_tables.cluster_day(doc)
    g = _rows(quick)[("gfaas", "all")]
    assert f"| P50 / P99 end-to-end (ms) | {g['p50_ms']:.1f} / {g['p99_ms']:.1f} |" in block
    assert "4 x dgx-a100 (32 GPUs), 2 minutes" in block and f"| gfaas | all | {g['replicas']} | 32 |" in block
    page = tmp_path / "page.md"
    page.write_text((root / "docs" / "results" / "cluster-day.md").read_text())
    write_blocks(str(page), {"cluster-day": block})
    assert block in page.read_text()
