"""The invoker's lane (gfaas.runtime.lane): a lone embedded invocation that one warm worker runs whole
is sent, read and finished by the caller itself. Its outcome must be the general path's: the same
outputs, scalars, records, log lines, DAG decisions and retired state; and whatever it does not handle
(a failure, a forged or broken reply, a request for the data plane, a slow handler, a dead worker, a
second caller) must reach the general path as it stands, which then decides as it always did."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

from gfaas.policy.polling import MAX_POLL_US
from gfaas.runtime import invoker as invoker_mod
from gfaas.runtime.lane import lane_plan
from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.workflows.tiny import SPEC as TINY
from gfaas.workflows.tiny import expected_total

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("rt_handlers"),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                 reason="the lane polls for its reply, which the polling rule allows on 2 CPUs or more")]

CHAIN3 = """
name: chain3
inputs: {x: null}
outputs: {y: c.y}
functions:
  - {name: a, kind: cpu, handler: "rt_handlers:relay", inputs: {x: input.x}, outputs: {y: null, pid: {shape: []}}}
  - {name: b, kind: cpu, handler: "rt_handlers:double", inputs: {x: a.y}, outputs: {y: null, n_pos: {shape: []}}}
  - {name: c, kind: cpu, handler: "rt_handlers:fail_if_negative", inputs: {x: b.y}, outputs: {y: null}}
"""

# b's output outgrows what a reply carries for a large input: the worker asks for the data plane
GROW = """
name: grow
inputs: {n: {dtype: int64, shape: []}}
outputs: {total: r.total}
functions:
  - {name: g, kind: cpu, handler: "gfaas.workflows.tiny:gen", inputs: {n: input.n},
     outputs: {x: {dtype: float32, shape: [-1]}}}
  - {name: r, kind: cpu, handler: "gfaas.workflows.tiny:red", params: {stride: 4}, inputs: {x: g.x},
     outputs: {total: {dtype: float32, shape: []}}}
"""

SLOW = """
name: slowone
inputs: {x: null, seconds: {shape: []}}
outputs: {y: s.y}
functions:
  - {name: s, kind: cpu, handler: "rt_handlers:sleep_for", inputs: {x: input.x, seconds: input.seconds},
     outputs: {y: null}}
"""

CRASH = """
name: crash
inputs: {x: null}
outputs: {y: c.y}
functions:
  - {name: c, kind: cpu, handler: "rt_handlers:crash_if_negative", inputs: {x: input.x}, outputs: {y: null}}
"""

GATED = """
name: gatedwf
inputs: {x: null}
outputs: {y: b.y}
functions:
  - {name: a, kind: cpu, handler: "rt_handlers:double", inputs: {x: input.x}, outputs: {y: null, n_pos: {shape: []}}}
  - {name: b, kind: cpu, handler: "rt_handlers:negate", inputs: {x: {from: a.y, when: "a.n_pos > 0"}},
     outputs: {y: null}}
"""


def _rt(**kw: Any) -> LocalRuntime:
    # The lane reads its reply while the polling rule says poll: a long window, so that a loaded
    # machine does not send the replies these tests count to the general path (they finish there too)
    return LocalRuntime(RuntimeConfig(sandbox="none", queue_hints=False, poll_us=MAX_POLL_US, **kw))


@pytest.fixture
def lane(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the invocations the lane finished itself (``done``) and those it handed over (``handed``)."""
    seen = {"done": 0, "handed": 0}
    real = invoker_mod.Invoker._lane_done

    def spy(self: Any, *a: Any) -> Any:
        res = real(self, *a)
        seen["done" if res is not None else "handed"] += 1
        return res

    monkeypatch.setattr(invoker_mod.Invoker, "_lane_done", spy)
    return seen


def _general(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(invoker_mod.Invoker, "_lane_of", lambda self, spec, version: None)


def _outcome(rt: LocalRuntime, wf: str, res: Any) -> dict[str, Any]:
    """What an invocation left behind, without its timings and random IDs."""
    inv = rt.invoker.keep_retired[res.invocation_id]  # type: ignore[index]
    return {
        "status": res.status, "error": res.error,
        "failure": None if res.failure is None else (res.failure.function, res.failure.error),
        "outputs": {k: (v.dtype.str, v.shape, v.tobytes(), v.flags.writeable) for k, v in res.outputs.items()},
        "scalars": {k: "a pid" if k.endswith(".pid") else v for k, v in res.scalars.items()},
        "records": [(r.function, r.worker.split("@")[0].rsplit("-", 1)[0], r.skipped, r.placement, r.drive,
                     r.cold_start_s, r.compute_s > 0, r.slo_s == (1.5 * r.compute_s if r.compute_s > 0 else 0.0))
                    for r in res.functions],
        "events": list(inv.dag.events), "dag": dict(inv.dag.state), "running": inv.running, "ended": inv.ended,
        "logs": sorted((ln["function"], ln["text"]) for ln in rt.logs(wf, invocation=res.invocation_id)),
        "unresolved": rt.invoker._unresolved, "in_flight": len(rt.invoker._running),
    }


CASES = [
    ("tiny", TINY, {"n": np.asarray(256, dtype=np.int64)}),
    ("chain3", CHAIN3, {"x": np.arange(5.0)}),
    ("chain3", CHAIN3, {"x": np.arange(5.0) - 9}),  # c fails: the chain's last reply is a Failed
    ("grow", GROW, {"n": np.asarray(40_000, dtype=np.int64)}),  # g's array goes through the data plane
    ("gatedwf", GATED, {"x": np.arange(3.0)}),  # a condition: not the lane's
]


def _run_cases(rt: LocalRuntime) -> list[dict[str, Any]]:
    rt.invoker.keep_retired = {}
    deployed = set()
    out = []
    for wf, spec, inputs in CASES:
        if wf not in deployed:
            rt.deploy(spec)
            deployed.add(wf)
        for _ in range(3):  # the first call of each starts its worker (queued, not the lane's)
            res = rt.invoke(wf, inputs, timeout=60)
        out.append(_outcome(rt, wf, res))
    return out


def test_the_lane_leaves_what_the_general_path_leaves(monkeypatch: pytest.MonkeyPatch, lane: dict[str, int]) -> None:
    with _rt() as rt:
        fast = _run_cases(rt)
    assert lane["done"] >= 4, lane  # tiny and chain3 (twice each after their first) went through it
    assert lane["handed"] >= 2, lane  # chain3's failure and grow's data plane went to the general path
    _general(monkeypatch)
    lane["done"] = lane["handed"] = 0
    with _rt() as rt:
        slow = _run_cases(rt)
    assert lane == {"done": 0, "handed": 0}
    for a, b, case in zip(fast, slow, CASES, strict=True):
        assert a == b, case[0]
    assert fast[0]["outputs"]["total"][2] == np.float32(expected_total(256)).tobytes()
    assert fast[2]["status"] == "failed" and "negative input" in fast[2]["error"]
    assert fast[4]["events"] == [("a", "ready"), ("b", "ready")]


def test_a_gated_workflow_has_no_lane_plan_and_a_chain_has_one() -> None:
    with _rt() as rt:
        rt.deploy(GATED)
        rt.deploy(CHAIN3)
        inv = rt.invoker
        gated, chain = rt.deployments.current("gatedwf"), rt.deployments.current("chain3")
        assert gated is not None and chain is not None
        assert inv._lane_of(gated.spec, gated.number) is None
        lane = inv._lane_of(chain.spec, chain.number)
    assert lane is not None and lane.plan.functions == ("a", "b", "c")
    plan = lane.plan
    # without chains, a function with a reader is not the whole workflow
    assert lane_plan(plan.spec, lambda fn: ()) is None
    assert lane_plan(plan.spec, lambda fn: ("b",)) is None  # a chain that stops short of c


def test_a_handler_slower_than_the_poll_window_is_handed_over_and_finishes(lane: dict[str, int]) -> None:
    with _rt() as rt:
        rt.deploy(SLOW)
        x = np.arange(4.0)
        rt.invoke("slowone", {"x": x, "seconds": np.float64(0.0)}, timeout=60)  # its worker is warm now
        for seconds in (0.0, 0.05, 0.0):
            res = rt.invoke("slowone", {"x": x, "seconds": np.float64(seconds)}, timeout=60)
            assert res.ok, res.error
            np.testing.assert_array_equal(res.outputs["y"], x)
        assert rt.invoker._unresolved == 0 and not rt.invoker._running
        # the caller's own timeout: TimeoutError, and the invocation still finishes on the loop
        with pytest.raises(TimeoutError, match="still running after 0.02 s"):
            rt.invoke("slowone", {"x": x, "seconds": np.float64(0.3)}, timeout=0.02)
        res = rt.invoke("slowone", {"x": x, "seconds": np.float64(0.0)}, timeout=60)
        assert res.ok, res.error
    assert lane["done"] >= 2, lane


def test_a_worker_that_dies_in_the_lane_fails_its_invocation_and_is_replaced(lane: dict[str, int]) -> None:
    with _rt() as rt:
        rt.deploy(CRASH)
        ok = {"x": np.arange(3.0)}
        assert rt.invoke("crash", ok, timeout=60).ok
        res = rt.invoke("crash", {"x": np.arange(3.0) - 5}, timeout=60)
        assert res.status == "failed" and "exited" in (res.error or ""), res.error
        again = rt.invoke("crash", ok, timeout=60)
        assert again.ok, again.error
        np.testing.assert_array_equal(again.outputs["y"], np.arange(3.0) + 1)
        assert rt.invoker._unresolved == 0 and not rt.invoker._running


def test_a_second_caller_while_the_lane_waits_is_served_too(lane: dict[str, int]) -> None:
    with _rt() as rt:
        rt.deploy(SLOW)
        rt.deploy(TINY)
        x = np.arange(4.0)
        rt.invoke("slowone", {"x": x, "seconds": np.float64(0.0)}, timeout=60)
        rt.invoke("tiny", {"n": np.asarray(8, dtype=np.int64)}, timeout=60)
        got: dict[str, Any] = {}

        def other() -> None:
            got["tiny"] = [rt.invoke("tiny", {"n": np.asarray(8 + k, dtype=np.int64)}, timeout=60) for k in range(50)]

        t = threading.Thread(target=other)
        t.start()
        slow = [rt.invoke("slowone", {"x": x, "seconds": np.float64(0.002)}, timeout=60) for _ in range(20)]
        t.join(60)
        assert all(r.ok for r in slow), [r.error for r in slow if not r.ok]
        assert [float(r.outputs["total"]) for r in got["tiny"]] == [expected_total(8 + k) for k in range(50)]
        assert rt.invoker._unresolved == 0 and not rt.invoker._running


def test_a_lane_invocation_in_flight_counts_as_unfinished_and_fails_when_its_workflow_stops() -> None:
    """The lane makes no invocation state unless the general path takes over, so what asks about
    unfinished invocations (a replaced version's drain) and what fails them (stopped: undeploy, a
    drain's timeout) must see the one in flight through the lane's own mark. A handler of 7 ms keeps
    the lane polling (the window is 10 ms here) while another thread asks and stops the workflow (on
    a machine slow enough to pass the window, the general path takes it over and fails it the same)."""
    with _rt() as rt:
        rt.deploy(SLOW)
        x = np.arange(4.0)
        assert rt.invoke("slowone", {"x": x, "seconds": np.float64(0.0)}, timeout=60).ok
        cur = rt.deployments.current("slowone")
        assert cur is not None
        seen: dict[str, Any] = {}
        started = threading.Event()

        def watch() -> None:
            started.wait(10)
            deadline = 0
            while not rt.invoker.unfinished("slowone", cur.number) and deadline < 100_000:
                deadline += 1
            seen["unfinished"] = rt.invoker.unfinished("slowone", cur.number)
            rt.invoker.stopped("slowone", cur.number, "stopped by the test", [])

        t = threading.Thread(target=watch)
        t.start()
        started.set()
        res = rt.invoke("slowone", {"x": x, "seconds": np.float64(0.007)}, timeout=60)
        t.join(10)
        assert seen["unfinished"] is True, seen
        assert res.status == "failed" and res.error == "stopped by the test", (res.status, res.error)
        assert rt.invoker._unresolved == 0 and rt.invoker._lane_busy is None and rt.invoker._lane_failed is None
        assert not rt.invoker.unfinished("slowone", cur.number)
        # the next one goes through the lane again, and finishes
        again = rt.invoke("slowone", {"x": x, "seconds": np.float64(0.0)}, timeout=60)
        assert again.ok, again.error
