"""Chains (gfaas.policy.fusion): a function that reads from one other function alone, and is its only
reader, runs in that function's warm worker right after it, one round trip for both, when what passes
between them is carried as values; otherwise it runs in its own worker, as every function does with
``fuse_chains=False``. Each function keeps its own record, log lines and failure."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.workflows.tiny import expected_total

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("rt_handlers")]

CHAIN3 = """
name: chain3
inputs: {x: null}
outputs: {y: c.y, pa: a.pid, pb: b.pid, pc: c.pid}
functions:
  - {name: a, kind: cpu, handler: "rt_handlers:relay", inputs: {x: input.x}, outputs: {y: null, pid: {shape: []}}}
  - {name: b, kind: cpu, handler: "rt_handlers:relay", inputs: {x: a.y}, outputs: {y: null, pid: {shape: []}}}
  - {name: c, kind: cpu, handler: "rt_handlers:relay", inputs: {x: b.y}, outputs: {y: null, pid: {shape: []}}}
"""

# a -> g -> r: g's array outgrows what a reply carries for a large n
GROW = """
name: grow
inputs: {n: {dtype: int64, shape: []}}
outputs: {total: r.total, pa: a.pid}
functions:
  - {name: a, kind: cpu, handler: "rt_handlers:relay", inputs: {x: input.n},
     outputs: {y: {dtype: int64, shape: []}, pid: {shape: []}}}
  - {name: g, kind: cpu, handler: "gfaas.workflows.tiny:gen", inputs: {n: a.y},
     outputs: {x: {dtype: float32, shape: [-1]}}}
  - {name: r, kind: cpu, handler: "gfaas.workflows.tiny:red", params: {stride: 4}, inputs: {x: g.x},
     outputs: {total: {dtype: float32, shape: []}}}
"""

FAILS = """
name: fails
inputs: {x: null}
outputs: {y: b.y, pid: a.pid}
functions:
  - {name: a, kind: cpu, handler: "rt_handlers:relay", inputs: {x: input.x}, outputs: {y: null, pid: {shape: []}}}
  - {name: b, kind: cpu, handler: "rt_handlers:fail_if_negative", inputs: {x: a.y}, outputs: {y: null}}
"""


def _rt(**kw: Any) -> LocalRuntime:
    return LocalRuntime(RuntimeConfig(sandbox="none", queue_hints=False, **kw))


def _workers(res: Any) -> dict[str, str]:
    return {r.function: r.worker for r in res.functions}


@pytest.mark.parametrize("fuse", [True, False])
def test_a_chain_of_three_runs_in_one_worker_and_each_keeps_its_record_and_logs(fuse: bool) -> None:
    with _rt(fuse_chains=fuse) as rt:
        rt.deploy(CHAIN3)
        for k in range(3):
            res = rt.invoke("chain3", {"x": np.arange(5.0) + k}, timeout=60)
            assert res.ok, res.error
            np.testing.assert_array_equal(res.outputs["y"], np.arange(5.0) + k)
        pids = {f: int(res.outputs[f"p{f}"]) for f in "abc"}
        workers = _workers(res)
        lines = {f: [ln["text"] for ln in rt.logs("chain3", function=f, invocation=res.invocation_id)] for f in "abc"}
    assert lines == {f: [f"relay ran as {f}"] for f in "abc"}, lines  # each line under the function that printed it
    if fuse:
        assert len(set(pids.values())) == 1, pids
        assert workers["a"] == workers["b"] == workers["c"] and workers["a"].startswith("a@"), workers
    else:
        assert len(set(pids.values())) == 3, pids
        assert [workers[f].split("@")[0] for f in "abc"] == ["a", "b", "c"], workers


@pytest.mark.parametrize("fuse", [True, False])
def test_a_value_only_the_chain_reads_does_not_travel_back(fuse: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a chain, a's ``y`` goes to b and b's to c inside the worker, so their replies carry neither
    (worker._keep_outside); what the client reads (every ``pid``, c's ``y``) comes back. Unfused, every
    value a reader elsewhere needs travels; a follower that fails keeps its input's value in the reply."""
    carried = _replies(monkeypatch, "values")
    with _rt(fuse_chains=fuse) as rt:
        rt.deploy(CHAIN3)
        res = rt.invoke("chain3", {"x": np.arange(5.0)}, timeout=60)
        assert res.ok, res.error
        np.testing.assert_array_equal(res.outputs["y"], np.arange(5.0))
        assert {f: int(res.outputs[f"p{f}"]) > 0 for f in "abc"} == dict.fromkeys("abc", True)
        if fuse:
            assert carried == [("a", ["pid"]), ("b", ["pid"]), ("c", ["pid", "y"])], carried
        else:
            assert carried == [("a", ["pid", "y"]), ("b", ["pid", "y"]), ("c", ["pid", "y"])], carried
        carried.clear()
        rt.deploy(FAILS)
        bad = rt.invoke("fails", {"x": -np.ones(2)}, timeout=60)
        assert bad.status == "failed"
        assert carried == [("a", ["pid", "y"]), ("b", [])], carried  # b failed: a's y is not b's to drop


def _replies(monkeypatch: pytest.MonkeyPatch, what: str) -> list[tuple[str, list[str]]]:
    """Each reply's ``what`` (``values``: the outputs carried in it; ``outputs``: those stored, as
    references), by function, in the order the runtime reads them."""
    from gfaas.runtime.invoker import Invoker

    seen: list[tuple[str, list[str]]] = []
    finish, lane_done = Invoker._finish, Invoker._lane_done

    def noted(self: Invoker, worker: Any, run: Any, reply: Any) -> None:
        seen.append((run.fn, sorted(getattr(reply, what, {}))))
        finish(self, worker, run, reply)

    def lane_noted(self: Invoker, worker: Any, lane: Any, pool: Any, reply: Any, *rest: Any) -> Any:
        """The lane (runtime.lane) reads a whole chain's reply at once; one it hands over goes to _finish."""
        res = lane_done(self, worker, lane, pool, reply, *rest)
        if res is None:
            return None
        for fn in lane.plan.functions:
            seen.append((fn, sorted(getattr(reply, what, {}))))
            reply = reply.next
        return res

    monkeypatch.setattr(Invoker, "_finish", noted)
    monkeypatch.setattr(Invoker, "_lane_done", lane_noted)
    return seen


def _stored(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    return _replies(monkeypatch, "outputs")


def test_a_large_value_only_the_next_function_reads_is_handed_over_in_the_worker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """n = 100,000: g's array (400 KB) is more than a reply carries, and r alone reads it: g's worker
    hands it to r there, read-only (worker._holdable), so it is never stored. Before, the chain stopped
    at g, g stored the array and r read it from the node in its own worker."""
    stored = _stored(monkeypatch)
    with _rt() as rt:
        rt.deploy(GROW)
        small = rt.invoke("grow", {"n": np.asarray(100, dtype=np.int64)}, timeout=60)
        big = rt.invoke("grow", {"n": np.asarray(100_000, dtype=np.int64)}, timeout=60)
        rt.deploy(GROW.replace("name: grow", "name: growrw").replace('"gfaas.workflows.tiny:red", params: {stride: 4}',
                                                                     '"rt_handlers:writable"')
                  .replace("outputs: {total: {dtype: float32, shape: []}}", "outputs: {writable: {shape: []}}")
                  .replace("total: r.total", "total: r.writable"))
        rw = rt.invoke("growrw", {"n": np.asarray(100_000, dtype=np.int64)}, timeout=60)
    assert small.ok and big.ok and rw.ok, (small.error, big.error, rw.error)
    assert float(small.outputs["total"]) == expected_total(100)
    assert float(big.outputs["total"]) == expected_total(100_000)
    for res in (small, big, rw):
        w = _workers(res)
        assert w["a"] == w["g"] == w["r"], w
    assert stored == [(f, []) for f in "agr"] * 3, stored  # nothing stored (before: ("g", ["x"]) for big)
    assert float(rw.outputs["total"]) == 0.0  # r could not write into g's array


HANDED_FAILS = """
name: hfails
inputs: {n: {dtype: int64, shape: []}}
outputs: {y: f.y}
functions:
  - {name: g, kind: cpu, handler: "gfaas.workflows.tiny:gen", inputs: {n: input.n},
     outputs: {x: {dtype: float32, shape: [-1]}}}
  - {name: ng, kind: cpu, handler: "rt_handlers:negate", inputs: {x: g.x}, outputs: {y: null}}
  - {name: f, kind: cpu, handler: "rt_handlers:fail_if_negative", inputs: {x: ng.y}, outputs: {y: null}}
"""


def test_a_follower_that_fails_on_a_value_handed_over_fails_the_invocation_as_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """g's 400 KB array goes to ng and ng's to f inside the worker, never stored; f fails on what it
    was handed: the invocation fails as f's failure (the runtime does not take ng's reply, which lacks
    its array, for a forged one), and the worker serves the next invocation the same way."""
    stored = _stored(monkeypatch)
    with _rt() as rt:
        rt.deploy(HANDED_FAILS)
        bad = rt.invoke("hfails", {"n": np.asarray(100_000, dtype=np.int64)}, timeout=60)
        good = rt.invoke("hfails", {"n": np.asarray(1, dtype=np.int64)}, timeout=60)  # [0] -> [-0.] -> [1.]
    assert bad.status == "failed" and "function 'f': negative input at 1" in (bad.error or ""), bad.error
    assert bad.failure is not None and bad.failure.function == "f" and bad.failure.error == "ValueError"
    assert good.ok, good.error
    np.testing.assert_array_equal(good.outputs["y"], np.ones(1, np.float32))
    assert _workers(bad)["g"] == _workers(good)["g"] == _workers(good)["f"]  # one worker, not replaced
    assert stored[:3] == [("g", []), ("ng", []), ("f", [])], stored


def test_a_chain_stops_where_a_large_value_has_a_reader_outside_it() -> None:
    """The client reads g's array too: it is stored, through the data plane g's task asks for under its
    own name (NeedData for g, granted as g's credentials), and r reads it from the node in its own
    worker."""
    with _rt() as rt:
        rt.deploy(GROW.replace("name: grow", "name: grow_out").replace("pa: a.pid}", "pa: a.pid, x: g.x}"))
        big = rt.invoke("grow_out", {"n": np.asarray(100_000, dtype=np.int64)}, timeout=60)
    assert big.ok, big.error
    assert float(big.outputs["total"]) == expected_total(100_000)
    np.testing.assert_array_equal(big.outputs["x"], np.arange(100_000, dtype=np.float32))
    w = _workers(big)
    assert w["a"] == w["g"] and w["r"].startswith("r@"), w
    assert big.breakdown.fn_pass_s > 0  # r read g's array from the node




def test_a_follower_that_fails_fails_the_invocation_as_itself_and_the_worker_serves_on() -> None:
    with _rt() as rt:
        rt.deploy(FAILS)
        bad = rt.invoke("fails", {"x": -np.ones(2)}, timeout=60)
        good = rt.invoke("fails", {"x": np.ones(2)}, timeout=60)
    assert bad.status == "failed" and "function 'b': negative input at 0" in (bad.error or ""), bad.error
    assert bad.failure is not None and bad.failure.function == "b" and bad.failure.error == "ValueError"
    assert good.ok, good.error
    np.testing.assert_array_equal(good.outputs["y"], np.full(2, 2.0))
    assert _workers(bad)["a"] == _workers(good)["a"] == _workers(good)["b"]  # one worker, not replaced


def test_fuse_chains_is_checked() -> None:
    from gfaas.errors import ConfigError

    with pytest.raises(ConfigError, match="fuse_chains='yes' must be true or false"):
        RuntimeConfig(fuse_chains="yes")  # type: ignore[arg-type]


def test_a_worker_that_dies_in_a_follower_fails_the_invocation_naming_the_chain_and_is_replaced() -> None:
    spec = FAILS.replace("name: fails", "name: crashes").replace("fail_if_negative", "crash_if_negative")
    with _rt() as rt:
        rt.deploy(spec)
        first = rt.invoke("crashes", {"x": np.ones(2)}, timeout=60)
        bad = rt.invoke("crashes", {"x": -np.ones(2)}, timeout=60)
        again = rt.invoke("crashes", {"x": np.ones(2)}, timeout=60)
    assert first.ok and again.ok, (first.error, again.error)
    assert bad.status == "failed", bad.error
    assert "exited (status 3) while it held a's task (and its chain: b)" in (bad.error or ""), bad.error
    assert int(again.outputs["pid"]) != int(first.outputs["pid"])  # a new worker
    assert _workers(again)["a"] == _workers(again)["b"]  # which runs the chain again


def test_chains_are_off_where_tasks_cannot_be_lazy_or_workers_are_not_processes() -> None:
    """Only process workers on one node (where a follower needs no credentials sent ahead) run chains."""
    from gfaas.runtime.spec import loads

    spec = loads(CHAIN3, check_handlers=False)
    with _rt(executor="inproc") as rt:
        assert rt.deployments.follow(spec, "a") == ()
        rt.deploy(CHAIN3)
        assert rt.invoke("chain3", {"x": np.arange(3.0)}, timeout=60).ok
    with _rt() as rt:
        assert rt.deployments.follow(spec, "a") == ("b", "c") and rt.deployments.follow(spec, "b") == ("c",)
        assert rt.deployments.follow(spec, "c") == ()


def test_a_held_value_is_handed_read_only_stored_once_the_data_plane_was_used_and_never_kept() -> None:
    """FunctionHost.run on its own (a recording transport, no worker): an output ``hold`` names is
    kept for the chain's next function, read-only, and not stored; if the task used the data plane
    (``asked``), the chain ends and it is stored; ``take_held`` gives it up, so an idle worker keeps
    no large array alive until its next task."""
    from gfaas.runtime.worker import FunctionHost, Init, Task
    from gfaas.workflows.tiny import SPEC

    class Stored:
        def __init__(self) -> None:
            self.puts: list[str] = []

        def get(self, ref: str, deadline_s: float | None = None) -> Any:
            raise AssertionError("n is carried, never read from the node")

        def put(self, value: Any, consumers: Any) -> str:
            self.puts.append(list(consumers)[0])
            return "ref"

        def close(self) -> None:
            pass

    host = FunctionHost(Init("tiny", "gen", SPEC))
    task = Task("inv", "tok", {"n": "inline:n"}, [], {"x": ["red"]}, inline_max=1024, lazy=True,
                values={"n": _value(np.asarray(100_000, dtype=np.int64))})
    for asked, stored in (([False], []), ([True], ["red"])):
        t = Stored()
        done = host.run(task, None, None, transport=t, hold=frozenset({"x"}), asked=asked)
        assert t.puts == stored and sorted(done.outputs) == (["x"] if stored else []), done
        held = host.take_held()
        assert host.held == {} and sorted(held) == ([] if stored else ["x"])
        if held:
            np.testing.assert_array_equal(held["x"], np.arange(100_000, dtype=np.float32))
            assert not held["x"].flags.writeable


def _value(a: np.ndarray) -> Any:
    from gfaas.runtime.worker import to_value

    return to_value(a)
