"""A workflow across two hosts made of network namespaces: a node daemon in each, function a on host A,
function b on host B, so the edge a -> b and the result b -> gateway cross the veth through the data plane."""

from __future__ import annotations

import os
import subprocess
from contextlib import ExitStack

import numpy as np
import pytest
from test_cross_node import _config, _redis_in_netns, _two_hosts  # pytest puts this directory on sys.path
from test_runtime_local import SEQ

from gfaas.dataplane.local import LocalNode
from gfaas.runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]


def _netns_of(pid: int) -> str:
    return subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.strip()


def test_workflow_spans_two_namespace_hosts(run_dir: str, rt_handlers: str) -> None:
    with _two_hosts() as (ns_a, ns_b, ip_a, ip_b), _redis_in_netns(ns_a, ip_a, run_dir) as (url, _query), \
            ExitStack() as stack:
        ca, cb = _config(run_dir, "a", url, host=ip_a), _config(run_dir, "b", url, host=ip_b)
        stack.enter_context(LocalNode(ca, netns=ns_a))
        stack.enter_context(LocalNode(cb, netns=ns_b))
        cfg = RuntimeConfig(nodes=(NodeEndpoint("a", ca.socket_path, ca.state_dir, ns_a),
                                   NodeEndpoint("b", cb.socket_path, cb.state_dir, ns_b)),
                            placement={"seq/a": "a", "seq/b": "b"})
        rt = stack.enter_context(LocalRuntime(cfg))
        rt.deploy(SEQ)
        workers = {fn: rt.deployments.pools[f"seq/{fn}"].slots[0] for fn in ("a", "b")}
        assert {fn: _netns_of(w.pid) for fn, w in workers.items()} == {"a": ns_a, "b": ns_b}
        for n in (1, 3 << 20):  # a small object, and one of several 2 MiB chunks
            x = np.arange(n, dtype=np.float64) - 1
            res = rt.invoke("seq", {"x": x}, timeout=60)
            assert res.ok, res.error
            np.testing.assert_array_equal(res.outputs["out"], -2 * x)
        with rt.nodes.lock:
            stats = {k: a.stats() for k, a in rt.nodes.admins.items()}
        assert all(s["invocations"] == 0 for s in stats.values()), stats  # ended on both hosts
    assert not os.path.exists(ca.socket_path)
