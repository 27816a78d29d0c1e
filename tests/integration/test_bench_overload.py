"""``gfaas bench overload`` in quick mode: the JSON shape, and every request accounted for.

Runs the CLI in a subprocess as a user would (``--json`` leaves nothing else on stdout): a real
``gfaas serve`` driven by the load generator's own process. The regression guards of issue 23 are
ratios inside one run with generous bounds (the targets and the measured values are in
docs/performance.md): goodput at 200 connections at least 70% of goodput at 8, and the embedded
tiny invocation at most 600 times the same run's two-hop pipe floor (it was 488 times before issue
23's work, 76 times after; the target is 10).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROW_KEYS = {"connections": int, "goodput_rps": float, "p50_ms": float, "p99_ms": float, "rejected": int,
            "sent": int, "ok": int, "failed": int, "lost": int, "duplicated": int, "loadgen_cpu_s": float,
            "server_finished": int, "server_cpu_s": float}


def test_quick_run_shape_and_accounting(tmp_path: Path) -> None:
    """Each row's requests add up (sent == ok + rejected + failed), none lost or duplicated, and the
    server finished exactly the invocations the client was answered."""
    out = tmp_path / "overload.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gfaas", "bench", "overload", "--quick", "--json", "--out", str(out),
         "--connections", "8,64", "--duration", "1"],
        capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)  # nothing but the JSON document on stdout
    assert json.loads(out.read_text()) == doc
    assert "connections for 1 s" in proc.stderr  # progress goes to stderr

    assert isinstance(doc["floor_us"], float) and doc["floor_us"] > 0
    assert isinstance(doc["invoke_p50_us"], float) and doc["invoke_p50_us"] > 0
    assert set(doc["invoke_breakdown_p50_ms"]) == {"queue", "host_pass", "fn_pass", "compute", "total"}
    assert [r["connections"] for r in doc["rows"]] == [8, 64]
    for r in doc["rows"]:
        for key, kind in ROW_KEYS.items():
            assert isinstance(r[key], kind) or (kind is float and isinstance(r[key], int)), (key, r[key])
        assert r["reject_p99_ms"] is None or r["reject_p99_ms"] >= 0
        assert r["reject_p99_after_1s_ms"] is None or r["reject_p99_after_1s_ms"] >= 0
        assert r["sent"] == r["ok"] + r["rejected"] + r["failed"], r
        assert r["rejected"] == sum(r["rejected_by_status"].values())
        assert r["failed"] == sum(r["failed_by_reason"].values())
        assert r["ok"] > 0 and r["lost"] == 0 and r["duplicated"] == 0, r
        assert r["server_settled"] and r["server_unanswered"] == 0, r
        assert r["connects"] >= r["connections"] and r["connect_failures"] == 0
    cap = doc["loadgen_capacity"]
    assert cap["connections"] == 64 and cap["ok"] == cap["sent"] > 0
    assert {t["id"] for t in doc["targets"]} == {"invoke", "goodput_256", "goodput_2000", "reject_p99",
                                                 "reject_p99_after_1s", "accounting"}
    prov = doc["provenance"]
    assert prov["machine"]["cores"] >= 1 and "commit" in prov and "dirty" in prov


def test_regression_guards_goodput_holds_and_the_invocation_stays_near_the_floor(tmp_path: Path) -> None:
    out = tmp_path / "overload.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gfaas", "bench", "overload", "--quick", "--json", "--out", str(out),
         "--connections", "8,200", "--duration", "3"],
        capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    low, high = doc["rows"]
    assert high["lost"] == high["duplicated"] == 0 and high["failed"] == 0, high
    assert high["goodput_rps"] >= 0.7 * low["goodput_rps"], (low["goodput_rps"], high["goodput_rps"])
    assert doc["invoke_p50_us"] <= 600 * doc["floor_us"], (doc["invoke_p50_us"], doc["floor_us"])
