"""The simulator at cluster scale: replicas placed across the nodes, so at the same load per GPU
a cluster of 16 nodes serves requests as fast as one node (issue 24)."""

from __future__ import annotations

import numpy as np
import pytest

from gfaas.sim.arrivals import poisson
from gfaas.sim.cluster import Cluster
from gfaas.sim.systems import system
from gfaas.sim.workflows import workflow
from gfaas.topology import preset

RATE_PER_NODE = 20.0  # requests/s
SECONDS = 3.0  # simulated; 60 requests per node


def _p50(nodes: int) -> tuple[float, Cluster]:
    topo = preset("dgx-a100" if nodes == 1 else f"dgx-a100*{nodes}")
    c = Cluster(topo, system("gfaas"), seed=0)
    wf = workflow("traffic")
    c.deploy(wf, len(topo.gpus) // len(wf.gpu_functions))
    c.submit_many("traffic", poisson(RATE_PER_NODE * nodes, SECONDS, seed=1))
    recs = c.run()
    assert recs and all(r.finish >= 0 for r in recs)
    return float(np.median([r.latency for r in recs])), c


def test_p50_at_16_nodes_is_within_10_percent_of_one_node() -> None:
    """traffic on dgx-a100 x16 at 20 req/s per node vs one node at 20 req/s. Before cluster
    placement every replica sat on nodes 0-3 and the p50 was seconds, not milliseconds."""
    one, _ = _p50(1)
    sixteen, c = _p50(16)
    assert sixteen == pytest.approx(one, rel=0.10)
    deps = c.deployments["traffic"]
    assert {n for d in deps for n in d.node.values()} == set(range(16))  # every node serves
    assert all(len(set(d.node.values())) == 1 for d in deps)  # no replica crosses the network


def test_spread_layout_keeps_one_replica_over_several_nodes() -> None:
    """The explicit option of the inter-node experiments: each replica over both nodes."""
    topo = preset("dgx-v100*2")
    c = Cluster(topo, system("gfaas"))
    wf = workflow("traffic")
    for d in c.deploy(wf, 2, nodes=[0, 1], layout="spread"):
        assert {d.node[f] for f in wf.gpu_functions} == {0, 1}
    packed = Cluster(topo, system("gfaas")).deploy(wf, 2, nodes=[0, 1])
    assert [{d.node[f] for f in wf.gpu_functions} for d in packed] == [{0}, {1}]


def test_simscale_bench_prints_the_issue_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """``gfaas bench simscale --quick --json``: one row per size with the fields of issue 24, the
    same simulated p50 at 1 and 8 nodes, requests growing with the nodes."""
    import json

    from gfaas.cli import main
    from gfaas.sim.kernel import CORE

    assert main(["bench", "simscale", "--quick", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["rows"]
    assert doc["core"] == CORE == doc["provenance"]["sim_core"]
    assert [(r["nodes"], r["gpus"]) for r in rows] == [(1, 8), (8, 64)]
    # On the native core each size also ran on the pure-Python one, in the same run (the reference).
    extra = {"python_us_per_request", "speedup"} if CORE == "native" else set()
    for r in rows:
        assert set(r) == {"nodes", "gpus", "requests", "wall_s", "us_per_request", "p50_ms", "gc_us_per_request",
                          "gc_collected_per_request"} | extra
        assert r["gc_us_per_request"] >= 0 and r["gc_collected_per_request"] >= 0
        assert r["us_per_request"] == pytest.approx(r["wall_s"] / r["requests"] * 1e6, abs=0.1)
        if extra:
            assert r["speedup"] == pytest.approx(r["python_us_per_request"] / r["us_per_request"], rel=0.02)
    assert rows[1]["requests"] > 5 * rows[0]["requests"]
    assert rows[1]["p50_ms"] == pytest.approx(rows[0]["p50_ms"], rel=0.10)
