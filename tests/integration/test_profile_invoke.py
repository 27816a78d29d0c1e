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
