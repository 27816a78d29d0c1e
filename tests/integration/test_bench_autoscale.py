"""``gfaas bench autoscale`` on a short replay: the document's shape, no request dropped, the
always-warm row never starts a worker, and the simulator's replay of the same arrivals is present."""

from __future__ import annotations

from gfaas.bench.autoscale import run


def test_a_short_replay_of_the_three_policies() -> None:
    res = run(duration_s=6.0, peak_rps=12.0, service_ms=20.0, max_workers=3, fixed="fixed:0.05",
              stable_window_s=3.0, panic_window_s=1.0, progress=lambda m: None)
    rows = {r["policy"]: r for r in res["policies"]}
    assert list(rows) == ["always-warm", "fixed:0.05", "gfaas"]
    n = res["workload"]["requests"]
    for r in rows.values():
        assert r["requests"] == n and r["dropped"] == 0
        assert 20.0 <= r["p50_ms"] <= r["p99_ms"]
        assert r["worker_seconds"] > 0
    assert rows["always-warm"]["cold_starts"] == rows["always-warm"]["starts"] == 0
    assert res["real"]["cold_starts"] == rows["gfaas"]["cold_starts"]
    assert set(res["sim"]) >= {"cold_starts", "worker_seconds", "p99_ms", "start_s", "service_s"}
    assert res["checks"]["dropped"] == 0
