"""Issue 23 item 1 against issue 14 row 1: a warm worker keeps one daemon connection across its tasks
(the runtime binds it to each task's credentials and unbinds it when the task ends). A hostile function
(``tests/support/attack_handlers.py: linger``) keeps a copy of that connection and reads its input
again after its task ended, while its invocation is still open; then, serving another invocation,
reads the first one's input; and looks for any token in its process. Each must find nothing.
Before, each task got a fresh connection and its token in the task message, and the copy read the
input after the task (``Located``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gfaas.dataplane.local import LocalNode
from gfaas.runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig

pytestmark = pytest.mark.timeout(120)

LINGERER = """
name: lingerer
inputs: {x: null}
outputs: {out: a.y, slow: s.y}
functions:
  - {name: a, kind: cpu, handler: "attack_handlers:linger", params: {pause_s: 0.4}, inputs: {x: input.x},
     outputs: {y: null, after_task: {shape: []}, cross: {shape: []}, token_seen: {shape: []}, same_conn: {shape: []}}}
  - {name: s, kind: cpu, handler: "attack_handlers:sleep_then_read", params: {seconds: 1.5}, inputs: {x: input.x},
     outputs: {y: null}}
"""


@pytest.fixture
def node(make_config: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalNode]:
    support = os.path.join(os.path.dirname(__file__), "..", "support")
    monkeypatch.syspath_prepend(support)
    monkeypatch.setenv("PYTHONPATH", os.path.abspath(support))
    with LocalNode(make_config()) as n:
        yield n


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_a_worker_cannot_use_a_finished_tasks_credentials_on_its_long_lived_connection(
        node: LocalNode, sandbox: str) -> None:
    """After its task ended (its invocation still open), the worker's copy of its connection reads
    nothing: AuthenticationError. In the next invocation's task the same connection gets AccessDenied for
    the first invocation's input, and no token ever reached the worker process."""
    cfg = node.config
    ep = NodeEndpoint("n0", cfg.socket_path, cfg.state_dir)
    with LocalRuntime(RuntimeConfig(nodes=(ep,), sandbox=sandbox, workers_per_function=1)) as rt:  # type: ignore[arg-type]
        rt.deploy(LINGERER)
        first = rt.submit("lingerer", {"x": np.arange(4.0)})
        time.sleep(0.9)  # a's task is over and its copy has tried; s still holds the invocation open
        assert rt.status(first) == "running"
        second = rt.invoke("lingerer", {"x": np.arange(3.0)}, timeout=60)
        assert rt.result(first, timeout=60).ok and second.ok, second.error
    report = {k.split(".", 1)[1]: v for k, v in second.scalars.items()}
    assert report == {"after_task": 0.0, "cross": 0.0, "token_seen": 0.0, "same_conn": 1.0}, report
