"""The serving loop during scale-out, on the in-process executor (no namespaces, no processes)."""

from __future__ import annotations

import pytest

from gfaas.errors import ProtocolError
from gfaas.models.llm import LlamaModel, preset
from gfaas.policy.multicast import plan
from gfaas.scaling.inprocess import InProcessManager
from gfaas.scaling.serving import Server
from gfaas.scaling.warm import warm_orders
from gfaas.scaling.workload import Request

NODES, BLOCKS = 8, 4


def _requests(n: int) -> list[Request]:
    return [Request(i, 0.0, tuple((11 * i + 3 * j) % 96 for j in range(3 + i % 5)), 4 + i % 4) for i in range(n)]


@pytest.fixture(scope="module")
def reference() -> dict[int, list[int]]:
    model = LlamaModel(preset("tiny"), 0)
    return {r.rid: model.generate(r.prompt, r.gen) for r in _requests(24)}


@pytest.mark.parametrize(("system", "scheme"), [("gfaas", "binomial"), ("tree", "tree"),
                                                ("load-then-serve", "sequential")])
def test_tokens_equal_one_process_run(system: str, scheme: str, reference: dict[int, list[int]]) -> None:
    """Every system serves every request with the tokens of a one-process run."""
    mgr = InProcessManager(NODES, "tiny", BLOCKS, sources=2)
    res = Server(mgr, system, _requests(24), local_capacity=1).run(plan(NODES, BLOCKS, 2, scheme))
    assert res.tokens == reference
    assert sorted(res.ttft_s) == list(range(24))


def test_gfaas_forms_pipelines_then_moves_requests_to_local_nodes(reference: dict[int, list[int]]) -> None:
    """With 2 sources, the destinations holding complementary halves form 2-stage pipelines, which
    retire as their nodes go local; requests in flight move there with their KV caches."""
    mgr = InProcessManager(NODES, "tiny", BLOCKS, sources=2)
    sched = plan(NODES, BLOCKS, 2, "binomial")
    res = Server(mgr, "gfaas", _requests(24), local_capacity=1).run(sched)
    pipes = [nodes for _, kind, nodes in res.instances if kind == "pipeline"]
    retired = [nodes for _, kind, nodes in res.instances if kind == "retired"]
    local = sorted(nodes[0] for _, kind, nodes in res.instances if kind == "local")
    assert pipes and all(len(p) == 2 for p in pipes)
    assert sorted(retired) == sorted(pipes)  # every pipeline retires once its nodes are loaded
    assert local == list(range(NODES))
    assert res.migrations > 0
    assert res.hidden_hops > 0  # passes whose last stage got the hidden states from another node
    assert res.tokens == reference


def test_baselines_serve_only_from_whole_models() -> None:
    """Tree and load-then-serve bring a node up only when it holds every block: no pipelines."""
    for system, scheme in (("tree", "tree"), ("load-then-serve", "sequential")):
        mgr = InProcessManager(NODES, "tiny", BLOCKS, sources=2)
        res = Server(mgr, system, _requests(6)).run(plan(NODES, BLOCKS, 2, scheme))
        assert {kind for _, kind, _ in res.instances} == {"local"}
        assert res.migrations == 0


def test_warm_scale_out_forms_pipelines_while_loading(reference: dict[int, list[int]]) -> None:
    """Warm nodes load in rotated block orders (one block per step here): with gfaas they form
    pipelines of partly loaded nodes before any holds the whole model; warm-then-serve waits for
    whole models; both produce the one-process tokens."""
    assert warm_orders(6, 4) == [[0, 1, 2, 3], [0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1], [2, 3, 0, 1], [3, 0, 1, 2]]
    warm = list(range(2, NODES))
    res = Server(InProcessManager(NODES, "tiny", BLOCKS, sources=2), "gfaas", _requests(24),
                 local_capacity=1).run_warm(warm, 2, 1e9)
    first_local = next(i for i, (_, kind, nodes) in enumerate(res.instances) if kind == "local" and nodes[0] >= 2)
    pipes = [nodes for _, kind, nodes in res.instances[:first_local] if kind == "pipeline"]
    assert pipes and all(set(p) <= set(warm) for p in pipes)
    assert sorted(n[0] for _, kind, n in res.instances if kind == "local") == list(range(NODES))
    assert res.hidden_hops > 0 and res.tokens == reference
    base = Server(InProcessManager(NODES, "tiny", BLOCKS, sources=2), "load-then-serve", _requests(24),
                  local_capacity=1).run_warm(warm, 2, 1e9)
    assert {kind for _, kind, _ in base.instances} == {"local"} and base.tokens == reference


def test_hidden_states_run_only_as_announced() -> None:
    """A stage runs a previous stage's hidden states only if the manager announced them: the right
    request, step and blocks, from the right node, with the announced rows x width; otherwise it
    refuses them and nothing runs."""
    mgr = InProcessManager(2, "tiny", 2, sources=2)
    mgr.start_multicast(plan(2, 2, 2, "binomial"))
    while mgr.poll_event(0) is not None:  # both nodes are sources: only their "done" events
        pass
    n1 = mgr.nodes[1]
    n1.hidden_wait_s = 0.0
    dim = mgr.cfg.dim
    ok = {"rid": 5, "step": 0, "first": 1, "rows": 3}
    n1.fwd({"rid": 5, "step": 0, "first": 1, "last": 1, "prev": 0, "rows": 3}, memoryview(b""))
    bad = [
        (0, {**ok, "rid": 6}, 3, "not told to expect"),
        (0, {**ok, "step": 1}, 3, "not told to expect"),
        (0, {**ok, "first": 0}, 3, "not told to expect"),
        (0, {**ok, "rows": 2}, 2, "expected 3 x"),
        (0, ok, 4, "expected 3 x"),
    ]
    for peer, meta, rows, why in bad:
        with pytest.raises(ProtocolError, match=why):
            n1._on_hidden(peer, meta, bytes(rows * dim * 4))
        n1.fwd({"rid": 5, "step": 0, "first": 1, "last": 1, "prev": 0, "rows": 3}, memoryview(b""))
    with pytest.raises(ProtocolError, match="from node 0"):
        n1._on_hidden(1, ok, bytes(3 * dim * 4))  # the announced sender is node 0
    n1.fwd({"rid": 5, "step": 0, "first": 1, "last": 1, "prev": 0, "rows": 3}, memoryview(b""))
    assert mgr.poll_event(0) is None  # nothing ran
    n1._on_hidden(0, ok, bytes(3 * dim * 4))
    ev = mgr.poll_event(0)
    assert ev is not None and ev[0] == 1 and ev[1].kind == "out"
    assert ev[1].meta["rid"] == 5 and ev[1].meta["via"] == 0 and len(ev[1].payload) == 8


@pytest.mark.parametrize("argv", [["scale", "demo"], ["bench", "scale", "--json"]])
def test_cli_without_root_says_how_to_run(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Without root the scale demo and bench exit with 2 and print the sudo command; nothing is built."""
    from gfaas.cli import main

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "network namespaces need root" in err and "sudo " in err and " -m gfaas " in err
