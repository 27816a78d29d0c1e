"""``benchmarks/profile_invoke.py`` replays a worker's loop in process to count its Python calls
(``python_calls_per_invocation`` of ``profile-after-cpu.json``): it must drive a task and its chain the
way ``worker._serve`` does, or the committed profile stops being reproducible (it once lagged behind
``worker._follow``'s signature)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_call_count_replays_the_worker_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import profile_invoke  # type: ignore[import-not-found]

    got = profile_invoke._python_calls(5)
    assert got["runtime_total"] > 0, got
    # tiny's red runs in gen's worker (a chain), so one worker serves both and counts both
    assert list(got["workers"]) == ["worker of gen"] and got["workers"]["worker of gen"] > 0, got


def test_the_timeline_splits_the_workers_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker reports its loop's own time (Done.busy_s); the timeline divides the round trip into
    that (handlers plus their framework) and the hops, each part positive and inside the round trip."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import profile_invoke

    doc = profile_invoke.timeline(20)
    split = doc["round_trip_split"]
    trip = next(s["p50_ms"] for s in doc["steps"] if s["step"] == "gen_reply")
    assert 0 < split["handlers_p50_ms"] < split["worker_loop_p50_ms"], split
    assert split["worker_framework_p50_ms"] > 0 and split["hops_p50_ms"] > 0, split
    assert split["worker_loop_p50_ms"] < trip * 1.5, (split, trip)  # medians of differences, not exact sums
    # The replay (the same task again, nothing else on the caller's side) does less than an invocation
    assert 0 < doc["replay"]["p50_ms"] < doc["wall_ms"]["p50"], (doc["replay"], doc["wall_ms"])


def test_the_message_count_runs_on_this_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """``count`` (docs/performance.md runs it) wraps the runtime's parts by name: it must find them
    where the split runtime keeps them (it once wrapped a LocalRuntime method that had moved). A tiny
    invocation costs one task to its worker (a chain) and no message to the node daemon."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import profile_invoke

    doc = profile_invoke.count(40, concurrency=4)
    per = doc["per_invocation"]
    assert per["worker Task -> Done round trip"] == 1.0, per
    assert per["daemon connections accepted"] == 0 and doc["daemon_us_per_message"] == {}, doc


def test_the_lean_mode_runs_the_lanes_task_and_renders(monkeypatch: pytest.MonkeyPatch) -> None:
    """``lean`` resends the lane's own task (captured from an invocation) with a new ID: its essential
    calls must come back as the chain's replies with the right sum (it checks each), and its block
    must say what the file holds; the invocation, which does more, takes longer than the essential work
    in most blocks (a ratio inside one run, with room for a loaded block)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import hotpath_tables  # type: ignore[import-not-found]
    import profile_invoke

    doc = profile_invoke.lean(60, blocks=3)
    assert len(doc["invoke_p50_us_blocks"]) == len(doc["essential_p50_us_blocks"]) == 3, doc
    assert doc["invoke_over_essential"] > 1.0, doc
    doc["pipe_floor_us"] = 10.0
    doc["provenance"] = {"command": "benchmarks/profile_invoke.py lean --n 60", "commit": "abc1234",
                         "machine": {"cpu_model": "cpu", "cores": 2, "loadavg": [0.5]}}
    text = hotpath_tables.lean(doc)
    assert f"| `LocalRuntime.invoke` | {doc['invoke_p50_us']:.0f} |" in text, text
    assert f"{doc['invoke_over_essential']:.2f}x the essential work" in text, text


def test_the_opcode_count_is_the_same_each_run_and_names_the_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    """``opcodes`` counts what the caller's thread runs: two runs of the same code agree (the reply is
    in before the caller looks, so the poll loop does not vary), and the count is where the lane is."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import profile_invoke

    a, b = profile_invoke.opcodes(10), profile_invoke.opcodes(10)
    assert a["opcodes_per_invocation"] > 500, a
    assert abs(a["opcodes_per_invocation"] - b["opcodes_per_invocation"]) <= 0.02 * a["opcodes_per_invocation"], (a, b)
    assert "Invoker._lane_done" in a["top"] and "Invoker._lane_run" in a["top"], a["top"]
