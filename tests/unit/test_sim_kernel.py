"""The discrete-event kernel: ordering, cancellation, run(until) and time keeping, as exact logs."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas.clock import Clock
from gfaas.errors import ConfigError
from gfaas.sim.kernel import Event, EventLog, SimClock, Simulator

# Every test here runs on each implementation (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("sim_kernel")


def _logger(sim: Simulator, log: list[tuple[float, str]]) -> Any:
    def rec(name: str) -> None:
        log.append((sim.now, name))

    return rec


def test_equal_time_equal_priority_runs_in_scheduling_order() -> None:
    """Events with the same time and priority run FIFO, in the order they were scheduled."""
    sim = Simulator()
    log: list[tuple[float, str]] = []
    rec = _logger(sim, log)
    for name in ("a", "b", "c", "d"):
        sim.schedule(1.0, rec, name)
    sim.schedule(0.5, rec, "first")
    sim.run()
    assert log == [(0.5, "first"), (1.0, "a"), (1.0, "b"), (1.0, "c"), (1.0, "d")]
    assert sim.now == 1.0
    assert sim.events_run == 5


def test_lower_priority_number_runs_first_at_equal_time_but_time_wins() -> None:
    """At equal time the lower priority number runs first; an earlier time beats any priority."""
    sim = Simulator()
    log: list[tuple[float, str]] = []
    rec = _logger(sim, log)
    sim.schedule(2.0, rec, "p1", priority=1)
    sim.schedule(2.0, rec, "p0")
    sim.schedule(2.0, rec, "p-1", priority=-1)
    sim.schedule(1.0, rec, "early-p5", priority=5)
    sim.schedule(2.0, rec, "p0-later")
    sim.run()
    assert log == [(1.0, "early-p5"), (2.0, "p-1"), (2.0, "p0"), (2.0, "p0-later"), (2.0, "p1")]


def test_at_schedules_absolute_times_and_rejects_the_past() -> None:
    """``at`` runs at an absolute time and refuses times before now, NaN and infinity."""
    sim = Simulator(start=10.0)
    log: list[tuple[float, str]] = []
    rec = _logger(sim, log)
    sim.at(12.5, rec, "x")
    sim.at(10.0, rec, "now")
    sim.run()
    assert log == [(10.0, "now"), (12.5, "x")]
    for bad in (12.0, math.nan, math.inf):
        with pytest.raises(ConfigError, match="not before now"):
            sim.at(bad, rec, "y")


@pytest.mark.parametrize("delay", [-1e-9, -3.0, math.nan, math.inf])
def test_schedule_rejects_negative_nan_and_infinite_delays(delay: float) -> None:
    """A delay below 0, NaN or infinite is a ConfigError naming the callback and the value."""
    sim = Simulator()

    def my_callback() -> None:
        pass

    with pytest.raises(ConfigError) as exc:
        sim.schedule(delay, my_callback)
    assert "my_callback" in str(exc.value)
    assert repr(delay) in str(exc.value)
    assert "finite number >= 0" in str(exc.value)
    assert sim.pending == 0


def test_cancel_is_lazy_idempotent_and_a_no_op_after_running() -> None:
    """A cancelled event never runs; cancelling twice, or after the event ran, changes nothing."""
    sim = Simulator()
    log: list[tuple[float, str]] = []
    rec = _logger(sim, log)
    a = sim.schedule(1.0, rec, "a")
    b = sim.schedule(2.0, rec, "b")
    c = sim.schedule(3.0, rec, "c")
    sim.cancel(b)
    sim.cancel(b)
    assert (b.cancelled, b.done) == (True, False)
    assert sim.pending == 2
    assert sim.peek() == 1.0
    sim.run(until=1.0)
    assert a.done and not a.cancelled
    sim.cancel(a)  # already ran: no-op
    assert (a.cancelled, a.done) == (False, True)
    assert sim.pending == 1
    assert sim.peek() == 3.0  # skips the cancelled event at 2.0
    sim.run()
    assert log == [(1.0, "a"), (3.0, "c")]
    assert sim.events_run == 2
    assert c.done and sim.pending == 0 and sim.peek() == math.inf


def test_cancel_from_inside_a_callback_stops_a_same_time_event() -> None:
    """A callback can cancel an event due at the same instant that has not run yet."""
    sim = Simulator()
    log: list[tuple[float, str]] = []
    rec = _logger(sim, log)
    victim: list[Event] = []

    def killer() -> None:
        log.append((sim.now, "killer"))
        sim.cancel(victim[0])

    sim.schedule(1.0, killer)
    victim.append(sim.schedule(1.0, rec, "victim"))
    sim.schedule(1.0, rec, "survivor")
    sim.run()
    assert log == [(1.0, "killer"), (1.0, "survivor")]
    assert sim.events_run == 2


def test_run_until_includes_events_at_until_and_sets_now() -> None:
    """run(until) runs events at exactly ``until``, leaves later ones, and ends with now == until."""
    sim = Simulator()
    log: list[tuple[float, str]] = []
    rec = _logger(sim, log)
    sim.schedule(1.0, rec, "a")
    sim.schedule(2.0, rec, "at-until")
    sim.schedule(2.0 + 1e-9, rec, "after")
    assert sim.run(until=2.0) == 2.0
    assert log == [(1.0, "a"), (2.0, "at-until")]
    assert sim.now == 2.0 and sim.pending == 1
    # The queue empties before until: time still advances to until.
    assert sim.run(until=7.5) == 7.5
    assert log[-1] == (2.0 + 1e-9, "after")
    assert sim.now == 7.5
    # Running with nothing queued and no limit leaves time alone.
    assert sim.run() == 7.5
    with pytest.raises(ConfigError, match="before now"):
        sim.run(until=7.0)


def test_step_runs_one_event_and_reports_an_empty_queue() -> None:
    """step() runs exactly the next live event and returns False, time unchanged, when none is left."""
    sim = Simulator()
    log: list[tuple[float, str]] = []
    rec = _logger(sim, log)
    dead = sim.schedule(0.5, rec, "dead")
    sim.schedule(1.0, rec, "a")
    sim.schedule(1.5, rec, "b")
    sim.cancel(dead)
    assert sim.step() is True
    assert log == [(1.0, "a")] and sim.now == 1.0
    assert sim.step() is True
    assert sim.step() is False
    assert log == [(1.0, "a"), (1.5, "b")] and sim.now == 1.5 and sim.events_run == 2


def test_callbacks_schedule_more_work_zero_delay_goes_after_same_time_peers() -> None:
    """A zero-delay event from a callback runs after already-queued same-time peers, unless it has a lower priority."""
    sim = Simulator()
    log: list[tuple[float, str]] = []
    rec = _logger(sim, log)

    def parent() -> None:
        log.append((sim.now, "parent"))
        sim.schedule(0.0, rec, "child-fifo")
        sim.schedule(0.0, rec, "child-urgent", priority=-1)
        sim.schedule(0.25, rec, "child-later")

    sim.schedule(1.0, parent)
    sim.schedule(1.0, rec, "peer")
    sim.run()
    assert log == [
        (1.0, "parent"),
        (1.0, "child-urgent"),
        (1.0, "peer"),
        (1.0, "child-fifo"),
        (1.25, "child-later"),
    ]


def test_run_is_not_reentrant() -> None:
    """Calling run() from inside a callback is refused instead of corrupting time."""
    sim = Simulator()
    errors: list[str] = []

    def nested() -> None:
        try:
            sim.run()
        except ConfigError as exc:
            errors.append(str(exc))

    sim.schedule(1.0, nested)
    sim.run()
    assert len(errors) == 1 and "inside an event callback" in errors[0]


def test_exception_in_callback_propagates_and_the_run_can_resume() -> None:
    """A failing callback surfaces its exception with time at that event; later events still run."""
    sim = Simulator()
    log: list[tuple[float, str]] = []
    rec = _logger(sim, log)

    def boom() -> None:
        raise RuntimeError("boom")

    sim.schedule(1.0, rec, "a")
    sim.schedule(2.0, boom)
    sim.schedule(3.0, rec, "c")
    with pytest.raises(RuntimeError, match="boom"):
        sim.run(until=10.0)
    assert sim.now == 2.0 and sim.events_run == 2
    sim.run(until=10.0)
    assert log == [(1.0, "a"), (3.0, "c")] and sim.now == 10.0


def test_clock_view_reads_simulated_time() -> None:
    """sim.clock() is a gfaas Clock whose now() follows the simulator, also inside callbacks."""
    sim = Simulator(start=5.0)
    clock = sim.clock()
    assert isinstance(clock, SimClock) and isinstance(clock, Clock)
    seen: list[float] = []
    sim.schedule(1.5, lambda: seen.append(clock.now()))
    assert clock.now() == 5.0
    sim.run(until=8.0)
    assert seen == [6.5] and clock.now() == 8.0


def test_event_log_records_time_kind_and_details() -> None:
    """EventLog appends (now, kind, *details) in execution order and filters by kind."""
    sim = Simulator()
    log = EventLog(sim)
    sim.schedule(1.0, log.record, "arrive", 7)
    sim.schedule(2.0, log.record, "depart", 7, "ok")
    sim.schedule(3.0, log.record, "arrive", 8)
    sim.run()
    assert log.entries == [(1.0, "arrive", 7), (2.0, "depart", 7, "ok"), (3.0, "arrive", 8)]
    assert log.of("arrive") == [(1.0, "arrive", 7), (3.0, "arrive", 8)]
    assert len(log) == 3 and list(log) == log.entries


def test_start_time_must_be_finite() -> None:
    """A simulator cannot start at NaN or infinity."""
    with pytest.raises(ConfigError, match="not finite"):
        Simulator(start=math.nan)


def _random_model(seed: int) -> list[tuple[Any, ...]]:
    """A small self-scheduling model driven by random.Random(seed); returns its event log."""
    rnd = random.Random(seed)
    sim = Simulator()
    log = EventLog(sim)
    pending: list[Event] = []

    def tick(i: int) -> None:
        log.record("tick", i)
        if i < 200:
            pending.append(sim.schedule(rnd.choice([0.0, 0.5, 1.0, rnd.random()]), tick, i + 1,
                                        priority=rnd.randint(-1, 1)))
            if rnd.random() < 0.3:
                pending.append(sim.schedule(rnd.random(), log.record, "side", i))
            if pending and rnd.random() < 0.2:
                sim.cancel(pending[rnd.randrange(len(pending))])

    sim.schedule(0.0, tick, 0)
    sim.run()
    return log.entries


def test_identical_runs_give_identical_logs() -> None:
    """Determinism: the same model and seed produce the same event log, entry for entry."""
    a = _random_model(42)
    b = _random_model(42)
    assert len(a) > 20
    assert a == b
    assert a != _random_model(43)


# ---- property test against a naive reference --------------------------------------------------
_delays = st.sampled_from([0.0, 0.5, 1.0, 2.5, 3.0])
_child = st.tuples(_delays, st.integers(-1, 1))
_top = st.tuples(
    _delays,  # delay
    st.integers(-1, 1),  # priority
    st.booleans(),  # cancelled before the run
    st.lists(_child, max_size=3),  # children scheduled when it runs
    st.one_of(st.none(), st.integers(0, 15)),  # index of a top-level event it cancels when it runs
)


class _Reference:
    """An O(n^2) simulator with the documented semantics: pick the smallest (time, priority, seq)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.items: list[list[Any]] = []  # [time, priority, seq, fn, cancelled, done]
        self.seq = 0

    def schedule(self, delay: float, fn: Any, priority: int = 0) -> list[Any]:
        item = [self.now + delay, priority, self.seq, fn, False, False]
        self.seq += 1
        self.items.append(item)
        return item

    def cancel(self, item: list[Any]) -> None:
        if not item[5]:
            item[4] = True

    def run(self) -> None:
        while True:
            live = [it for it in self.items if not it[4] and not it[5]]
            if not live:
                return
            it = min(live, key=lambda x: (x[0], x[1], x[2]))
            it[5] = True
            self.now = it[0]
            it[3]()


def _drive(spec: list[tuple[Any, ...]], sim: Any, schedule: Any, cancel: Any) -> list[tuple[float, str]]:
    log: list[tuple[float, str]] = []
    handles: list[Any] = []

    def make_top(i: int, children: list[tuple[float, int]], kill: int | None) -> Any:
        def fn() -> None:
            log.append((sim.now, f"top{i}"))
            for j, (d, p) in enumerate(children):
                schedule(d, make_child(f"top{i}.{j}"), p)
            if kill is not None and kill < len(handles):
                cancel(handles[kill])

        return fn

    def make_child(name: str) -> Any:
        def fn() -> None:
            log.append((sim.now, name))

        return fn

    for i, (d, p, _, children, kill) in enumerate(spec):
        handles.append(schedule(d, make_top(i, children, kill), p))
    for i, (_, _, pre_cancel, _, _) in enumerate(spec):
        if pre_cancel:
            cancel(handles[i])
    sim.run()
    return log


@given(st.lists(_top, max_size=16))
def test_property_matches_reference_order_monotone_and_exactly_once(spec: list[tuple[Any, ...]]) -> None:
    """Random schedules: the exact log equals a naive reference; times never decrease; each live event runs once."""
    sim = Simulator()
    got = _drive(spec, sim, lambda d, fn, p: sim.schedule(d, fn, priority=p), sim.cancel)
    ref = _Reference()
    want = _drive(spec, ref, ref.schedule, ref.cancel)
    assert got == want
    times = [t for t, _ in got]
    assert times == sorted(times)
    names = [n for _, n in got]
    assert len(names) == len(set(names))
    assert sim.events_run == len(got)
    assert sim.pending == 0
    # Every event the reference did not cancel ran; every cancelled one did not.
    assert sum(1 for it in ref.items if it[5]) == len(got)
    assert all(it[4] != it[5] for it in ref.items)


def test_bench_smoke() -> None:
    """The SimPy benchmark runs the same model: identical mean sojourn, all report keys present."""
    pytest.importorskip("simpy", reason="simpy is in the dev extra")
    from gfaas.bench.sim import run

    r = run(events=2000, repeats=1)
    for key in ("gfaas_events_per_s", "simpy_events_per_s", "gfaas_jobs_per_s", "simpy_jobs_per_s",
                "ratio", "events", "simpy_events", "jobs", "model", "python", "machine",
                "mean_sojourn_gfaas", "mean_sojourn_simpy"):
        assert key in r, key
    assert r["model"] == "M/M/1 rho=0.8"
    assert r["jobs"] == 1000 and r["events"] == 2000
    assert r["simpy_events"] > r["events"]  # SimPy needs several events per job
    assert r["mean_sojourn_gfaas"] == pytest.approx(r["mean_sojourn_simpy"], rel=1e-9)
    assert r["gfaas_events_per_s"] > 0 and r["simpy_events_per_s"] > 0
    from gfaas.sim.kernel import CORE

    # The pure-Python kernel ran the same jobs beside the default one (it raises if they disagree).
    assert r["core"] == CORE and r["python_kernel_jobs_per_s"] > 0
    assert r["core_over_python"] == pytest.approx(r["gfaas_jobs_per_s"] / r["python_kernel_jobs_per_s"], rel=1e-9)
