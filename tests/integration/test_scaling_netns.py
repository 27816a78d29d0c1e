"""Real block multicast between node processes in network namespaces on rate-limited links.

Four nodes of the ``small`` model (4 blocks of 0.7-1.2 MB) at 40 Mbit/s per port: every transfer
takes 0.15-0.25 s, so the links, not the CPUs, set the pace.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from gfaas.models.llm import preset
from gfaas.policy.multicast import plan
from gfaas.scaling.manager import Manager
from gfaas.scaling.netns import Testbed, list_namespaces
from gfaas.scaling.reference import reference_tokens
from gfaas.scaling.serving import Server
from gfaas.scaling.workload import Request

pytestmark = [pytest.mark.netns, pytest.mark.root, pytest.mark.timeout(90)]

NODES, BLOCKS, RATE = 4, 4, 40.0


@pytest.fixture(scope="module")
def manager() -> Iterator[Manager]:
    with Testbed(NODES, RATE) as bed, Manager(bed, "small", BLOCKS, sources=2, floor_s=0.03) as m:
        yield m
    assert list_namespaces(bed.hub[:-1]) == []


def _expected_log(scheme: str) -> list[tuple[int, int, int, int]]:
    sched = plan(NODES, BLOCKS, 1, scheme)
    return sorted((t, tr.src, tr.dst, tr.block) for t, step in enumerate(sched.steps) for tr in step)


def test_blocks_follow_the_plan(manager: Manager) -> None:
    """Every transfer the senders log is the schedule's, and every destination accepts every block
    (header checked and SHA-256 equal to the source's copy) from the node and at the step planned."""
    sched = plan(NODES, BLOCKS, 1, "binomial")
    res = manager.multicast(sched)
    assert res.transfers == _expected_log("binomial")
    got = sorted((node, step, blk, src) for node, blk, src, step, _ in res.arrivals)
    want = sorted((tr.dst, t, tr.block, tr.src) for t, step in enumerate(sched.steps) for tr in step)
    assert got == want
    assert res.refused == []


def test_multicast_time_is_network_bound(manager: Manager) -> None:
    """Measured time is close to the schedule's bound at the link rate (each step as long as its
    largest block takes), for the binomial pipeline and the tree in the same run, and the nodes'
    CPU time is a small part of the wall time."""
    ratios = {}
    for scheme in ("binomial", "tree"):
        res = manager.multicast(plan(NODES, BLOCKS, 1, scheme))
        assert res.transfers == _expected_log(scheme)
        ratios[scheme] = res.seconds / res.bound_seconds
        assert res.cpu_s < 0.5 * res.seconds * NODES, (scheme, res.cpu_s, res.seconds)
    assert 0.7 < ratios["binomial"] < 1.5, ratios
    assert 0.7 < ratios["tree"] < 1.5, ratios


def test_garbled_blocks_are_refused_and_repaired(manager: Manager) -> None:
    """A block with a flipped header byte and one with a flipped weight byte are refused (the header
    check and the digest catch them), pulled again from the source, and every node completes."""
    sched = plan(NODES, BLOCKS, 1, "binomial")
    first = sched.steps[0][0]  # 0 -> 1, block 0
    later = next(tr for t, step in enumerate(sched.steps) for tr in step if tr.src != 0 and t >= 2)
    later_step = next(t for t, step in enumerate(sched.steps) if later in step)
    res = manager.multicast(sched, garble={0: [(0, "header")], later.src: [(later_step, "data")]})
    refused = sorted((e["node"], e["block"], e["src"]) for e in res.refused)
    assert refused == sorted([(first.dst, first.block, 0), (later.dst, later.block, later.src)])
    msgs = {(e["node"], e["block"]): e["message"] for e in res.refused}
    assert msgs[(first.dst, first.block)] == f"packed block 0 is from a split into {BLOCKS + 1} blocks, expected {BLOCKS}"
    assert msgs[(later.dst, later.block)] == f"block {later.block} does not match its SHA-256"
    held = {(node, blk) for node, blk, *_ in res.arrivals}
    assert held == {(n, b) for n in range(1, NODES) for b in range(BLOCKS)}
    repaired = sorted((node, blk) for node, blk, src, step, _ in res.arrivals if step == -1)
    assert repaired == sorted([(first.dst, first.block), (later.dst, later.block)])


def test_failed_setup_leaves_no_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A testbed whose set-up fails half-way deletes the namespaces it already made."""
    bed = Testbed(3, 10.0)
    calls = []

    def fail_on_second(ns: str, dev: str) -> None:
        calls.append(dev)
        if len(calls) == 2:
            raise subprocess.CalledProcessError(1, "tc")

    monkeypatch.setattr(bed, "_shape", fail_on_second)
    with pytest.raises(subprocess.CalledProcessError):
        bed.__enter__()
    assert list_namespaces(bed.hub[:-1]) == []


def test_serving_during_scale_out_matches_one_process(manager: Manager) -> None:
    """Requests served during a 2-source binomial scale-out -- first by the sources, then by an
    execution pipeline over the two half-loaded destinations, then, with their KV caches carried
    over, by local execution -- produce the tokens of a one-process run."""
    reqs = [Request(i, 0.05 * i, tuple((7 * i + j) % 1000 for j in range(5 + i % 7)), 10 + i % 5) for i in range(16)]
    res = Server(manager, "gfaas", reqs, local_capacity=1).run(plan(NODES, BLOCKS, 2, "binomial"))
    kinds = [(kind, nodes) for _, kind, nodes in res.instances]
    # Nodes 2 and 3 receive their last block in the same step: either may go local first.
    assert kinds[:3] == [("local", (0,)), ("local", (1,)), ("pipeline", (2, 3))]
    assert kinds[3] in {("retired", (2, 3))}
    assert sorted(kinds[4:]) == [("local", (2,)), ("local", (3,))]
    assert res.migrations > 0, res
    assert res.hidden_hops > 0, res  # the pipeline's stage 1 got stage 0's hidden states over the link
    assert res.tokens == reference_tokens(preset("small"), 0, reqs)


def test_warm_start_restores_from_host_memory(manager: Manager) -> None:
    """After a completed scale-out every node keeps the model in its host-memory cache, and a warm
    start restores it there without a byte on the links: all hits, far faster than the multicast."""
    res = manager.multicast(plan(NODES, BLOCKS, 1, "binomial"))
    seconds, hits = manager.warm_start(range(1, NODES))
    assert hits == dict.fromkeys(range(1, NODES), True)
    assert seconds < res.seconds / 4, (seconds, res.seconds)


def test_warm_nodes_join_pipelines_while_they_load(manager: Manager) -> None:
    """A warm scale-out: nodes 2 and 3 copy the model from their host caches at an emulated
    host-to-device rate in complementary block orders; they serve as a 2-stage pipeline (hidden
    states over the link) once they hold complementary halves, go local when loaded, and every
    token equals a one-process run."""
    manager.multicast(plan(NODES, BLOCKS, 2, "binomial"))  # fills the destinations' warm caches
    reqs = [Request(i, 0.03 * i, tuple((5 * i + j) % 1000 for j in range(4 + i % 5)), 10 + i % 4) for i in range(12)]
    rate = sum(manager.sizes) / 1.2  # the whole model in 1.2 s per node
    res = Server(manager, "gfaas", reqs, local_capacity=1).run_warm([2, 3], 2, rate)
    kinds = [(kind, nodes) for _, kind, nodes in res.instances]
    assert kinds[:3] == [("local", (0,)), ("local", (1,)), ("pipeline", (2, 3))], kinds
    assert sorted(kinds[3:]) == [("local", (2,)), ("local", (3,)), ("retired", (2, 3))], kinds
    t_pipe = next(t for t, kind, _ in res.instances if kind == "pipeline")
    assert 0.3 < t_pipe < 1.0 < res.multicast_s, (t_pipe, res.multicast_s)  # at half the load, before the end
    assert res.hidden_hops > 0
    assert res.tokens == reference_tokens(preset("small"), 0, reqs)


_INTRUDER = r"""
import os, socket, sys
from gfaas.dataplane.peer_auth import PeerKey
from gfaas.scaling import frames as F
ip, me, to = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection((ip, 7400), timeout=5)
f = s.makefile("rb")
nonce = os.urandom(32)
F.send_frame(s, "hello", {"node": me, "to": to, "nonce": nonce.hex(), "purpose": "blocks", "run": 0})
ch = F.read_frame(f, 0)
wrong = PeerKey(b"x" * 32)
F.send_frame(s, "proof", {"proof": wrong.proof("client", str(me), str(to), nonce,
                                               bytes.fromhex(ch.meta["nonce"])).hex()})
try:
    F.send_frame(s, "blk", {"block": 0, "step": 0}, b"\0" * 64)
    print("closed" if s.recv(1) == b"" else "open", flush=True)
except (BrokenPipeError, ConnectionResetError):  # the node closed it before the block went out
    print("closed", flush=True)
"""


def test_peer_without_the_cluster_key_is_refused(manager: Manager) -> None:
    """A process in node 1's namespace that claims to be node 1 but lacks the cluster key is cut off
    after its proof, the node logs why, and the next multicast still completes bit-exact."""
    import sys

    bed = manager.bed
    out = subprocess.run([*bed.exec_argv(1), sys.executable, "-c", _INTRUDER, bed.ips[2], "1", "2"],
                         capture_output=True, text=True, timeout=20)
    assert out.stdout.strip() == "closed", out.stderr
    res = manager.multicast(plan(NODES, BLOCKS, 1, "binomial"))  # also collects the nodes' logs
    assert res.transfers == _expected_log("binomial") and res.refused == []
    assert any("peer claiming node 1 failed the cluster-key proof" in str(e.get("message"))
               for e in manager.logs if e["node"] == 2), manager.logs
