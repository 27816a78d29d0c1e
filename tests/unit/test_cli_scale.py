"""``gfaas scale plan``: the JSON schedule, the human summary and bad arguments."""

from __future__ import annotations

import gc
import json
import time

import pytest

from gfaas.cli import main
from gfaas.policy import plan_multicast


def test_plan_json_is_the_anchor_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    """N=4, B=3 as JSON: 4 steps, the anchors' transfers, nothing else on stdout."""
    assert main(["scale", "plan", "--nodes", "4", "--blocks", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"num_steps", "steps"}
    assert doc["num_steps"] == 4 == len(doc["steps"])
    got = [{(t["src"], t["dst"], t["block"]) for t in step} for step in doc["steps"]]
    assert got == [{(0, 1, 0)}, {(0, 2, 1), (1, 3, 0)}, {(0, 1, 2), (2, 3, 1), (3, 2, 0)},
                   {(0, 2, 2), (1, 3, 2), (3, 1, 1)}]


@pytest.mark.parametrize("scheme", ["binomial", "tree", "chain", "sequential"])
def test_plan_json_matches_the_library(scheme: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every scheme with 2 sources: the JSON is the library's schedule."""
    assert main(["scale", "plan", "--nodes", "11", "--blocks", "5", "--sources", "2", "--scheme", scheme,
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == plan_multicast(11, 5, 2, scheme).to_json()


def test_plan_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json: steps, transfers and the scheme's step count in words."""
    assert main(["scale", "plan", "--nodes", "6", "--blocks", "4", "--scheme", "chain"]) == 0
    out = capsys.readouterr().out
    assert "chain multicast of 4 blocks from 1 source(s) to 6 nodes" in out
    assert "steps:      8 (the scheme's count: exactly 8)" in out
    assert "transfers:  20 = (nodes - sources) x blocks" in out


def test_bad_values_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    """Out-of-range values: exit 1 (the CLI's convention for GfaasError) with the value and the fix."""
    assert main(["scale", "plan", "--nodes", "4", "--blocks", "3", "--sources", "5"]) == 1
    assert "sources=5 with nodes=4: pass 1 <= sources <= nodes" in capsys.readouterr().err
    assert main(["scale", "plan", "--nodes", "4", "--blocks", "0"]) == 1
    assert "blocks=0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--nodes", "x", "--blocks", "3"], "argument --nodes: invalid int value: 'x'"),
        (["--blocks", "3"], "the following arguments are required: --nodes"),
        (["--nodes", "4", "--blocks", "3", "--scheme", "ring"], "argument --scheme: invalid choice: 'ring'"),
    ],
)
def test_malformed_arguments_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Malformed arguments: argparse's usage error, exit code 2."""
    with pytest.raises(SystemExit) as exc:
        main(["scale", "plan", *argv])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_thousand_nodes_costs_about_linear_in_transfers(capsys: pytest.CaptureFixture[str]) -> None:
    """N=1000, B=64: (N-1)*B transfers; and printing it costs within a generous factor of 20x
    what 250 nodes do (4x the transfers), i.e. no superlinear blow-up."""
    def run(n: int) -> float:
        # The garbage collector paused while timing: late in a full suite a generation-2 collection
        # walks every object the session holds, and the 64,000-transfer plan triggers several.
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            assert main(["scale", "plan", "--nodes", str(n), "--blocks", "64", "--json"]) == 0
            dt = time.perf_counter() - t0
        finally:
            gc.enable()
        doc = json.loads(capsys.readouterr().out)
        assert sum(len(s) for s in doc["steps"]) == (n - 1) * 64
        return dt

    # Interleaved, best of three each: the first plan of a hypercube size fills per-size caches (a
    # cold 1000-node plan after warm 250-node ones once read 23x), and a busy neighbour slows samples.
    small, big = [], []
    for _ in range(3):
        small.append(run(250))
        big.append(run(1000))
    assert min(big) < 20 * min(small), (small, big)
