"""Workers and the invoker poll for their next message before they sleep (policy.polling,
``RuntimeConfig.poll_us``): every answer is the same with polling off, on, across gaps longer than
the window (the worker then sleeps at once, and polls again once tasks come close), and with
invocations in flight together (then nobody polls: a task tells its worker whether its invocation
was the only one unresolved, ``Task.alone``)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gfaas.runtime.invoker import Invoker
from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.runtime.worker import ProcessWorker
from gfaas.workflows.tiny import SPEC, expected_total

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("poll_us", [0, 300, 10_000])
def test_answers_are_the_same_however_long_the_waiters_poll(poll_us: int, monkeypatch: pytest.MonkeyPatch) -> None:
    alone: list[bool] = []
    send = ProcessWorker.send_task

    def record(self: ProcessWorker, task: object) -> None:
        alone.append(task.alone)  # type: ignore[attr-defined]
        send(self, task)  # type: ignore[arg-type]

    monkeypatch.setattr(ProcessWorker, "send_task", record)
    handlers: list[str] = []  # the thread that handled each reply
    on_message = Invoker._on_message

    def noted(self: Invoker, worker: object, msg: object) -> None:
        handlers.append(threading.current_thread().name)
        on_message(self, worker, msg)

    monkeypatch.setattr(Invoker, "_on_message", noted)
    lane_done = Invoker._lane_done

    def lane_noted(self: Invoker, worker: object, lane: object, *rest: object) -> object:
        """The lane (runtime.lane) handles its reply on the caller's thread; one it hands over, _on_message."""
        done = lane_done(self, worker, lane, *rest)  # type: ignore[arg-type]
        if done is not None:
            handlers.append(threading.current_thread().name)
        return done

    monkeypatch.setattr(Invoker, "_lane_done", lane_noted)

    def total(n: int) -> float:
        res = rt.invoke("tiny", {"n": np.asarray(n, dtype=np.int64)}, timeout=60)
        assert res.status == "done", res.error
        return float(res.outputs["total"])

    with LocalRuntime(RuntimeConfig(sandbox="none", queue_hints=False, poll_us=poll_us)) as rt:
        rt.deploy(SPEC)
        sizes = [1 + 37 * i for i in range(40)]
        assert [total(n) for n in sizes] == [expected_total(n) for n in sizes]  # back to back
        assert alone and all(alone)  # one at a time: each invocation was the only one
        # With a window, the caller that waits handles its replies itself (the lane, or
        # ReplyLoop.drive) while they come within it; a reply later than that is the loop thread's. A 300 us window is
        # shorter than a reply takes on a loaded CI machine (stop 52 saw every reply miss it), so
        # only the 10 ms window must see the caller handle some. With none, the loop's thread
        # handles every reply.
        warm = handlers[-30:]
        if poll_us >= 10_000:
            assert "MainThread" in warm, warm
        if poll_us:
            assert set(warm) <= {"MainThread", "gfaas-invoker"}, warm
        else:
            assert set(warm) == {"gfaas-invoker"}, warm
        alone.clear()
        for n in (5, 600, 7000):  # each after a gap longer than any window
            time.sleep(0.03)
            assert total(n) == expected_total(n)
        alone.clear()
        with ThreadPoolExecutor(6) as ex:  # several unresolved at once
            assert list(ex.map(total, sizes)) == [expected_total(n) for n in sizes]
        assert not all(alone)  # some went out while others were unresolved
        assert total(3) == expected_total(3)
        windows = {p.init.poll_s for p in rt.deployments.pools.values()}
    assert windows == {poll_us * 1e-6}  # what each worker was told


def test_a_task_that_asks_for_the_data_plane_stops_the_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lazy task whose output outgrows the messages, and has a reader outside its chain (here the
    client), asks for the data plane (NeedData): from then on it is not light, so the invoker's loop
    stops polling for it (the node daemon needs the CPU). (With ``red`` its only reader, the array
    would be handed over in the worker, never stored: test_runtime_fusion.)"""

    seen: list[tuple[bool, bool]] = []
    grant = Invoker._grant

    def watched(self: Invoker, worker: object, run: object, msg: object) -> None:
        before = getattr(run, "light", None)
        grant(self, worker, run, msg)  # type: ignore[arg-type]
        seen.append((bool(before), bool(getattr(run, "light", None))))

    monkeypatch.setattr(Invoker, "_grant", watched)
    with LocalRuntime(RuntimeConfig(sandbox="none", queue_hints=False)) as rt:
        rt.deploy(SPEC.replace("outputs: {total: red.total}", "outputs: {total: red.total, x: gen.x}"))
        n = 100_000  # gen's array is 400 kB: over inline_max, so gen's worker asks for the data plane
        res = rt.invoke("tiny", {"n": np.asarray(n, dtype=np.int64)}, timeout=60)
        assert res.outputs["x"].nbytes == 4 * n
        assert res.status == "done", res.error
        assert float(res.outputs["total"]) == expected_total(n)
    assert seen and seen[0] == (True, False)
