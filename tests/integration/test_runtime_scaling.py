"""The runtime scales functions by the shared policy (issue 22, item 2): scale out under a burst, scale to
zero after the keep-alive, requests at zero workers wait for the cold start (never dropped), the
queue limit refuses with ``Overloaded``, reservations never oversubscribe the node, idle workers of
another function are stopped to make room, and the status reports every count."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from test_runtime_local import wait_for  # pytest puts this directory on sys.path

from gfaas.errors import NotFound, Overloaded, SpecError
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

pytestmark = pytest.mark.usefixtures("rt_handlers")


def slow_spec(name: str, seconds: float, scaling: str, resources: str = "") -> str:
    res = f", resources: {resources}" if resources else ""
    return f"""
name: {name}
inputs: {{x: null}}
outputs: {{out: f.y}}
functions:
  - {{name: f, kind: cpu, handler: "rt_handlers:slow", params: {{seconds: {seconds}}}, inputs: {{x: input.x}},
     outputs: {{y: null}}, scaling: {scaling}{res}}}
"""


def test_a_burst_scales_out_to_max_and_every_request_is_served() -> None:
    cfg = RuntimeConfig(queue_hints=False, scale_tick_s=0.1)
    with LocalRuntime(cfg) as rt:
        rt.deploy(slow_spec("burst", 0.4, "{max: 4, keep_alive: 'fixed:1', stable_window_s: 4, panic_window_s: 1}"))
        pool = rt.deployments.pools["burst/f"]
        ids = [rt.submit("burst", {"x": np.full(2, k, np.float64)}) for k in range(16)]
        peak = 0
        deadline = time.monotonic() + 60
        while any(rt.status(i) not in ("done", "failed") for i in ids) and time.monotonic() < deadline:
            peak = max(peak, pool.counts()["warm"] + pool.counts()["starting"])
            time.sleep(0.02)
        results = [rt.result(i, timeout=60) for i in ids]
        st = rt.scaling_status("burst")["functions"]["f"]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    for k, r in enumerate(results):  # each answer is its own request's
        np.testing.assert_array_equal(r.outputs["out"], np.full(2, k, np.float64))
    assert peak == 4, peak  # scaled out to max, never beyond
    assert st["max"] == 4 and st["starts"] >= 4 and st["cold_starts"] >= 3
    # the requests that waited for a started worker carry the start in their record
    assert sum(1 for r in results if r.functions[0].cold_start_s > 0) >= 1


def test_scale_to_zero_then_a_request_waits_for_the_cold_start() -> None:
    cfg = RuntimeConfig(queue_hints=False, scale_tick_s=0.05)
    with LocalRuntime(cfg) as rt:
        rt.deploy(slow_spec("zero", 0.0, "{max: 2, keep_alive: 'fixed:0.01', scale_to_zero_grace_s: 0.3}"))
        pool = rt.deployments.pools["zero/f"]
        assert pool.counts()["warm"] == 1  # pre-warmed at deploy
        wait_for(lambda: pool.counts()["warm"] + pool.counts()["starting"] + pool.counts()["stopping"] == 0,
                 what="scale to zero")
        res = rt.invoke("zero", {"x": np.ones(3)}, timeout=60)
        st = rt.scaling_status("zero")["functions"]["f"]
    assert res.ok
    rec = res.functions[0]
    assert 0 < rec.cold_start_s <= rec.queued_s
    assert st["cold_starts"] == 1 and st["starts"] == 2 and st["stops"] >= 1


def test_min_workers_are_kept_warm_without_requests() -> None:
    cfg = RuntimeConfig(queue_hints=False, scale_tick_s=0.05)
    with LocalRuntime(cfg) as rt:
        rt.deploy(slow_spec("kept", 0.0, "{min: 2, max: 3, keep_alive: 'fixed:0.01', scale_to_zero_grace_s: 0.1}"))
        time.sleep(1.0)
        st = rt.scaling_status("kept")["functions"]["f"]
    assert (st["warm"], st["min"], st["cold_starts"]) == (2, 2, 0)


def test_the_queue_limit_refuses_with_overloaded_and_loses_nothing_admitted() -> None:
    cfg = RuntimeConfig(queue_hints=False, max_queue=3, prewarm=False)
    with LocalRuntime(cfg) as rt:
        rt.deploy(slow_spec("full", 0.3, "{max: 1}"))
        ids, refused = [], 0
        for _ in range(8):
            try:
                ids.append(rt.submit("full", {"x": np.ones(1)}))
            except Overloaded as exc:
                assert "max_queue=3" in str(exc)
                refused += 1
        assert refused > 0 and len(ids) >= 3
        assert all(rt.result(i, timeout=60).ok for i in ids)


def test_reservations_never_oversubscribe_and_an_idle_function_makes_room() -> None:
    """A node of 1 core: function a (0.6 cores) holds it; b (0.6) fits only once a's idle worker is
    stopped, which the runtime does; while a is busy, b waits (its request is not lost)."""
    cfg = RuntimeConfig(queue_hints=False, node_cpus=1.0, scale_tick_s=0.05)
    with LocalRuntime(cfg) as rt:
        rt.deploy(slow_spec("a", 0.8, "{max: 1, keep_alive: 'fixed:10'}", "{cpus: 0.6}"))
        rt.deploy(slow_spec("b", 0.0, "{max: 1, keep_alive: 'fixed:10'}", "{cpus: 0.6}"))
        # b could not pre-warm: a's worker holds the core
        assert rt.scaling_status("b")["functions"]["f"]["warm"] == 0
        busy = rt.submit("a", {"x": np.ones(1)})  # a is busy for 0.8 s: not evictable
        time.sleep(0.2)
        waiting = rt.submit("b", {"x": np.ones(1)})
        seen: list[float] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                seen.append(rt.scaling_status("a")["nodes"]["rt0"]["used_cpus"])
                time.sleep(0.01)

        t = threading.Thread(target=watch)
        t.start()
        assert rt.result(busy, timeout=60).ok
        res = rt.result(waiting, timeout=60)
        stop.set()
        t.join()
        a, b = (rt.scaling_status(w)["functions"]["f"] for w in ("a", "b"))
    assert res.ok and res.functions[0].queued_s >= 0.4  # waited for a to finish, then for room
    assert max(seen) <= 1.0 + 1e-9
    assert b["deferred_starts"] >= 1 and a["warm"] == 0 and b["warm"] == 1


def test_a_function_that_could_never_fit_is_refused_at_deploy() -> None:
    with LocalRuntime(RuntimeConfig(queue_hints=False, node_cpus=2.0)) as rt:
        with pytest.raises(SpecError, match=r"exceed the node's capacity.*node_cpus"):
            rt.deploy(slow_spec("huge", 0.0, "{max: 1}", "{cpus: 4}"))
        with pytest.raises(SpecError, match="cpu function reserves no GPU"):
            rt.deploy(slow_spec("gpuish", 0.0, "{max: 1}", "{gpus: 0.5}"))
        with pytest.raises(NotFound):
            rt.scaling_status("huge")
        assert rt.workflows() == []


def test_status_through_the_gateway_metrics_and_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gfaas import GatewayClient, serve_gateway
    from gfaas.cli import main

    token = "t" * 32
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    with LocalRuntime(RuntimeConfig(queue_hints=False)) as rt, \
            serve_gateway(rt, access_log=False, token=token) as gw:
        rt.deploy(slow_spec("shown", 0.0, "{max: 3, keep_alive: 'fixed:5'}", "{cpus: 0.25, memory: 64MiB}"))
        with GatewayClient(gw.url, token=token) as c:
            assert c.invoke("shown", {"x": np.ones(2)}).ok
            doc = c.scaling_status("shown")
            with pytest.raises(NotFound):
                c.scaling_status("nothing")
            metrics = httpx.get(f"{gw.url}/metrics", headers={"authorization": f"Bearer {token}"}).text
        assert main(["workflows", "status", "shown", "--url", gw.url, "--token-file", str(token_file), "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
    f = doc["functions"]["f"]
    assert (f["warm"], f["busy"], f["max"], f["keep_alive"], f["resources"]["cpus"]) == (1, 0, 3, "fixed:5", 0.25)
    assert doc["nodes"]["rt0"]["used_cpus"] == pytest.approx(0.25)
    mem = f["memory"]  # the warm worker's own memory, PSS no more than RSS
    assert mem["processes"] == 1 and 0 < mem["pss_bytes"] <= mem["rss_bytes"]
    assert printed["functions"]["f"]["max"] == 3
    assert 'gfaas_function_workers{workflow="shown",function="f",state="warm"} 1' in metrics.splitlines()
    assert 'gfaas_function_workers{workflow="shown",function="f",state="starting"} 0' in metrics.splitlines()
    assert 'gfaas_function_cold_starts{workflow="shown",function="f"} 0' in metrics.splitlines()


def test_each_start_is_timed_from_its_own_beginning() -> None:
    """Deploy starts min workers one after another; each one's start time is its own (the mean was
    once the mean of cumulative times, which made the simulator's start time twice too long)."""
    with LocalRuntime(RuntimeConfig(queue_hints=False)) as rt:
        t0 = time.monotonic()
        rt.deploy(slow_spec("timed", 0.0, "{min: 3, max: 3}"))
        deploy_s = time.monotonic() - t0
        mean = rt.scaling_status("timed")["functions"]["f"]["start_s_mean"]
    assert 0 < mean < 0.5 * deploy_s, (mean, deploy_s)


def test_the_pool_tells_the_policy_what_starts_and_requests_took() -> None:
    """The cost rules' inputs are the runtime's own measurements: the median start the policy holds
    is the median of the pool's start times, and its service time is what the requests held their
    workers (a 0.2 s handler: at least that, and less than a second on this machine)."""
    import statistics

    cfg = RuntimeConfig(queue_hints=False, scale_tick_s=0.1)
    with LocalRuntime(cfg) as rt:
        rt.deploy(slow_spec("costs", 0.2, "{max: 3, keep_alive: 'fixed:1', stable_window_s: 4, panic_window_s: 1}"))
        pool = rt.deployments.pools["costs/f"]
        ids = [rt.submit("costs", {"x": np.zeros(2)}) for _ in range(6)]
        assert all(rt.result(i, timeout=60).ok for i in ids)
        with pool.cv:
            costs = pool.policy.costs()
            starts = list(pool.start_s)
    assert costs is not None
    assert costs[0] == pytest.approx(statistics.median(starts)) and len(starts) >= 2
    assert 0.2 <= costs[1] < 1.0


def test_queued_calls_at_max_with_every_worker_busy_cost_no_decision() -> None:
    """At max workers, all busy, an arrival or a completion with calls still queued cannot start or
    stop anything (WorkerPoolPolicy.decides_after): the pool makes no decision for it, and every
    queued call is still served, in order, as its own."""
    cfg = RuntimeConfig(queue_hints=False, scale_tick_s=5.0)  # no tick inside the window measured
    with LocalRuntime(cfg) as rt:
        rt.deploy(slow_spec("atmax", 0.01, "{max: 2, min: 2, keep_alive: 'fixed:1'}"))
        pool = rt.deployments.pools["atmax/f"]
        wait_for(lambda: pool.counts()["idle"] == 2, 60)
        decisions: list[bool] = []
        real = pool.policy.decide

        def counted(now: float, queued: int, workers: object, *, sample: bool = False) -> object:
            decisions.append(sample)
            return real(now, queued, workers, sample=sample)  # type: ignore[arg-type]

        pool.policy.decide = counted  # type: ignore[method-assign]
        ids = [rt.submit("atmax", {"x": np.full(2, k, np.float64)}) for k in range(30)]
        results = [rt.result(i, timeout=60) for i in ids]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    for k, r in enumerate(results):
        np.testing.assert_array_equal(r.outputs["out"], np.full(2, k, np.float64))
    # 28 calls queued behind the two busy workers: 28 arrivals and 28 completions with a queue,
    # each a decision before; now none (a tick may fall inside the window on a slow machine)
    assert decisions.count(False) == 0, decisions
    assert decisions.count(True) <= 2, decisions
