"""An output whose node dies before it is read fails its invocation naming that node.

A node killed right after a function stored its output there can die before it published the object
in the directory; the node the gateway reads through then finds no such object and answers "access
denied" (it tells nothing about IDs it does not know). The runtime probes the node that held the
output (read by the gateway, or by the next function) and, when it no longer answers, says so instead (the cluster test kills a machine for real:
tests/integration/test_cluster_ray.py). Here the denial and the dead node are stood in for."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gfaas.dataplane.ids import DataRef
from gfaas.dataplane.store import DENIED_MESSAGE
from gfaas.errors import AccessDenied
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

pytestmark = pytest.mark.timeout(120)

SPEC = """
name: big
inputs: {n: {dtype: int64, shape: []}}
outputs: {x: gen.x}
functions:
  - {name: gen, kind: cpu, handler: "gfaas.workflows.tiny:gen", inputs: {n: input.n},
     outputs: {x: {dtype: float32, shape: [-1]}}}
"""
N = 100_000  # 400 kB: over inline_max_bytes, so stored on the node and read back by the gateway


class _Denying:
    """The gateway's transport, its reads refused as a node that never heard of the object refuses them."""

    def __init__(self, real: Any, seen: list[str]) -> None:
        self.real, self.seen = real, seen

    def get(self, ref: str, *a: Any, **k: Any) -> Any:
        self.seen.append(ref)
        raise AccessDenied(DENIED_MESSAGE)

    def close(self) -> None:
        self.real.close()


@pytest.mark.parametrize("node_down", [True, False])
def test_a_denied_output_read_names_the_node_that_stopped_answering(node_down: bool) -> None:
    with LocalRuntime(RuntimeConfig(queue_hints=False)) as rt:
        rt.deploy(SPEC)
        inv = rt.invoker
        refs: list[str] = []
        probed: list[str] = []
        real_transport = inv._gateway_transport
        inv._gateway_transport = lambda i: _Denying(real_transport(i), refs)  # type: ignore[method-assign]
        rt.nodes.check = probed.append  # type: ignore[method-assign]
        up = rt.nodes.cluster.up
        rt.nodes.cluster.up = lambda node: up(node) and not (node_down and node in probed)  # type: ignore[method-assign]
        res = rt.invoke("big", {"n": np.asarray(N, dtype=np.int64)}, timeout=60)
    assert not res.ok and len(refs) == 1
    holder = rt.nodes.cluster.node_ids.get(DataRef.parse(refs[0]).node, DataRef.parse(refs[0]).node)
    assert probed == [holder]  # the node that held it, probed once
    assert DENIED_MESSAGE in str(res.error)
    if node_down:
        assert f"node {holder}, which held them, stopped answering and they were lost" in str(res.error), res.error
    else:  # the node answers: a denial is what it is
        assert res.error == f"collecting the outputs failed: {DENIED_MESSAGE}"


CHAIN = """
name: pair
inputs: {n: {dtype: int64, shape: []}}
outputs: {y: use.y, x: gen.x}  # gen.x read twice: stored, not handed over in a chain
functions:
  - {name: gen, kind: cpu, handler: "gfaas.workflows.tiny:gen", inputs: {n: input.n},
     outputs: {x: {dtype: float32, shape: [-1]}}}
  - {name: use, kind: cpu, handler: "rt_handlers:denied", inputs: {x: gen.x}, outputs: {y: null}}
"""


@pytest.mark.usefixtures("rt_handlers")
@pytest.mark.parametrize("node_down", [True, False])
def test_a_function_denied_its_input_names_the_node_that_held_it(node_down: bool) -> None:
    with LocalRuntime(RuntimeConfig(queue_hints=False)) as rt:
        rt.deploy(CHAIN)
        probed: list[str] = []
        rt.nodes.check = probed.append  # type: ignore[method-assign]
        up = rt.nodes.cluster.up
        rt.nodes.cluster.up = lambda node: up(node) and not (node_down and node in probed)  # type: ignore[method-assign]
        res = rt.invoke("pair", {"n": np.asarray(N, dtype=np.int64)}, timeout=60)
    assert not res.ok and res.failure is not None and res.failure.error == "AccessDenied"
    assert len(probed) == 1  # the node holding gen.x, probed once
    assert DENIED_MESSAGE in str(res.error)
    lost = f"(node {probed[0]}, which held its inputs, stopped answering and they were lost with it"
    assert (lost in str(res.error)) is node_down, res.error
