"""runtime.loop.ReplyLoop: the invoker's loop, on its own thread or driven by an asyncio event loop.

``gfaas serve`` hands the loop to the gateway's event loop (``ReplyLoop.adopt``), so replies are
handled on the thread that submits and answers the requests; before the event loop stops it gets its
thread back (``release``). Each way, every reply, posted call, timer and tick runs on the one
thread that drives the loop, and nothing is lost across the hand-overs."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from gfaas.runtime import loop as loop_mod
from gfaas.runtime.loop import ReplyLoop

pytestmark = pytest.mark.timeout(60)


class _Worker:
    """A socket worker: what the test sends on ``peer`` is what the loop reads (None once it closes)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ours, self.peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ours.setblocking(False)

    def fileno(self) -> int:
        return self.ours.fileno()

    def receive(self) -> Any:
        data = self.ours.recv(1024)
        return data.decode() if data else None


class _Seen:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []
        self.cv = threading.Condition()

    def on_message(self, worker: Any, msg: Any) -> None:
        with self.cv:
            self.events.append((threading.current_thread().name, worker.name, msg))
            self.cv.notify_all()

    def note(self, what: str) -> Callable[[], None]:
        def fn() -> None:
            with self.cv:
                self.events.append((threading.current_thread().name, "-", what))
                self.cv.notify_all()
        return fn

    def wait_for(self, n: int, timeout: float = 10.0) -> list[tuple[str, str, Any]]:
        with self.cv:
            assert self.cv.wait_for(lambda: len(self.events) >= n, timeout), self.events
            return list(self.events)


@pytest.fixture(params=["asyncio", "uvloop"])
def aloop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop", reason="uvloop is the gateway's loop where installed")
        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, name="aio", daemon=True)
    t.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    t.join(10)
    loop.close()


def _on(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on ``loop``'s thread and return what it returned."""
    async def call() -> Any:
        return fn()
    return asyncio.run_coroutine_threadsafe(call(), loop).result(10)


def test_on_its_own_thread_replies_posts_and_timers_run_there() -> None:
    seen = _Seen()
    rl = ReplyLoop(seen.on_message, name="gfaas-invoker-test")
    try:
        w = _Worker("w1")
        rl.attach(w)
        w.peer.send(b"one")
        rl.post(seen.note("posted"))
        rl.call_at(time.monotonic() + 0.05, seen.note("timer"))
        got = seen.wait_for(3)
    finally:
        rl.close()
    assert sorted(got) == sorted([("gfaas-invoker-test", "w1", "one"), ("gfaas-invoker-test", "-", "posted"),
                                  ("gfaas-invoker-test", "-", "timer")])


def test_an_adopting_event_loop_handles_everything_on_its_thread_and_gives_it_back(
        aloop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_mod, "TICK_S", 0.05)
    seen = _Seen()
    ticks: list[str] = []
    rl = ReplyLoop(seen.on_message, name="gfaas-invoker-test", tick=lambda: ticks.append(threading.current_thread().name))
    w1, w2 = _Worker("w1"), _Worker("w2")
    try:
        rl.attach(w1)
        w1.peer.send(b"before")
        seen.wait_for(1)
        _on(aloop, lambda: rl.adopt(aloop))
        assert _on(aloop, lambda: rl.on_loop) and not rl.on_loop
        w1.peer.send(b"a")
        rl.attach(w2)  # from another thread, while adopted
        rl.post(seen.note("posted"))
        rl.call_at(time.monotonic() + 0.05, seen.note("timer"))
        seen.wait_for(4)
        w2.peer.send(b"b")
        w2.peer.close()  # its end: reported once, as None
        got = seen.wait_for(6)
        time.sleep(0.2)
        assert "aio" in ticks  # the tick runs on the adopting loop too
        rl.detach(w1)  # from another thread: returns once the loop let go of it
        w1.peer.send(b"unread")
        _on(aloop, rl.release)
        assert not _on(aloop, lambda: rl.on_loop)
        w3 = _Worker("w3")
        rl.attach(w3)
        w3.peer.send(b"after")
        got = seen.wait_for(7)
    finally:
        rl.close()
    assert got[0] == ("gfaas-invoker-test", "w1", "before")
    assert sorted(got[1:6], key=repr) == sorted([("aio", "w1", "a"), ("aio", "-", "posted"), ("aio", "-", "timer"),
                                       ("aio", "w2", "b"), ("aio", "w2", None)], key=repr)
    assert got[6] == ("gfaas-invoker-test", "w3", "after")  # back on a thread of its own
    assert len(got) == 7  # the detached worker's message was never read


def test_closing_while_adopted_does_not_wait_for_a_thread(aloop: asyncio.AbstractEventLoop) -> None:
    seen = _Seen()
    rl = ReplyLoop(seen.on_message)
    _on(aloop, lambda: rl.adopt(aloop))
    t0 = time.monotonic()
    rl.close()  # the server stopped without giving it back
    assert time.monotonic() - t0 < 5


def test_poll_handles_a_waiting_reply_inside_the_callback_that_calls_it(aloop: asyncio.AbstractEventLoop) -> None:
    """The gateway calls ``poll`` after each chunk a connection reads: a reply already in is handled
    there and then, not after the rest of the event loop's round; from any other thread, or with no
    loop adopting it, it does nothing."""
    seen = _Seen()
    rl = ReplyLoop(seen.on_message, name="gfaas-invoker-test")
    w = _Worker("w1")
    try:
        rl.attach(w)
        rl.post(lambda: None)
        _on(aloop, lambda: rl.adopt(aloop))

        def within_one_callback() -> list[Any]:
            w.peer.send(b"r")  # in the socket now, but the event loop runs nothing else until we return
            before = len(seen.events)
            rl.poll()
            return [before, len(seen.events)]

        assert _on(aloop, within_one_callback) == [0, 1]
        gate = threading.Event()
        aloop.call_soon_threadsafe(gate.wait, 10)  # the event loop is busy until the gate opens
        w.peer.send(b"other-thread")
        rl.poll()  # not the adopting thread: a no-op (were it not, the reply would be read here)
        assert len(seen.events) == 1
        gate.set()  # the event loop reads it in its next round
        got = seen.wait_for(2)
    finally:
        rl.close()
    assert [e[1:] for e in got] == [("w1", "r"), ("w1", "other-thread")]
    assert {e[0] for e in got} == {"aio"}


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
    w = _Worker("w")
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


def _counting(rl: ReplyLoop) -> list[str]:
    """The names of the threads that ran a round of the loop (``_once``) from now on."""
    rounds: list[str] = []
    once = rl._once

    def counted(timeout: float) -> bool:
        rounds.append(threading.current_thread().name)
        return once(timeout)

    rl._once = counted  # type: ignore[method-assign]
    return rounds


@contextmanager
def _driven(poll_s: float) -> Iterator[tuple[_Seen, ReplyLoop, _Worker]]:
    """A loop whose rule always says poll, with one worker attached, asleep."""
    seen = _Seen()
    rl = ReplyLoop(seen.on_message, name="gfaas-invoker-test", polls=lambda: True, poll_s=poll_s)
    w = _Worker("w")
    try:
        rl.attach(w)
        assert _sleeps_within(rl, 5)
        yield seen, rl, w
    finally:
        rl.close()
        w.ours.close()
        w.peer.close()


def test_a_caller_that_drives_handles_the_replies_on_its_own_thread_and_the_loop_thread_sleeps() -> None:
    """ReplyLoop.drive: the replies that come while a caller drives are handled on the caller's
    thread, in order, and the loop's thread is not woken by them; the caller stops once its
    ``done`` holds. A reply that comes after it stopped is the loop thread's again."""
    with _driven(poll_s=1.0) as (seen, rl, w):
        rounds = _counting(rl)

        def send_later() -> None:
            for m in (b"a", b"b", b"c"):
                time.sleep(0.02)
                w.peer.send(m)

        sender = threading.Thread(target=send_later)
        sender.start()
        assert rl.drive(lambda: len(seen.events) >= 3)
        sender.join(5)
        assert [e[2] for e in seen.events] == ["a", "b", "c"]
        assert {e[0] for e in seen.events} == {threading.current_thread().name}
        assert rounds == []  # the loop's thread slept through all three
        w.peer.send(b"d")  # no caller drives now: the loop's thread wakes for it
        got = seen.wait_for(4)
        assert got[3][0] == "gfaas-invoker-test" and got[3][2] == "d"


def test_a_caller_stops_driving_once_the_window_passes_and_the_loop_thread_takes_the_reply() -> None:
    """With nothing for ``poll_s`` the caller gives the replies back; the late reply wakes the loop's
    thread, which handles it once."""
    with _driven(poll_s=0.05) as (seen, rl, w):
        t0 = time.monotonic()
        assert rl.drive(lambda: False)
        assert 0.05 <= time.monotonic() - t0 < 5
        w.peer.send(b"late")
        assert seen.wait_for(1) == [("gfaas-invoker-test", "w", "late")]


def test_pollers_yield_the_cpu_between_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller that drives and a worker that polls for its next task call ``sched_yield`` between
    looks: a process woken on their CPU (the worker they wait for, the runtime that sends) runs at
    once instead of after the scheduler preempts the poller (policy.polling)."""
    import os

    from gfaas.runtime.worker import _next_message

    yields = [0]
    real = os.sched_yield

    def counted() -> None:
        yields[0] += 1
        real()

    monkeypatch.setattr(os, "sched_yield", counted)
    with _driven(poll_s=2.0) as (seen, rl, w):
        threading.Timer(0.05, lambda: w.peer.send(b"r")).start()
        assert rl.drive(lambda: len(seen.events) >= 1)
        assert seen.events == [(threading.current_thread().name, "w", "r")] and yields[0] > 0
    yields[0] = 0
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        threading.Timer(0.05, lambda: b.send(b"task")).start()
        data, fds = _next_message(a, 2.0)
        assert bytes(data) == b"task" and fds == [] and yields[0] > 0
    finally:
        a.close()
        b.close()


def test_drive_declines_when_the_rule_says_sleep_on_the_loop_thread_and_under_an_asyncio_loop(
        aloop: asyncio.AbstractEventLoop) -> None:
    """It returns False at once, having read nothing, when it must not drive: the rule says sleep,
    the caller is the loop's own thread, the loop's thread holds the baton, or an asyncio loop drives
    the replies; those replies are handled by whoever drives the loop then."""
    seen = _Seen()
    polling = [False]
    rl = ReplyLoop(seen.on_message, name="gfaas-invoker-test", polls=lambda: polling[0], poll_s=1.0)
    w = _Worker("w")
    try:
        rl.attach(w)
        assert not rl.drive(lambda: False)  # the rule says no
        polling[0] = True
        on_loop: list[bool] = []
        rl.post(lambda: on_loop.append(rl.drive(lambda: False)))
        with rl._baton:  # as when the loop's thread is handling something
            assert not rl.drive(lambda: False)
        deadline = time.monotonic() + 5
        while not on_loop and time.monotonic() < deadline:
            time.sleep(0.005)
        assert on_loop == [False]
        _on(aloop, lambda: rl.adopt(aloop))
        assert not rl.drive(lambda: False)
        w.peer.send(b"x")
        assert seen.wait_for(1) == [("aio", "w", "x")]
        _on(aloop, rl.release)
    finally:
        rl.close()
        w.ours.close()
        w.peer.close()
    plain = ReplyLoop(seen.on_message)
    try:
        assert plain.drive(lambda: False) is False  # no window: never drives
    finally:
        plain.close()


def test_a_caller_stops_driving_at_its_deadline_even_while_replies_keep_coming() -> None:
    """``until`` bounds the drive whatever comes: replies every few milliseconds for a second keep the
    window open, yet the caller gives the replies back at its deadline (Invoker.result's timeout)."""
    with _driven(poll_s=1.0) as (seen, rl, w):
        stop = threading.Event()

        def chatter() -> None:
            while not stop.is_set():
                w.peer.send(b"m")
                time.sleep(0.002)

        sender = threading.Thread(target=chatter)
        sender.start()
        try:
            t0 = time.perf_counter()
            assert rl.drive(lambda: False, until=t0 + 0.1)
            took = time.perf_counter() - t0
        finally:
            stop.set()
            sender.join(5)
        assert 0.1 <= took < 3, took  # without the deadline it would never return: the chatter never stops
        assert any(e[0] == threading.current_thread().name for e in seen.events)
