"""Issue 14 row 1: function code cannot reach the node's identity or another tenant.

A hostile function (``tests/support/attack_handlers.py``) that knows where the daemon keeps its state
tries to read the admin token and the registry of tokens, the daemon's socket, memory and
environment, another tenant's worker, and to become root again. With the sandbox every probe is
refused; without it (``sandbox="none"``) the same probe reads the state directory, which shows the
probe can tell the two apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gfaas.dataplane.local import LocalNode
from gfaas.runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig

pytestmark = pytest.mark.timeout(120)

VICTIM = """
name: victim
inputs: {x: null}
outputs: {out: v.y}
functions:
  - {name: v, kind: cpu, handler: "attack_handlers:whoami", inputs: {x: input.x}, outputs: {y: null}}
"""


def attacker_spec(params: dict[str, Any]) -> str:
    from attack_handlers import PROBES  # type: ignore[import-not-found]

    outs = ", ".join(f"{k}: {{shape: []}}" for k in PROBES)
    ps = ", ".join(f"{k}: {v!r}" for k, v in params.items())
    return f"""
name: attacker
inputs: {{x: null}}
outputs: {{out: a.y}}
functions:
  - {{name: a, kind: cpu, handler: "attack_handlers:probe", params: {{{ps}}}, inputs: {{x: input.x}},
      outputs: {{y: null, {outs}}}}}
"""


@pytest.fixture
def node(support_node: LocalNode) -> LocalNode:
    return support_node  # tests/security/conftest.py


def run_attack(node: LocalNode, sandbox: str) -> tuple[dict[str, float], tuple[int, int], tuple[int, int]]:
    cfg = node.config
    ep = NodeEndpoint("n0", cfg.socket_path, cfg.state_dir)
    with LocalRuntime(RuntimeConfig(nodes=(ep,), sandbox=sandbox)) as rt:  # type: ignore[arg-type]
        rt.deploy(VICTIM)
        v = rt.invoke("victim", {"x": np.zeros(2)}, timeout=60)
        assert v.ok, v.error
        victim_uid, victim_pid = (int(i) for i in v.outputs["out"])
        assert node.proc is not None
        rt.deploy(attacker_spec({"state_dir": cfg.state_dir, "socket_path": cfg.socket_path,
                                 "daemon_pid": node.proc.pid, "victim_pid": victim_pid,
                                 "victim_uid": victim_uid}))
        a = rt.invoke("attacker", {"x": np.zeros(2)}, timeout=60)
        assert a.ok, a.error
        uid, gid = (int(i) for i in a.outputs["out"])
        probes = {k.split(".", 1)[1]: v for k, v in a.scalars.items()}
        # The victim still works after the attack.
        again = rt.invoke("victim", {"x": np.ones(2)}, timeout=60)
        assert again.ok, again.error
    return probes, (uid, gid), (victim_uid, victim_pid)


@pytest.mark.root
def test_a_sandboxed_function_reaches_neither_the_node_nor_another_tenant(node: LocalNode) -> None:
    """As root, each workflow's workers run under their own uid; every probe is refused."""
    probes, (uid, gid), (victim_uid, _) = run_attack(node, "auto")
    assert uid >= 200000 and gid == uid and victim_uid >= 200000 and victim_uid != uid
    assert probes == {k: 1.0 for k in probes} and len(probes) == 11, probes


@pytest.mark.root
def test_without_the_sandbox_the_same_probe_reads_the_state(node: LocalNode) -> None:
    """sandbox='none': the function runs as root and reads the state directory (the probe works)."""
    probes, (uid, _), _ = run_attack(node, "none")
    assert uid == 0
    assert probes["state_list"] == 0.0 and probes["admin_token"] == 0.0 and probes["become_root"] == 0.0
