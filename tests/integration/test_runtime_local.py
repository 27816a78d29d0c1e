"""The local runtime end to end: worker processes, the node daemon and the invoker, for each pattern,
both transports, failures that stay inside their invocation, bad requests and resource cleanup."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gfaas.errors import NotFound, Overloaded, SpecError
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

H = "rt_handlers"

SEQ = f"""
name: seq
inputs: {{x: {{dtype: float64, shape: [-1]}}}}
outputs: {{out: b.y}}
functions:
  - {{name: a, kind: cpu, handler: "{H}:double", inputs: {{x: input.x}}, outputs: {{y: null, n_pos: {{shape: []}}}}}}
  - {{name: b, kind: gpu, handler: "{H}:negate", inputs: {{x: a.y}}, outputs: {{y: null}}, slo_ms: 100}}
"""
FANS = f"""
name: fans
inputs: {{x: null}}
outputs: {{out: join.y}}
functions:
  - {{name: split, kind: cpu, handler: "{H}:split", inputs: {{x: input.x}}, outputs: {{lo: null, hi: null}}}}
  - {{name: left, kind: gpu, handler: "{H}:scale", params: {{factor: 10}}, inputs: {{x: split.lo}}, outputs: {{y: null}}}}
  - {{name: right, kind: gpu, handler: "{H}:negate", inputs: {{x: split.hi}}, outputs: {{y: null}}}}
  - {{name: join, kind: cpu, handler: "{H}:concat", inputs: {{a: left.y, b: right.y}}, outputs: {{y: null}}}}
"""
COND = f"""
name: cond
inputs: {{x: null}}
outputs: {{pos: gated.y, always: a.y}}
functions:
  - {{name: a, kind: cpu, handler: "{H}:double", inputs: {{x: input.x}}, outputs: {{y: null, n_pos: {{shape: []}}}}}}
  - name: gated
    kind: gpu
    handler: "{H}:negate"
    inputs: {{x: {{from: a.y, when: "a.n_pos >= 2"}}}}
    outputs: {{y: null}}
"""
FAIL = f"""
name: failing
inputs: {{x: null}}
outputs: {{out: f.y}}
functions:
  - {{name: f, kind: cpu, handler: "{H}:fail_if_negative", inputs: {{x: input.x}}, outputs: {{y: null}}}}
"""
CRASH = f"""
name: crashing
inputs: {{x: null}}
outputs: {{out: f.y}}
functions:
  - {{name: f, kind: cpu, handler: "{H}:crash_if_negative", inputs: {{x: input.x}}, outputs: {{y: null}}}}
"""
WRONG = f"""
name: wrong
inputs: {{x: null}}
outputs: {{out: f.y}}
functions:
  - {{name: f, kind: cpu, handler: "{H}:wrong_output", inputs: {{x: input.x}}, outputs: {{y: null}}}}
"""
TWO = f"""
name: two-outputs
inputs: {{x: null}}
outputs: {{doubled: f.y, count: f.n_pos}}
functions:
  - {{name: f, kind: cpu, handler: "{H}:double", inputs: {{x: input.x}}, outputs: {{y: null, n_pos: {{shape: []}}}}}}
"""


def wait_for(pred: Any, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRuntime]:
    mp = pytest.MonkeyPatch()
    support = os.path.join(os.path.dirname(__file__), "..", "support")
    mp.syspath_prepend(support)
    mp.setenv("PYTHONPATH", os.path.abspath(support))
    r = LocalRuntime(RuntimeConfig(node_capacity_bytes=256 << 20))
    try:
        for text in (SEQ, FANS, COND, FAIL, CRASH, WRONG, TWO):
            r.deploy(text)
        yield r
    finally:
        r.close()
        mp.undo()


def objects(rt: LocalRuntime) -> int:
    with rt.nodes.lock:
        st = rt.nodes.admin.stats()
    return int(st["objects"]) + int(st["writing"])


def test_sequence_passes_data_through_the_data_plane(rt: LocalRuntime) -> None:
    """a doubles, b negates: the caller gets -2x; scalars, records and the breakdown are filled in."""
    x = np.arange(-3, 5, dtype=np.float64)
    res = rt.invoke("seq", {"x": x}, timeout=30)
    assert res.ok, res.error
    np.testing.assert_array_equal(res.outputs["out"], -2 * x)
    assert res.scalars == {"a.n_pos": 4.0}
    assert [r.function for r in res.functions] == ["a", "b"] and not any(r.skipped for r in res.functions)
    b = res.breakdown
    assert b.total_s > 0 and b.host_pass_s > 0 and b.fn_pass_s > 0 and b.compute_s >= 0 and b.queue_s >= 0
    assert b.total_s >= b.compute_s
    wait_for(lambda: objects(rt) == 0, what="the invocation's objects to be freed")


def test_fan_out_and_fan_in(rt: LocalRuntime) -> None:
    x = np.arange(10, dtype=np.float32)
    res = rt.invoke("fans", {"x": x}, timeout=30)
    assert res.ok, res.error
    np.testing.assert_array_equal(res.outputs["out"], np.concatenate([x[:5] * 10, -x[5:]]))


@pytest.mark.parametrize("transport", ["gfaas", "redis"])
def test_two_outputs_of_one_function_are_both_returned(rt: LocalRuntime, rt_handlers: str,
                                                       transport: str) -> None:
    """Both outputs sit in the producer's slab; collecting the second frees it (a regression)."""
    x = np.array([1.0, -2.0, 3.0])
    for _ in range(2):
        res = rt.invoke("two-outputs", {"x": x}, timeout=30, transport=transport)
        assert res.ok, res.error
        np.testing.assert_array_equal(res.outputs["doubled"], 2 * x)
        assert res.outputs["count"].shape == () and int(res.outputs["count"]) == 2


@pytest.mark.parametrize("x, runs", [([1.0, 2.0, -1.0], True), ([1.0, -2.0, -1.0], False)])
def test_condition_runs_or_skips_the_branch(rt: LocalRuntime, x: list[float], runs: bool) -> None:
    """gated runs only when a.n_pos >= 2; a skipped branch's output is absent, the other is there."""
    arr = np.array(x)
    res = rt.invoke("cond", {"x": arr}, timeout=30)
    assert res.ok, res.error
    np.testing.assert_array_equal(res.outputs["always"], 2 * arr)
    assert ("pos" in res.outputs) is runs
    assert {r.function: r.skipped for r in res.functions} == {"a": False, "gated": not runs}
    if runs:
        np.testing.assert_array_equal(res.outputs["pos"], -2 * arr)
    wait_for(lambda: objects(rt) == 0, what="a skipped branch's data to be freed")


def test_handler_error_fails_only_its_invocation(rt: LocalRuntime) -> None:
    """A raising handler fails that invocation with its message; the same warm worker serves the next."""
    bad = rt.invoke("failing", {"x": np.array([1.0, -1.0])}, timeout=30)
    assert bad.status == "failed" and "function 'f'" in bad.error and "negative input at 1" in bad.error
    good = rt.invoke("failing", {"x": np.array([1.0])}, timeout=30)
    assert good.ok and good.functions[0].worker == rt.deployments.pools["failing/f"].slots[0].name
    np.testing.assert_array_equal(good.outputs["out"], [2.0])


def test_crashed_worker_is_replaced(rt: LocalRuntime) -> None:
    """A worker that dies mid-task fails that invocation (exit status named) and is replaced by a new one."""
    before = rt.deployments.pools["crashing/f"].slots[0].pid
    bad = rt.invoke("crashing", {"x": np.array([-1.0])}, timeout=30)
    assert bad.status == "failed" and "exited (status 3)" in bad.error
    good = rt.invoke("crashing", {"x": np.array([1.0])}, timeout=30)
    assert good.ok, good.error
    assert rt.deployments.pools["crashing/f"].slots[0].pid != before
    wait_for(lambda: objects(rt) == 0, what="the crashed invocation's data to be freed")


def test_wrong_outputs_fail_with_both_lists(rt: LocalRuntime) -> None:
    res = rt.invoke("wrong", {"x": np.array([1.0])}, timeout=30)
    assert res.status == "failed"
    assert "returned outputs ['z']; the spec declares ['y'] (missing ['y']) (undeclared ['z'])" in res.error


def test_bad_requests_are_refused_and_lose_nothing(rt: LocalRuntime) -> None:
    with pytest.raises(NotFound, match="no workflow 'nope' is deployed; deployed: \\['cond', 'crashing'"):
        rt.submit("nope", {"x": np.zeros(1)})
    with pytest.raises(SpecError, match=r"missing \['x'\]"):
        rt.submit("seq", {})
    with pytest.raises(SpecError, match=r"unknown \['y'\]"):
        rt.submit("seq", {"x": np.zeros(2), "y": np.zeros(1)})
    with pytest.raises(SpecError, match="dtype int64 where float64 is declared"):
        rt.submit("seq", {"x": np.zeros(2, np.int64)})
    with pytest.raises(SpecError, match="not both or neither"):
        rt.submit("seq", {"x": np.zeros(2)}, seed=1)
    with pytest.raises(SpecError, match="no input generator"):
        rt.submit("seq", seed=1)
    with pytest.raises(NotFound, match="no invocation '0{32}'"):
        rt.result("0" * 32)
    assert rt.deploy(SEQ) == "seq"  # the same spec again: no new version, nothing restarted
    assert [v["version"] for v in rt.versions("seq")] == [1]
    res = rt.invoke("seq", {"x": np.ones(3)}, timeout=30)
    assert res.ok


def test_many_concurrent_invocations_none_lost_or_duplicated(rt: LocalRuntime) -> None:
    """120 invocations from 8 threads: every one completes once, with its own correct output."""
    results: dict[str, float] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def client(k: int) -> None:
        for j in range(15):
            v = float(k * 100 + j)
            try:
                res = rt.invoke("fans", {"x": np.full(4, v)}, timeout=60)
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc))
                continue
            if not res.ok or not np.array_equal(res.outputs["out"], [v * 10, v * 10, -v, -v]):
                errors.append(f"{v}: {res.status} {res.error} {res.outputs}")
            with lock:
                assert res.invocation_id not in results
                results[res.invocation_id] = v

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert len(results) == 120 and len(set(results.values())) == 120
    wait_for(lambda: objects(rt) == 0, what="all objects to be freed")


def test_a_finished_invocation_keeps_only_its_result(rt: LocalRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once finished and its data freed, an invocation's state (DAG, records, values) is let go and
    only its result stays fetchable, for the most recent ones only: what a loaded gateway keeps is
    then a few objects per invocation for the collector to walk (gcpause)."""
    import gfaas.runtime.invoker as invoker_mod

    monkeypatch.setattr(invoker_mod, "KEEP_RESULTS", 3)
    done = [rt.invoke("seq", {"x": np.full(2, float(k))}, timeout=30) for k in range(5)]
    assert all(r.ok for r in done)
    wait_for(lambda: not any(r.invocation_id in rt.invoker._invs for r in done), what="the invocations to retire")
    for r in done[-3:]:  # kept: status, result and a late done-callback all answer from the result
        assert rt.status(r.invocation_id) == "done"
        assert rt.result(r.invocation_id, timeout=0) is r
        seen: list[Any] = []
        rt.invoker.add_done_callback(r.invocation_id, seen.append)
        assert seen == [r] and rt.invoker.queue_positions(r.invocation_id) == {}
    for r in done[:2]:  # past the bound: gone, with the usual error
        with pytest.raises(NotFound, match="finished ones are kept for a while"):
            rt.status(r.invocation_id)


def test_redis_baseline_gives_the_same_outputs(rt: LocalRuntime, rt_handlers: str) -> None:
    """The host-centric transport runs the same workflows to the same results."""
    with LocalRuntime(RuntimeConfig(transport="redis", executor="inproc")) as base:
        base.deploy(FANS)
        base.deploy(COND)
        x = np.arange(8, dtype=np.float64)
        for name in ("fans", "cond"):
            a = base.invoke(name, {"x": x}, timeout=30)
            b = rt.invoke(name, {"x": x}, timeout=30)
            assert a.ok and b.ok
            assert sorted(a.outputs) == sorted(b.outputs)
            for k in a.outputs:
                np.testing.assert_array_equal(a.outputs[k], b.outputs[k])


def test_full_queue_refuses_with_overloaded_and_queue_positions(rt_handlers: str) -> None:
    """With max_queue=2 and a slow function, a third waiting request is refused; positions are exact."""
    slow = f"""
name: slow
inputs: {{x: null}}
outputs: {{out: s.y}}
functions:
  - {{name: s, kind: cpu, handler: "{H}:slow", params: {{seconds: 0.3}}, inputs: {{x: input.x}}, outputs: {{y: null}}}}
"""
    with LocalRuntime(RuntimeConfig(executor="inproc", max_queue=2)) as r:
        r.deploy(slow)
        first = r.submit("slow", {"x": np.zeros(1)})
        wait_for(lambda: r.status(first) == "running", what="the first request to start")
        waiting = [r.submit("slow", {"x": np.full(1, k)}) for k in (1, 2)]
        assert r.queue_depths() == {"slow/s": 2}
        assert [r.queue_positions(i) for i in waiting] == [{"s": 0}, {"s": 1}]
        assert r.send_queue_hints(waiting[1]) == 1  # tells the node daemon, for queue-aware eviction
        assert r.send_queue_hints() >= 2
        # ... which the runtime also does by itself as the queues change (no call needed):
        wait_for(lambda: r.node_stats()["rt0"]["queue_hints"] >= 5, what="the runtime's own queue hints")
        with pytest.raises(Overloaded, match="queue of slow/s holds 2 requests"):
            r.submit("slow", {"x": np.zeros(1)})
        for i in [first, *waiting]:
            assert r.result(i, timeout=30).ok
        assert r.queue_positions(first) == {}


def test_idle_worker_is_stopped_and_restarted_on_demand(rt_handlers: str) -> None:
    """keep_alive: an idle worker process goes away; the next request starts a new one and succeeds."""
    with LocalRuntime(RuntimeConfig(keep_alive_s=0.3)) as r:
        r.deploy(FAIL)
        pool = r.deployments.pools["failing/f"]
        first = pool.slots[0]
        assert first is not None and first.alive()
        wait_for(lambda: not pool.slots and not first.alive(), what="the idle worker to be stopped")
        assert not first.alive()
        res = r.invoke("failing", {"x": np.ones(2)}, timeout=60)
        assert res.ok and res.functions[0].worker != first.name


def test_one_set_of_workers_serves_both_transports(rt: LocalRuntime) -> None:
    """transport= per invocation: the same warm workers answer through Redis, with the same outputs,
    and the baseline's keys are deleted when the invocation ends."""
    import redis

    x = np.arange(12, dtype=np.float64) - 4
    pids = {k: p.slots[0].pid for k, p in rt.deployments.pools.items() if k.startswith("fans/")}
    a = rt.invoke("fans", {"x": x}, timeout=30, transport="redis")
    b = rt.invoke("fans", {"x": x}, timeout=30)
    assert a.ok and b.ok, (a.error, b.error)
    np.testing.assert_array_equal(a.outputs["out"], b.outputs["out"])
    assert {k: p.slots[0].pid for k, p in rt.deployments.pools.items() if k.startswith("fans/")} == pids
    r = redis.Redis.from_url(rt.nodes.redis_url)
    wait_for(lambda: r.dbsize() == 0, what="the baseline's keys to be deleted")
    with pytest.raises(Exception, match="transport 'carrier-pigeon' is not"):
        rt.submit("fans", {"x": x}, transport="carrier-pigeon")


def test_ending_an_invocations_data_never_holds_up_the_next_submit(rt_handlers: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The end of an invocation's data runs on the runtime's ender, on node connections of its own:
    with ends stalled, the next invocation still opens, runs and finishes (the end held the lock its
    open takes: docs/performance.md's 'lock' step). Once ends go through, the data is freed and the
    ended invocation's credentials are refused, as before."""
    import gfaas
    from gfaas.dataplane.client import Admin, Credentials

    gate = threading.Event()
    for name in ("end_invocation", "end_invocations"):
        real = getattr(Admin, name, None)
        if real is not None:
            def stalled(self: Any, *a: Any, _real: Any = real, **k: Any) -> Any:
                gate.wait(30)
                return _real(self, *a, **k)

            monkeypatch.setattr(Admin, name, stalled)
    with LocalRuntime(RuntimeConfig(executor="inproc")) as r:
        r.invoker.keep_retired = {}  # the first invocation's token is read after it finished
        r.deploy(TWO)
        first = r.invoke("two-outputs", {"x": np.ones(3)}, timeout=30)
        assert first.ok
        creds = Credentials(r.nodes.transport_settings()["socket_path"], r.invoker.keep_retired[first.invocation_id].tokens["f"])
        later: list[Any] = []
        t = threading.Thread(target=lambda: later.append(r.invoke("two-outputs", {"x": np.ones(4)}, timeout=30)))
        t.start()
        t.join(15)
        finished_while_stalled = bool(later)
        gate.set()
        t.join(30)
        assert finished_while_stalled and later[0].ok
        wait_for(lambda: objects(r) == 0 and r.node_stats()["rt0"]["invocations"] == 0,
                 what="the ended invocations' data to be freed")
        with pytest.raises(gfaas.AuthenticationError, match="unknown or revoked function token"):
            gfaas.connect(creds)


def test_the_runtime_sends_queue_hints_as_queues_change(rt_handlers: str) -> None:
    """Without any call, the node daemon hears where each waiting invocation's function stands:
    the exact positions in the queue, then the position of the one that runs, then it is done.
    (What the daemon knows is replayed here from what the hinter sent, by the daemon's own book.)"""
    from gfaas.policy.storage import QueueBook
    from gfaas.runtime.hints import Batch

    slow = f"""
name: slowq
inputs: {{x: null}}
outputs: {{out: s.y}}
functions:
  - {{name: s, kind: cpu, handler: "{H}:slow", params: {{seconds: 0.3}}, inputs: {{x: input.x}}, outputs: {{y: null}}}}
"""
    sent: list[Batch] = []
    # inline_max_bytes=0: every value on the node, which is what queue hints are for
    with LocalRuntime(RuntimeConfig(executor="inproc", queue_hint_interval_s=0.0, inline_max_bytes=0)) as r:
        r.deploy(slow)
        hinter = r.invoker._hinter
        assert hinter is not None
        real = hinter._send
        hinter._send = lambda b: (sent.append(b), real(b))[1]
        first = r.submit("slowq", {"x": np.zeros(1)})
        wait_for(lambda: r.status(first) == "running", what="the first request to start")
        waiting = [r.submit("slowq", {"x": np.full(1, k)}) for k in (1, 2)]
        for i in [first, *waiting]:
            assert r.result(i, timeout=30).ok
        received = r.node_stats()["rt0"]["queue_hints"]
    book = QueueBook()
    seen: dict[str, list[Any]] = {inv: [] for inv in waiting}
    for entries, heads in sent:
        book.advance(heads)
        for inv, queued, running, done in entries:
            book.hint(inv, dict.fromkeys(running, 0), done, queued)
        for inv in waiting:
            now = (book.positions(inv), sorted(book.done(inv)))
            if inv in book and (not seen[inv] or seen[inv][-1] != now):
                seen[inv].append(now)
    # The last request waited behind the other one (position 1), then ran first in line (0).
    assert ({"s": 1}, []) in seen[waiting[1]] and ({"s": 0}, []) in seen[waiting[1]]
    assert seen[waiting[1]].index(({"s": 1}, [])) < seen[waiting[1]].index(({"s": 0}, []))
    # Each invocation is sent when it changes (queued, running, done), never for others' moves.
    per_inv = [sum(e[0] == inv for b in sent for e in b[0]) for inv in waiting]
    assert all(1 <= n <= 3 for n in per_inv), per_inv
    assert received >= sum(len(b[0]) for b in sent) - 1 >= 4  # the daemon applied them (one may race the end)


def test_queue_hints_cost_o1_per_change_and_stay_exact_with_255_queued(rt_handlers: str, make_config: Any,
                                                                       thread_daemon: Any) -> None:
    """255 requests queued behind one gated worker: the node daemon knows each one's exact position;
    letting 20 through sends O(20) hint entries, not the ~240 positions each dispatch moves (a
    dispatch moves one queue head: runtime.hints); over all 256 invocations it gets at most 3 entries
    per function (queued, running, done)."""
    import rt_handlers as handlers

    from gfaas.runtime.local import NodeEndpoint

    spec = f"""
name: gatedq
inputs: {{x: null}}
outputs: {{out: n.y}}
functions:
  - {{name: g, kind: cpu, handler: "{H}:gated", inputs: {{x: input.x}}, outputs: {{y: null}}}}
  - {{name: n, kind: cpu, handler: "{H}:negate", inputs: {{x: g.y}}, outputs: {{y: null}}}}
"""
    handlers.GATE = threading.Semaphore(0)  # no permits left by an earlier run in this process
    cfg = make_config()
    rc = RuntimeConfig(executor="inproc", queue_hint_interval_s=0.0, nodes=(NodeEndpoint("n0", cfg.socket_path, cfg.state_dir),))
    with thread_daemon(cfg) as d, LocalRuntime(rc) as r:
        r.deploy(spec)
        book = d.store.tiers.queues
        ids = [r.submit("gatedq", {"x": np.full(1, k)}) for k in range(256)]

        def exact(queued: int) -> bool:
            want = {i: r.queue_positions(i) for i in ids}
            if sum(1 for p in want.values() if p) != queued:
                return False
            with d.lock:
                return all(book.positions(i) == p for i, p in want.items() if p)

        try:
            wait_for(lambda: exact(255), timeout=30, what="the daemon to know the 255 queued positions")
            before = d.store.tiers.counters["queue_hints"]
            for _ in range(20):
                handlers.GATE.release()
            for i in ids[:20]:
                assert r.result(i, timeout=30).ok
            wait_for(lambda: exact(235), timeout=30, what="the daemon to know the 235 queued positions")
            moved = d.store.tiers.counters["queue_hints"] - before
            assert moved <= 6 * 21 + 6, moved  # O(what changed); the positions of all 235 changed 20 times
        finally:
            for _ in range(256):
                handlers.GATE.release()
        for i in ids:
            assert r.result(i, timeout=60).ok
        total = d.store.tiers.counters["queue_hints"]
    assert total <= 6 * 256, total


def test_a_functions_inputs_are_fetched_with_the_deadline_its_slo_leaves(rt_handlers: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The first run of a function has no estimate (best effort); later runs fetch their inputs
    with the budget policy.bandwidth.input_deadline derives from its last compute time, minus what
    has elapsed, so the data plane's copies are ordered by the function's SLO."""
    from gfaas.policy.bandwidth import input_deadline
    from gfaas.runtime.transport import GfaasTransport

    seen: list[float | None] = []
    real = GfaasTransport.get

    def spy(self: GfaasTransport, ref: str, deadline_s: float | None = None, device: int | None = None) -> np.ndarray:
        seen.append(deadline_s)
        return real(self, ref, deadline_s, device)

    monkeypatch.setattr(GfaasTransport, "get", spy)
    spec = f"""
name: timed
inputs: {{x: null}}
outputs: {{out: s.y}}
functions:
  - {{name: d, kind: cpu, handler: "{H}:double", inputs: {{x: input.x}}, outputs: {{y: null, n_pos: {{shape: []}}}}}}
  - {{name: s, kind: cpu, handler: "{H}:read_then_sleep", params: {{seconds: 0.2}}, inputs: {{x: d.y}},
     outputs: {{y: null}}}}
"""
    with LocalRuntime(RuntimeConfig(executor="inproc", inline_max_bytes=0)) as r:  # gets from the data plane
        r.deploy(spec)
        first = r.invoke("timed", {"x": np.ones(4)})
        n_first = len(seen)
        second = r.invoke("timed", {"x": np.ones(4)})
    assert first.ok and second.ok
    assert seen[:n_first] == [None] * n_first  # nothing measured yet
    budgets = {f.function: input_deadline(0.0, f.compute_s) for f in first.functions}
    later = seen[n_first:]
    assert len(later) == 3 and later[2] is None, later  # the last: the runtime collecting the result
    assert all(d is not None and d > 0 for d in later[:2]), later
    # d reads at once: nearly its whole (small) budget is left; s reads first thing, before its 0.2 s
    assert later[0] <= budgets["d"]  # type: ignore[operator]
    assert budgets["s"] - 0.05 < later[1] <= budgets["s"], (later, budgets)  # type: ignore[operator]
