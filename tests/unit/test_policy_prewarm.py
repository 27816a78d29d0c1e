"""gfaas.policy.workerpool ahead of the burst (issue 36, item 3): a burst's workers start at its
arrivals, not a tick later; a periodic burst is pre-warmed at its size; the simulator's replay sees
the same (exact decision sequences, closed forms and hypothesis properties)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.policy.autoscale import ScalingSpec
from gfaas.policy.workerpool import WorkerPoolPolicy, WorkerView
from gfaas.sim.autoscale import replay


def starting(n: int, since: float) -> list[WorkerView]:
    return [WorkerView(k, "starting", since) for k in range(n)]


def burst_at_zero(p: WorkerPoolPolicy, t: float, n: int) -> list[tuple[int, int, int] | None]:
    """``n`` requests arrive at ``t`` with no worker: each queues and a decision follows (the runtime's
    order); the workers already started are starting."""
    log: list[tuple[int, int, int] | None] = []
    live = 0
    for k in range(n):
        p.arrival(t)
        if not p.decides_after(k + 1, live, 0):  # max workers, none idle: skipped, as the executors do
            log.append(None)
            continue
        d = p.decide(t, k + 1, starting(live, t))
        live += d.start
        log.append((d.target, d.start, d.cold))
    return log


def test_a_0_to_n_burst_starts_its_workers_at_the_arrivals() -> None:
    """Each request that finds no idle or starting worker starts one in its arrival's decision."""
    p = WorkerPoolPolicy(ScalingSpec(max=8, keep_alive="fixed:1"))
    assert burst_at_zero(p, 10.0, 5) == [(1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 1), (5, 1, 1)]
    # the tick that follows has nothing left to start
    d = p.decide(10.5, 5, starting(5, 10.0), sample=True)
    assert (d.start, d.stop) == (0, ())


def test_the_reactive_policy_started_one_and_waited_for_the_tick() -> None:
    """``ahead=False`` is the policy before issue 36: one start at once, the rest on the tick."""
    p = WorkerPoolPolicy(ScalingSpec(max=8, keep_alive="fixed:1"), ahead=False)
    assert burst_at_zero(p, 10.0, 5) == [(1, 1, 1)] + [(1, 0, 0)] * 4
    d = p.decide(10.5, 5, starting(1, 10.0), sample=True)  # panic: 5 in demand for 1 worker
    assert (d.target, d.start, d.cold) == (5, 4, 4)


def test_the_fast_path_respects_target_concurrency_and_max() -> None:
    """A worker for two in flight (target 2) starts one per two waiting requests; never over max."""
    p = WorkerPoolPolicy(ScalingSpec(max=2, target_concurrency=2.0, keep_alive="fixed:1"))
    # at max (2) with both starting, the last two arrivals need no decision
    assert burst_at_zero(p, 0.0, 5) == [(1, 1, 1), (1, 0, 0), (2, 1, 1), None, None]


def test_a_burst_s_workers_stop_only_once_idle_for_a_panic_window() -> None:
    """The stable window's average has barely moved after a burst; its workers stay a panic window
    (6 s) after their last request rather than stopping at the next tick and starting again."""
    p = WorkerPoolPolicy(ScalingSpec(max=8, keep_alive="fixed:1"))
    burst_at_zero(p, 0.0, 4)
    for _ in range(4):
        p.done(0.5)
    four = [WorkerView(k, "idle", 0.5) for k in range(4)]
    assert p.decide(1.0, 0, four, sample=True).stop == ()
    assert p.decide(6.0, 0, four, sample=True).stop == ()
    d = p.decide(6.5, 0, four, sample=True)
    assert (d.target, d.stop) == (1, (0, 1, 2))  # the keep-alive floor keeps one


def periodic(p: WorkerPoolPolicy, starts: list[float], size: int) -> None:
    for t in starts:
        for _ in range(size):
            p.arrival(t)
        for _ in range(size):
            p.done(t + 0.1)


def test_a_periodic_burst_is_prewarmed_at_its_size() -> None:
    """Bursts of 4 every 300 s under ``gfaas``: after four bursts (three burst idle times in the
    5-minute bin) the burst-level policy pre-warms from 4 to 7 minutes after the last burst's start
    (``_window(4, 6)``), so 4 workers are loaded at 900 + 240 s and the burst at 1200 s finds them."""
    p = WorkerPoolPolicy(ScalingSpec(max=8, keep_alive="gfaas"))
    periodic(p, [0.0, 300.0, 600.0], 4)
    assert p.burst_floor(800.0) == (0, None)  # two burst idle times: no pattern yet
    periodic(p, [900.0], 4)
    assert p.burst_workers() == 4
    assert p.burst_floor(1000.0) == (0, 1140.0)
    assert p.burst_floor(1140.0) == (4, 1320.0)
    one = [WorkerView(0, "idle", 900.1)]  # the keep-alive floor's worker
    assert p.decide(1139.0, 0, one).target == 1
    d = p.decide(1140.0, 0, one)
    assert (d.target, d.start, d.cold) == (4, 3, 0)  # a pre-warm, not a cold start
    four = [WorkerView(k, "idle", 1140.0) for k in range(4)]
    for _ in range(4):  # the burst comes: each request to a warm worker, no decision
        p.arrival(1200.0)
    assert not p.decides_after(0, 4, 0)
    assert p.burst_floor(1200.5) == (0, 1440.0)  # the next window, from this burst's start
    busy = [WorkerView(k, "busy", 1200.0) for k in range(4)]
    # (event decisions, sample=False: the scaler has no samples, so the floors alone decide)
    assert p.decide(1200.5, 0, busy).target == 4  # held: all four in use
    for _ in range(4):
        p.done(1200.6)
    four = [WorkerView(k, "idle", 1200.6) for k in range(4)]
    assert p.decide(1206.0, 0, four).stop == ()  # held a panic window after the last use
    d = p.decide(1207.0, 0, four)
    assert (d.target, d.stop) == (1, (0, 1, 2))


def test_a_burst_size_is_the_smaller_of_the_last_two_peaks() -> None:
    """One outlier burst does not hold extra workers; the size counts per target_concurrency."""
    p = WorkerPoolPolicy(ScalingSpec(max=8, target_concurrency=0.5, keep_alive="gfaas"))
    periodic(p, [0.0], 3)
    assert p.burst_workers() == 6
    periodic(p, [300.0], 2)
    assert p.burst_workers() == 4
    periodic(p, [600.0], 7)
    assert p.burst_workers() == 4
    periodic(p, [900.0], 7)
    assert p.burst_workers() == 8  # 14 wanted, max 8


def test_a_function_without_a_pattern_gets_no_burst_floor() -> None:
    """fixed:N never pre-warms, and irregular bursts give gfaas no period: scaling is as before."""
    for keep, starts in (("fixed:10", [0.0, 300.0, 600.0, 900.0, 1200.0]),
                         ("gfaas", [0.0, 200.0, 900.0, 1000.0, 2400.0])):
        p = WorkerPoolPolicy(ScalingSpec(max=8, keep_alive=keep))
        periodic(p, starts, 5)
        assert all(p.burst_floor(t)[0] == 0 for t in range(2400, 4000, 10))


events = st.lists(st.tuples(st.floats(0, 5, allow_nan=False), st.integers(0, 20),
                            st.lists(st.sampled_from(["starting", "idle", "busy"]), max_size=10),
                            st.booleans(), st.booleans()), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 3), st.integers(0, 6), st.sampled_from([0.7, 1.0, 2.0]), events)
def test_properties_against_the_reactive_policy(lo: int, extra: int, tc: float,
                                                evs: list[tuple[float, int, list[str], bool, bool]]) -> None:
    """Fed the same events as the reactive policy: never above max, stops only idle workers (and
    only ones the reactive policy stops too), and the starts it adds are at most the requests left
    without a worker (queued - idle - starting). Within 200 s no burst pattern can be learned, so
    the fast path and the idle time before a stop are the only differences."""
    spec = ScalingSpec(min=lo, max=max(lo, 1) + extra, target_concurrency=tc, keep_alive="gfaas",
                       stable_window_s=4, panic_window_s=1, scale_to_zero_grace_s=2)
    new, old = WorkerPoolPolicy(spec), WorkerPoolPolicy(spec, ahead=False)
    now = 0.0
    for dt, queued, states, arrive, sample in evs:
        now += dt
        if arrive:
            new.arrival(now)
            old.arrival(now)
        workers = [WorkerView(k, s, now - k) for k, s in enumerate(states)]  # type: ignore[arg-type]
        idle_ids = {w.id for w in workers if w.state == "idle"}
        unmet = queued - len(idle_ids) - states.count("starting")
        before = copy.deepcopy(new)
        d, r = new.decide(now, queued, workers, sample=sample), old.decide(now, queued, workers, sample=sample)
        assert d == before.decide(now, queued, workers, sample=sample)  # deterministic
        assert new.burst_floor(now)[0] == 0 and new.hold == 0
        assert d.target <= spec.max and set(d.stop) <= set(r.stop) <= idle_ids
        assert d.start <= max(r.start, unmet)
        assert d.cold <= max(0, unmet) and d.start == max(0, d.target - len(workers))


def test_the_replay_starts_a_0_to_n_burst_at_once() -> None:
    """The simulator calls the same policy: five requests at zero workers all wait exactly one start."""
    spec = ScalingSpec(max=8, keep_alive="fixed:1")
    r = replay([1.0] * 5, spec, service_s=0.1, start_s=0.2, prewarm=False)
    assert (r.cold_starts, r.starts, r.p50_ms, r.p99_ms) == (5, 5, pytest.approx(300.0), pytest.approx(300.0))
    old = replay([1.0] * 5, spec, service_s=0.1, start_s=0.2, prewarm=False, ahead=False)
    assert old.p99_ms > 400.0  # four of them waited for the tick at 1.0 s, or behind the first


def test_the_replay_prewarms_a_periodic_bursty_trace() -> None:
    """Bursts of 6 every 300 s: the first four (while the period is learned) start 5 workers each
    for waiting requests; from the fifth on, 6 workers are loaded before each burst and no request
    waits for a start. The reactive policy instead serves each burst by one kept worker in turn."""
    spec = ScalingSpec(max=8, keep_alive="gfaas")

    def trace(n: int) -> list[float]:
        return [300.0 * k for k in range(n) for _ in range(6)]

    learned = replay(trace(4), spec, service_s=0.1, start_s=0.3)
    r = replay(trace(8), spec, service_s=0.1, start_s=0.3)
    assert learned.cold_starts == r.cold_starts == 4 * 5
    assert r.starts == 4 * 5 + 4 * 5 + 5  # pre-warms: 5 beside the kept worker, before bursts 5-8 and after 8
    assert r.p50_ms == pytest.approx(100.0)  # over half the requests met a pre-warmed worker
    old = replay(trace(8), spec, service_s=0.1, start_s=0.3, ahead=False)
    assert old.p50_ms == pytest.approx(350.0) and old.p99_ms == pytest.approx(600.0)
