"""The command line: node and cluster lifecycles, --json output, and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import gfaas


def gfaas_cli(run_dir: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GFAAS_RUN_DIR": run_dir}
    env.pop("GFAAS_SOCKET", None)
    p = subprocess.run([sys.executable, "-m", "gfaas", *args], env=env, capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"gfaas {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def as_json(p: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(p.stdout)  # --json: stdout holds exactly one JSON document


def test_node_start_status_stop(run_dir: str) -> None:
    """start reports pid and socket; status shows an empty node; stop ends the process."""
    started = as_json(gfaas_cli(run_dir, "node", "start", "--capacity", "64MiB", "--json"))
    assert started["socket"] == os.path.join(run_dir, "node0.sock")
    try:
        st = as_json(gfaas_cli(run_dir, "node", "status", "--json"))
        assert (st["node_id"], st["objects"], st["capacity_bytes"], st["pid"]) == ("node0", 0, 64 << 20, started["pid"])
        again = gfaas_cli(run_dir, "node", "start", check=False)
        assert again.returncode == 1 and "already serves" in again.stderr
    finally:
        stopped = as_json(gfaas_cli(run_dir, "node", "stop", "--json"))
    assert stopped == {"node_id": "node0", "stopped": True}
    with pytest.raises(ProcessLookupError):
        os.kill(started["pid"], 0)
    gone = gfaas_cli(run_dir, "node", "status", check=False)
    assert gone.returncode == 1 and "no node daemon at" in gone.stderr and "gfaas node start" in gone.stderr


def test_bad_values_are_named(run_dir: str) -> None:
    """A bad flag value fails with exit code 1 and a message naming the value."""
    p = gfaas_cli(run_dir, "node", "start", "--node-id", "bad id!", check=False)
    assert p.returncode == 1 and "node_id='bad id!' is invalid" in p.stderr
    p = gfaas_cli(run_dir, "node", "start", "--capacity", "1KiB", check=False)
    assert p.returncode == 1 and "capacity_bytes=1024 is invalid" in p.stderr


def test_local_cluster_moves_data_between_nodes(run_dir: str) -> None:
    """cluster start runs a directory and two nodes; a put on node0 is read on node1; stop ends all."""
    info = as_json(gfaas_cli(run_dir, "cluster", "start", "--nodes", "2", "--capacity", "128MiB", "--json"))
    try:
        assert [n["node_id"] for n in info["nodes"]] == ["node0", "node1"]
        a = gfaas.Admin(os.path.join(run_dir, "node0.sock"), state_dir=os.path.join(run_dir, "node0.state"))
        b = gfaas.Admin(os.path.join(run_dir, "node1.sock"), state_dir=os.path.join(run_dir, "node1.state"))
        inv = a.open_invocation("wf", ["p", "c"])
        inv_b = b.open_invocation("wf", ["p", "c"], invocation_id=inv.id, tokens=inv.tokens)
        with gfaas.connect(inv.credentials("p")) as p, gfaas.connect(inv_b.credentials("c")) as c:
            x = np.arange(300_000, dtype=np.int64)
            ref = p.put(x, consumers=["c"])
            assert np.array_equal(c.get(str(ref)), x)
        st = as_json(gfaas_cli(run_dir, "cluster", "status", "--json"))
        assert [n["serving"] for n in st["nodes"]] == [True, True]
        assert [n["objects"] for n in st["nodes"]] == [0, 0]  # read by its only consumer: freed on both
        a.close()
        b.close()
    finally:
        stopped = as_json(gfaas_cli(run_dir, "cluster", "stop", "--json"))
    assert stopped["stopped"] == ["node0", "node1", "redis"]
    for n in info["nodes"]:
        with pytest.raises(ProcessLookupError):
            os.kill(n["pid"], 0)
    p2 = gfaas_cli(run_dir, "cluster", "status", check=False)
    assert p2.returncode == 1 and "no local cluster recorded" in p2.stderr


def test_bench_pipeline_json(run_dir: str) -> None:
    """gfaas bench pipeline --json runs both transports, checks their outputs agree, and leaves nothing behind."""
    out = as_json(gfaas_cli(run_dir, "bench", "pipeline", "--json", "--sizes", "64KiB,1MiB", "--repeat", "3"))
    assert out["workflow"] == "preprocess -> classify" and out["repeat"] == 3
    assert [r["size_bytes"] for r in out["rows"]] == [64 * 1024, 1024 * 1024]
    for r in out["rows"]:
        assert r["gfaas_pass_ms"] > 0 and r["redis_pass_ms"] > 0
        assert r["pass_speedup"] == r["redis_pass_ms"] / r["gfaas_pass_ms"]
    assert out["daemon_leftover_objects"] == 0
