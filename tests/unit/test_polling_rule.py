"""When a waiting thread polls before it sleeps (policy.polling), and the reply loop that applies
the invoker's rule: it polls only while the rule says so, for its window after the last reply."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.policy.polling import MAX_POLL_US, PROBE_EVERY, invoker_polls, worker_poll_s
from gfaas.runtime.config import RuntimeConfig
from gfaas.runtime.loop import ReplyLoop

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


class _Worker:
    def __init__(self) -> None:
        self.name = "w"
        self.ours, self.peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ours.setblocking(False)

    def fileno(self) -> int:
        return self.ours.fileno()

    def receive(self) -> Any:
        data = self.ours.recv(1024)
        return data.decode() if data else None


def _sleeps_within(rl: ReplyLoop, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if rl._sleeping:
            return True
        time.sleep(0.001)
    return False


def test_the_loop_polls_while_told_for_its_window_after_each_reply_then_sleeps() -> None:
    """With the rule saying yes, a nudge wakes the sleeping loop, which then stays awake (polling)
    for its window after each reply and sleeps once the window passes with nothing; each reply is
    handled once either way (a timer pending but not due is not something handled: it must not keep
    the loop polling). With the rule saying no, a nudge does not wake it."""
    got: list[str] = []
    lock = threading.Lock()

    def on_message(_w: Any, msg: Any) -> None:
        with lock:
            got.append(msg)

    polling = [False]
    rl = ReplyLoop(on_message, name="gfaas-invoker-test", polls=lambda: polling[0], poll_s=1.0)
    w = _Worker()
    try:
        rl.attach(w)
        rl.call_at(time.monotonic() + 600, lambda: None)  # a timer pending, not due: nothing to handle
        assert _sleeps_within(rl, 5)
        rl.nudge()  # the rule says no: it sleeps on
        time.sleep(0.05)
        assert rl._sleeping
        polling[0] = True
        rl.nudge()
        time.sleep(0.05)
        assert not rl._sleeping  # awake, polling
        w.peer.send(b"one")
        time.sleep(0.1)  # within the window after the reply: still polling
        assert not rl._sleeping and got == ["one"]
        assert _sleeps_within(rl, 5)  # the window passed with nothing: asleep
        w.peer.send(b"two")  # a reply to a sleeping loop is handled all the same
        end = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < end:
            time.sleep(0.005)
        polling[0] = False  # the rule turns: it sleeps at once, without its window
        assert _sleeps_within(rl, 0.5)
    finally:
        rl.close()
        w.ours.close()
        w.peer.close()
    assert got == ["one", "two"]
