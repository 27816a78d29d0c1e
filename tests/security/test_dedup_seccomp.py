"""Issue 37, row 3: function code cannot join page merging behind the runtime's back.

A tenant's process marked 2,048 guessed pages mergeable when another domain's KSM burst started and
had them merged before the first audit, then learned from write timings which guesses the victim
held. A sandboxed worker now runs under a seccomp filter (``gfaas.runtime.seccomp``): the kernel
refuses it, and any process it starts, ``prctl(PR_SET_MEMORY_MERGE)`` always, and
``madvise(MADV_MERGEABLE)`` when its runtime hints no pages; when it does (``dedup`` ``merge`` or
``on``), each such call waits for the runtime's supervisor, which lets through only the worker's own
calls that the node's merge controller admitted (not while another sharing domain merges). Without
the sandbox the same handler marks its pages, so the probe can tell.
"""

from __future__ import annotations

import numpy as np
import pytest

from gfaas.dataplane.local import LocalNode
from gfaas.runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig
from gfaas.runtime.seccomp import _ARCHES, filter_program

pytestmark = pytest.mark.timeout(120)

SPEC = """
name: NAME
inputs: {x: null}
outputs: {out: m.y}
functions:
  - {name: m, kind: cpu, handler: "attack_handlers:mark_mergeable", inputs: {x: input.x},
     outputs: {y: null, madvise: {shape: []}, prctl: {shape: []}, child_madvise: {shape: []},
               merge_hint: {shape: []}}}
"""


@pytest.mark.parametrize("machine", sorted(_ARCHES))
@pytest.mark.parametrize("rule", ["deny", "notify", "allow"])
def test_the_filter_is_well_formed_and_checks_the_abi_first(machine: str, rule: str) -> None:
    prog = filter_program(machine, madvise_mergeable=rule)
    rets = {i for i, (code, *_) in enumerate(prog) if code == 0x06}
    for i, (code, jt, jf, _) in enumerate(prog):
        if code in (0x15, 0x35):  # every jump lands inside the program
            assert i + 1 + jt < len(prog) and i + 1 + jf < len(prog)
    assert prog[0] == (0x20, 0, 0, 4) and prog[1][3] == _ARCHES[machine][0]  # the ABI, before any number
    assert len(prog) - 1 in rets and prog[-2][3] == 0x00050000 | 1 and prog[-3][3] == 0x7FFF0000
    target = prog[11 + prog[10][1]][3]  # where MADV_MERGEABLE goes: allowed, EPERM, or the supervisor
    assert target == {"allow": 0x7FFF0000, "deny": 0x00050000 | 1, "notify": 0x7FC00000}[rule]


@pytest.fixture
def node(support_node: LocalNode) -> LocalNode:
    return support_node  # tests/security/conftest.py


def _probe(node: LocalNode, sandbox: str, dedup: str, names: tuple[str, ...] = ("marker",)) -> list[dict[str, float]]:
    """Run the marking handler once in a workflow of each name (one sharing domain each), in order."""
    cfg = node.config
    ep = NodeEndpoint("n0", cfg.socket_path, cfg.state_dir)
    out = []
    with LocalRuntime(RuntimeConfig(nodes=(ep,), sandbox=sandbox, dedup=dedup)) as rt:  # type: ignore[arg-type]
        for name in names:
            rt.deploy(SPEC.replace("NAME", name))
            res = rt.invoke(name, {"x": np.zeros(2)}, timeout=60)
            assert res.ok, res.error
            out.append({k.split(".", 1)[1]: float(v) for k, v in res.scalars.items()})
    return out


@pytest.mark.root
def test_a_sandboxed_function_cannot_mark_pages_mergeable(node: LocalNode) -> None:
    (got,) = _probe(node, "auto", "off")
    assert got == {"madvise": 1.0, "prctl": 1.0, "child_madvise": 1.0, "merge_hint": 0.0}, got


@pytest.mark.root
def test_with_merge_hints_on_only_the_admitted_workers_own_calls_go_through(node: LocalNode) -> None:
    """The first workflow's worker marks pages, by ``ctx.merge`` or by hand, once the node admitted
    its domain; the process it forks cannot, nor can anything make a whole process mergeable. While
    its worker lives, a second workflow (another domain) is refused every mark: the row-3 attack."""
    victim, attacker = _probe(node, "auto", "merge", ("victim", "attacker"))
    assert victim["madvise"] == 0.0 and victim["child_madvise"] == 1.0 and victim["prctl"] == 1.0, victim
    assert victim["merge_hint"] >= (1 << 20) * 8 - 2 * 4096, victim
    assert attacker == {"madvise": 1.0, "prctl": 1.0, "child_madvise": 1.0, "merge_hint": 0.0}, attacker


@pytest.mark.root
def test_without_the_sandbox_the_same_handler_marks_its_pages(node: LocalNode) -> None:
    (got,) = _probe(node, "none", "off")
    assert got["madvise"] == 0.0 and got["child_madvise"] == 0.0 and got["prctl"] == 0.0, got
