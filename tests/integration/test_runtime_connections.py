"""The daemon traffic of one embedded invocation that passes its values through the data plane
(``inline_max_bytes=0``; small values otherwise ride in the runtime's messages and the daemon sees
nothing, ``test_runtime_inline.py``): warm workers and the runtime's own side keep their daemon
connections, so a steady invocation opens none and sends no Hello, Lease or Sync; the messages it
does send are counted the way ``benchmarks/profile_invoke.py count`` counts them."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np
import pytest

from gfaas.bench.overload_handlers import SPEC, expected_total
from gfaas.dataplane import daemon as dmod
from gfaas.dataplane import protocol as P
from gfaas.runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig

pytestmark = pytest.mark.timeout(180)

N = 40


@pytest.fixture
def counted(make_config: Any, thread_daemon: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A node daemon on a thread of this process whose accepted connections and decoded requests are
    counted (by type; one-way requests apart), and a runtime using it."""
    counts: Counter[str] = Counter()

    class CountedConn(dmod.Conn):
        def __init__(self, *a: Any, **k: Any) -> None:
            counts["connections accepted"] += 1
            super().__init__(*a, **k)

    real = dmod.Daemon._handle

    def handle(self: dmod.Daemon, conn: dmod.Conn, data: bytes) -> None:
        msg = P.decode_request(data)
        counts[type(msg).__name__ + (" (one-way)" if isinstance(msg, dmod._ASYNC) else "")] += 1
        real(self, conn, data)

    monkeypatch.setattr(dmod, "Conn", CountedConn)
    monkeypatch.setattr(dmod.Daemon, "_handle", handle)
    cfg = make_config(capacity_bytes=1 << 30)
    with thread_daemon(cfg):
        ep = NodeEndpoint("n0", cfg.socket_path, cfg.state_dir)
        with LocalRuntime(RuntimeConfig(nodes=(ep,), queue_hints=False, workers_per_function=1,
                                        inline_max_bytes=0)) as rt:
            rt.deploy(SPEC)
            yield rt, counts


def until(counts: Counter[str], key: str, n: int) -> None:
    """Wait until the daemon has handled ``n`` requests ``key``: one-way ones may still be on their
    way when an invocation's result is back (a CI run under load once waited over 10 s)."""
    deadline = time.monotonic() + 30
    while counts[key] < n and time.monotonic() < deadline:
        time.sleep(0.01)


def run(rt: LocalRuntime, n: int) -> None:
    for _ in range(n):
        res = rt.invoke("overload", {"n": np.asarray(256, dtype=np.int64)}, timeout=60)
        assert res.ok, res.error
        assert float(res.outputs["total"]) == expected_total(256)


def test_a_warm_invocation_opens_no_daemon_connection(counted: Any) -> None:
    """After warm-up, N invocations of gen -> red accept no connection at the daemon (before: 4 each,
    the runtime's side twice and one per worker task)."""
    rt, counts = counted
    run(rt, 3)
    # The ender (Nodes, off the callers' path) opens its own admin connection at its first batch: let it
    # happen in the warm-up (a loaded CI run once saw it, with its AdminHello, among the N).
    until(counts, "EndInvocations", 1)
    counts.clear()
    run(rt, N)
    assert counts["connections accepted"] == 0, sorted(counts.items())


def test_a_warm_invocation_sends_these_daemon_messages_and_no_hello_lease_or_sync(counted: Any) -> None:
    """Per invocation exactly: a Bind for each of its four tasks on the data plane (the request's input
    put, gen, red, the result's get), which carries the slab of the ones that put; a Get for each read;
    a one-way Unbind when each ends. No Hello, Lease or Sync (before: 4, 3 and 3 of them). (Opening and
    ending the data-plane invocation are the admin's, counted apart.)"""
    rt, counts = counted
    run(rt, 3)
    until(counts, "Unbind (one-way)", 4 * 3)
    until(counts, "EndInvocations", 1)  # the ender's own connection (and its AdminHello): before the N
    counts.clear()
    run(rt, N)
    until(counts, "Unbind (one-way)", 4 * N)
    admin = ("OpenInvocation", "EndInvocation", "EndInvocations", "QueueHint", "QueueState")
    per = {k: v / N for k, v in counts.items() if k not in admin}
    assert per == {"Bind": 4.0, "Get": 3.0, "Unbind (one-way)": 4.0}, per
    assert counts["OpenInvocation"] == N


def test_a_reply_that_overtakes_its_dispatch_still_unbinds(counted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread that sends a task may be descheduled before it hears back from ``send_task``, while
    the loop thread already has the task's reply. The binding must end all the same (it used to be
    recorded only once ``send_task`` returned: the reply found none, no Unbind was sent, and the worker's
    connection kept the finished task's credentials). Here every dispatch pauses after its send."""
    from gfaas.runtime.worker import ProcessWorker

    rt, counts = counted
    run(rt, 3)
    until(counts, "Unbind (one-way)", 4 * 3)
    real = ProcessWorker.send_task

    def slow(self: ProcessWorker, task: Any) -> bool:
        bound = real(self, task)
        time.sleep(0.05)
        return bound

    monkeypatch.setattr(ProcessWorker, "send_task", slow)
    counts.clear()
    run(rt, 10)
    until(counts, "Unbind (one-way)", 4 * 10)
    assert counts["Bind"] == counts["Unbind (one-way)"] == 40, dict(counts)
