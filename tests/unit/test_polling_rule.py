"""When a waiting thread polls before it sleeps (policy.polling), against the rule's cases. The reply
loop that applies the invoker's rule is tested in test_reply_loop.py."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.policy.polling import MAX_POLL_US, PROBE_EVERY, invoker_polls, worker_poll_s, worker_wait
from gfaas.runtime.config import RuntimeConfig

pytestmark = pytest.mark.timeout(60)


def test_the_worker_rule_case_by_case() -> None:
    w = 300e-6
    assert worker_poll_s(w, 2, None) == w  # no gap seen yet: poll
    assert worker_poll_s(w, 2, 50e-6) == w  # tasks close together
    assert worker_poll_s(w, 2, w) == w  # at the window's edge still
    assert worker_poll_s(w, 2, 2 * w) == 0.0  # sparse: sleep at once
    assert worker_poll_s(w, 1, 50e-6) == 0.0  # one core: the sender needs it
    assert worker_poll_s(0.0, 16, 0.0) == 0.0  # switched off
    assert worker_poll_s(w, 16, 50e-6, light=False) == 0.0  # its last task used the data plane
    # slept at once PROBE_EVERY - 1 times in a row: the next wait polls, to measure the gap awake
    assert [worker_poll_s(w, 2, 2 * w, slept=k) for k in range(PROBE_EVERY)] == [0.0] * (PROBE_EVERY - 1) + [w]


@given(st.floats(0, 0.01), st.integers(1, 256), st.none() | st.floats(0, 1), st.booleans(), st.integers(0, 100))
def test_a_worker_polls_its_whole_window_or_not_at_all(window: float, cores: int, gap: float | None,
                                                       light: bool, slept: int) -> None:
    got = worker_poll_s(window, cores, gap, light, slept)
    assert got in (0.0, window)
    assert got == 0.0 or (light and cores >= 2 and (gap is None or gap <= window or slept + 1 >= PROBE_EVERY))


@given(st.floats(0, 0.01), st.integers(1, 64), st.integers(0, 100), st.integers(0, 100), st.booleans())
def test_the_invoker_polls_for_a_lone_light_invocation_only(window: float, cores: int, unresolved: int, out: int,
                                                            light: bool) -> None:
    assert invoker_polls(window, cores, unresolved, out, light) == (
        window > 0 and cores >= 2 and unresolved == 1 and out > 0 and light)


@pytest.mark.parametrize("bad", [-1, MAX_POLL_US + 1, 1.5, True, "300"])
def test_a_bad_window_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"poll_us=.*microseconds"):
        RuntimeConfig(poll_us=bad)


def test_a_worker_that_sleeps_because_of_the_gap_probes_every_few_waits() -> None:
    """The worker's loop (worker_wait): with every gap over the window it polls on every
    PROBE_EVERY-th wait only; a gap within the window, a heavy task or one core resets the count."""
    w, slept, polled = 300e-6, 0, []
    for _ in range(2 * PROBE_EVERY):
        poll_s, slept = worker_wait(w, 2, 2 * w, True, slept)
        polled.append(poll_s)
    assert polled == ([0.0] * (PROBE_EVERY - 1) + [w]) * 2
    assert worker_wait(w, 2, 50e-6, True, 5) == (w, 0)  # tasks close again: polls, count reset
    assert worker_wait(w, 2, 2 * w, False, 5) == (0.0, 0)  # a heavy task: sleeps, not for the gap
    assert worker_wait(w, 1, 2 * w, True, 5) == (0.0, 0)  # one core: never polls, never counts
