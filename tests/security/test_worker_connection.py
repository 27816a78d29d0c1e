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
from contextlib import contextmanager
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
def node(support_node: LocalNode) -> LocalNode:
    return support_node  # tests/security/conftest.py


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_a_worker_cannot_use_a_finished_tasks_credentials_on_its_long_lived_connection(
        node: LocalNode, sandbox: str) -> None:
    """After its task ended (its invocation still open), the worker's copy of its connection reads
    nothing: AuthenticationError. In the next invocation's task the same connection gets AccessDenied for
    the first invocation's input, and no token ever reached the worker process."""
    cfg = node.config
    ep = NodeEndpoint("n0", cfg.socket_path, cfg.state_dir)
    # inline_max_bytes=0: the inputs are on the node's data plane, which is what this attack is about
    with LocalRuntime(RuntimeConfig(nodes=(ep,), sandbox=sandbox, workers_per_function=1,  # type: ignore[arg-type]
                                    inline_max_bytes=0)) as rt:
        rt.deploy(LINGERER)
        first = rt.submit("lingerer", {"x": np.arange(4.0)})
        time.sleep(0.9)  # a's task is over and its copy has tried; s still holds the invocation open
        assert rt.status(first) == "running"
        second = rt.invoke("lingerer", {"x": np.arange(3.0)}, timeout=60)
        assert rt.result(first, timeout=60).ok and second.ok, second.error
    report = {k.split(".", 1)[1]: v for k, v in second.scalars.items()}
    assert report == {"after_task": 0.0, "cross": 0.0, "token_seen": 0.0, "same_conn": 1.0}, report



@contextmanager
def _attack_runtime() -> Iterator[LocalRuntime]:
    """A runtime whose workers import the hostile handlers of tests/support (attack_handlers)."""
    support = os.path.join(os.path.dirname(__file__), "..", "support")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.path.abspath(support))
        with LocalRuntime(RuntimeConfig(queue_hints=False)) as rt:
            yield rt


FORGER = """
name: forger
inputs: {x: null}
outputs: {out: f.y}
functions:
  - {name: f, kind: cpu, handler: "attack_handlers:forge_reply", params: {forge: FORGE}, inputs: {x: input.x},
     outputs: {y: null}}
"""


@pytest.mark.parametrize("forge, words", [
    ("undeclared", "function 'f' sent back a value for 'secret', which is not an output anything reads"),
    ("oversized", "function 'f' sent back 100000 bytes for 'y' in its reply, over the 65536 bytes"),
    ("object", "function 'f': output 'y': dtype object is not numeric"),
    ("short", "function 'f': output 'y': 8 bytes where dtype float64 and shape [4] make 32"),
    ("next", "answered Done.next, for a task that had no chain, to f's task (its control channel is out of step)"),
    ("lost", "function 'f' sent back neither a value nor a reference for its output 'y', which 'gateway' reads"),
])
def test_a_forged_reply_with_bad_values_is_refused(forge: str, words: str, rt_handlers: str) -> None:
    """Function code can write to its worker's socket to the runtime: a reply it makes up, carrying a
    value for an undeclared output, one too large to carry, an object dtype or bytes that do not fit
    its shape, fails its own invocation with what is wrong, and the runtime keeps serving."""
    import time

    with _attack_runtime() as rt:
        rt.deploy(FORGER.replace("FORGE", forge))
        res = rt.invoke("forger", {"x": np.arange(3.0)}, timeout=60)
        assert res.status == "failed" and words in (res.error or ""), res.error
        time.sleep(0.3)  # the worker's real reply comes after the forged one: it finds no task
        assert rt.status(res.invocation_id) == "failed"
        again = rt.invoke("forger", {"x": np.arange(3.0)}, timeout=60)
        assert again.status == "failed" and words in (again.error or "")  # the same refusal, nothing worse


def _forged_in_a_chain(forge: str) -> Any:
    """One invocation of f -> g, a chain (g runs in f's worker right after f), whose f forges ``forge``."""
    spec = FORGER.replace("FORGE", forge).replace("outputs: {out: f.y}", "outputs: {out: g.y}") + (
        '  - {name: g, kind: cpu, handler: "rt_handlers:negate", inputs: {x: f.y}, outputs: {y: null}}\n')
    with _attack_runtime() as rt:
        rt.deploy(spec)
        return rt.invoke("forger", {"x": np.arange(3.0)}, timeout=60)


def test_a_forged_reply_for_a_chains_next_function_is_checked_as_that_functions(rt_handlers: str) -> None:
    """In a chain (gfaas.policy.fusion: g runs in f's worker right after f), the reply f's code makes
    up for g carries a value for an output g does not have: the invocation fails naming g."""
    res = _forged_in_a_chain("next")
    assert res.status == "failed", res.error
    assert "function 'g' sent back a value for 'secret', which is not an output anything reads" in (res.error or "")


def test_a_chains_reply_may_leave_out_only_what_the_functions_that_ran_in_it_read(rt_handlers: str) -> None:
    """A chain's worker keeps back a value that only the chain's functions which ran there read
    (worker._keep_outside). f's code forges a reply that leaves out ``y`` with g never run (no
    Done.next): g would be left without its input, so the invocation fails naming g, not a crash."""
    res = _forged_in_a_chain("lost")
    assert res.status == "failed", res.error
    assert "function 'f' sent back neither a value nor a reference for its output 'y', which 'g' reads" \
        in (res.error or ""), res.error


def test_a_chains_reply_that_leaves_out_what_a_failed_reader_read_fails_the_invocation(rt_handlers: str) -> None:
    """A value handed to the next function in the worker is never stored (worker._holdable), so a reply
    may lack it when that function ran and failed. f's code forges exactly that: the invocation ends
    failed, with the failure it made up; it never ends done, and nothing waits for ``y``."""
    res = _forged_in_a_chain("lost-failed")
    assert res.status == "failed", res.error
    assert "function 'g': made up by f" in (res.error or ""), res.error


def test_a_worker_cannot_get_the_data_plane_as_a_function_it_does_not_run(rt_handlers: str) -> None:
    """A lazy task's NeedData may name a function of its chain (which runs in the same worker); naming
    another function of the invocation, one run by other workers, is refused."""
    spec = """
name: asker
inputs: {x: null}
outputs: {granted: f.y, other: g.y}
functions:
  - {name: f, kind: cpu, handler: "attack_handlers:ask_as", params: {as: g}, inputs: {x: input.x},
     outputs: {y: {shape: []}}}
  - {name: g, kind: cpu, handler: "rt_handlers:negate", inputs: {x: input.x}, outputs: {y: null}}
"""
    with _attack_runtime() as rt:
        rt.deploy(spec)
        res = rt.invoke("asker", {"x": np.arange(3.0)}, timeout=60)
    assert res.ok, res.error
    assert float(res.outputs["granted"]) == 0.0


def test_a_worker_cannot_get_the_data_plane_for_another_invocation(rt_handlers: str) -> None:
    """A lazy task asks for its worker's connection to be bound (NeedData): naming another invocation
    than its own is refused (DataReady not ok), so no credentials but its own ever reach the connection."""
    spec = """
name: asker
inputs: {x: null}
outputs: {granted: f.y}
functions:
  - {name: f, kind: cpu, handler: "attack_handlers:ask_for_another", params: {other: OTHER}, inputs: {x: input.x},
     outputs: {y: {shape: []}}}
"""
    with _attack_runtime() as rt:
        rt.deploy(spec.replace("OTHER", '"0123456789abcdef0123456789abcdef"'))
        res = rt.invoke("asker", {"x": np.arange(3.0)}, timeout=60)
    assert res.ok, res.error
    assert float(res.outputs["granted"]) == 0.0


DESYNC = """
name: desync
inputs: {x: null}
outputs: {pid: f.y}
functions:
  - {name: f, kind: cpu, handler: "attack_handlers:desync", params: {send: SEND}, inputs: {x: input.x},
     outputs: {y: {shape: []}}}
"""


@pytest.mark.parametrize("send, words", [
    ("garbage", "failed: DecodeError"),
    ("ready", "answered Ready to f's task (its control channel is out of step)"),
    ("stop", "answered Stop to f's task (its control channel is out of step)"),
])
def test_a_control_channel_out_of_step_fails_the_call_and_replaces_the_worker(send: str, words: str,
                                                                               rt_handlers: str) -> None:
    """Issue 37 row 7: function code writes undecodable bytes, a Ready or a Stop to its worker's socket to
    the runtime before its reply. The invocation fails at once with what came (before: a Stop left it
    running for ever, and the worker that sent a Ready was kept, its real reply still on the way), the
    worker is replaced, and the next call runs on a new worker."""
    with _attack_runtime() as rt:
        rt.deploy(DESYNC.replace("SEND", send))
        first = rt.invoke("desync", {"x": np.zeros(1)}, timeout=60)
        assert first.ok, first.error
        bad = rt.invoke("desync", {"x": np.ones(1)}, timeout=20)
        assert bad.status == "failed" and words in (bad.error or ""), bad.error
        again = rt.invoke("desync", {"x": np.zeros(1)}, timeout=60)
        assert again.ok, again.error
    assert float(again.outputs["pid"]) != float(first.outputs["pid"])
