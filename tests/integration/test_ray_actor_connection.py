"""A Ray actor on a gfaas node's Ray node (GFAAS_NODE_SOCKET and GFAAS_NODE_STATE_DIR in its environment)
keeps one attached connection to the machine's daemon and binds it per task: no connection, Hello or
close per task. The actor body is a plain class: run here without Ray, with ``connect`` made to fail,
so a task that opened a connection of its own fails."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import gfaas
from gfaas.dataplane.local import LocalNode
from gfaas.runtime import ray_executor as R
from gfaas.runtime.worker import Done, Init, Task, _dec, _enc

SPEC = """
name: wf
inputs: {x: null}
outputs: {y: f.y}
functions:
  - {name: f, kind: cpu, handler: "rt_handlers:negate", inputs: {x: input.x}, outputs: {y: null}}
"""


class _NoCapture:
    def install(self) -> None: ...
    def begin(self) -> None: ...
    def take(self) -> tuple[()]:
        return ()


@pytest.fixture
def node(run_dir: str, rt_handlers: str) -> Iterator[tuple[gfaas.NodeConfig, Any]]:
    cfg = gfaas.NodeConfig(node_id="n", socket_path=os.path.join(run_dir, "n.sock"),
                           state_dir=os.path.join(run_dir, "state"))
    with LocalNode(cfg), gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as admin:
        yield cfg, admin


def _actor(cfg: gfaas.NodeConfig, monkeypatch: pytest.MonkeyPatch, env: bool) -> R.FunctionActor:
    monkeypatch.setattr(R, "Capture", _NoCapture)
    if env:
        monkeypatch.setenv(R.NODE_SOCKET_ENV, cfg.socket_path)
        monkeypatch.setenv(R.NODE_STATE_ENV, cfg.state_dir)
    else:
        monkeypatch.delenv(R.NODE_SOCKET_ENV, raising=False)
    return R.FunctionActor(_enc.encode(Init("wf", "f", SPEC, transport={"kind": "gfaas",
                                                                        "socket_path": cfg.socket_path})))


def _task(admin: Any, x: np.ndarray) -> tuple[bytes, Any]:
    inv = admin.open_invocation("wf", ["f", "gateway"])
    with gfaas.connect(inv.credentials("gateway")) as gw:
        ref = str(gw.put(x, consumers=["f"]))
    return _enc.encode(Task(inv.id, inv.tokens["f"], {"x": ref}, ["x"], {"y": ["gateway"]})), inv


def test_tasks_on_a_gfaas_node_use_the_actors_attached_connection(node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, admin = node
    actor = _actor(cfg, monkeypatch, env=True)
    assert actor.attached is not None

    def no_connect(*a: Any, **k: Any) -> Any:
        raise AssertionError("the task opened a daemon connection of its own")

    monkeypatch.setattr(gfaas.dataplane.client, "connect", no_connect)
    for k in range(3):  # each task's credentials in turn on the same connection
        x = np.arange(50_000, dtype=np.float64) + k
        task, inv = _task(admin, x)
        reply = _dec.decode(actor.run(task))
        assert isinstance(reply, Done), reply
        monkeypatch.undo()  # (the gateway's side reads the result with its own connection)
        with gfaas.connect(inv.credentials("gateway")) as gw:
            np.testing.assert_array_equal(gw.get(reply.outputs["y"]), -x)
        monkeypatch.setattr(R, "Capture", _NoCapture)
        monkeypatch.setattr(gfaas.dataplane.client, "connect", no_connect)
        admin.end_invocation(inv.id)


def test_without_the_nodes_environment_each_task_connects_as_before(node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, admin = node
    actor = _actor(cfg, monkeypatch, env=False)
    assert actor.attached is None
    x = np.arange(50_000, dtype=np.float64)
    task, inv = _task(admin, x)
    reply = _dec.decode(actor.run(task))
    assert isinstance(reply, Done), reply
    with gfaas.connect(inv.credentials("gateway")) as gw:
        np.testing.assert_array_equal(gw.get(reply.outputs["y"]), -x)
