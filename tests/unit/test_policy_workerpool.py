"""gfaas.policy.workerpool and .resources: one function's worker-count decisions and node reservations.

Exact scenarios (scale from zero, burst, keep-alive expiry, pre-warm, eviction order) and hypothesis
properties: the target stays in [min, max], stops name only idle workers, cold starts never exceed
the waiting requests, identical inputs give identical decisions, and a ledger never goes over capacity.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.policy.autoscale import ScalingSpec
from gfaas.policy.resources import Candidate, Ledger, Resources, choose_evictions, parse_resources
from gfaas.policy.workerpool import WorkerPoolPolicy, WorkerView


def idle(*ids: int, since: float = 0.0) -> list[WorkerView]:
    return [WorkerView(i, "idle", since) for i in ids]


def test_a_request_at_zero_workers_starts_one_at_once_as_a_cold_start() -> None:
    p = WorkerPoolPolicy(ScalingSpec(max=4, keep_alive="fixed:1"))
    p.arrival(10.0)
    d = p.decide(10.0, queued=1, workers=[])
    assert (d.target, d.start, d.cold, d.stop) == (1, 1, 1, ())
    # the same request seen again while its worker starts: nothing more to start
    d2 = p.decide(10.1, queued=1, workers=[WorkerView(0, "starting", 10.0)])
    assert (d2.start, d2.cold) == (0, 0)


def test_keep_alive_holds_the_last_worker_then_scale_to_zero() -> None:
    p = WorkerPoolPolicy(ScalingSpec(max=2, keep_alive="fixed:1", scale_to_zero_grace_s=5), tick_s=1.0)
    p.arrival(0.0)
    p.done(0.5)
    w = idle(0, since=0.5)
    assert p.decide(30.0, 0, w, sample=True).target == 1  # within a minute of the last use
    d = p.decide(60.6, 0, w, sample=True)
    assert (d.target, d.stop) == (0, (0,))
    assert p.decide(61.0, 0, [], sample=True).next_check is None  # nothing up, nothing waiting: sleep


def test_a_burst_scales_out_on_the_tick_and_back_down_after_the_stable_window() -> None:
    spec = ScalingSpec(max=8, keep_alive="fixed:10", stable_window_s=10, panic_window_s=2)
    p = WorkerPoolPolicy(spec, tick_s=1.0)
    p.arrival(0.0)
    workers = [WorkerView(0, "busy", 0.0)]
    d = p.decide(1.0, queued=7, workers=workers, sample=True)  # 8 in flight, 1 worker: panic
    assert d.target == 8 and d.start == 7 and d.cold == 7
    eight = [WorkerView(k, "idle", 2.0) for k in range(8)]
    for t in range(2, 11):  # demand gone, but panic holds the count for a stable window
        assert p.decide(float(t), 0, eight, sample=True).target == 8
    d = p.decide(11.0, 0, eight, sample=True)  # a stable window after the last panic condition
    assert d.target == 1 and d.stop == (0, 1, 2, 3, 4, 5, 6)  # longest idle first (ties by id); one kept alive


def test_prewarm_policy_unloads_after_use_and_loads_before_the_next_call() -> None:
    class Periodic:
        def on_invocation(self, now: float) -> None: pass
        def keep_alive_s(self, now: float) -> float: return 60.0
        def prewarm_after_s(self, now: float) -> float | None: return 300.0

    p = WorkerPoolPolicy(ScalingSpec(max=1, scale_to_zero_grace_s=1))
    p.keep = Periodic()
    p.arrival(0.0)
    p.done(0.0)
    # Idle past the grace, before the pre-warm window. (Issue 36: a worker stops only once idle for a
    # panic window, 6 s here, so a burst's workers do not flap; this used to stop it at 2 s.)
    assert p.decide(2.0, 0, idle(0), sample=True).stop == ()
    d = p.decide(6.0, 0, idle(0), sample=True)
    assert d.stop == (0,)
    d = p.decide(10.0, 0, [], sample=True)
    assert (d.target, d.next_check) == (0, 300.0)  # sleeps until the pre-warm
    d = p.decide(300.0, 0, [], sample=True)
    assert (d.target, d.start, d.cold) == (1, 1, 0)  # a pre-warm is not a cold start
    assert p.decide(361.0, 0, idle(1, since=300.0), sample=True).stop == (1,)


def test_min_workers_are_kept_and_started_without_requests() -> None:
    p = WorkerPoolPolicy(ScalingSpec(min=2, max=3))
    d = p.decide(0.0, 0, [])
    assert (d.target, d.start, d.cold) == (2, 2, 0)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ConfigError, match="tick_s"):
        WorkerPoolPolicy(ScalingSpec(), tick_s=0)
    with pytest.raises(ConfigError, match="queued"):
        WorkerPoolPolicy(ScalingSpec()).decide(0.0, -1, [])


events = st.lists(st.tuples(st.floats(0, 5, allow_nan=False), st.integers(0, 20),
                            st.lists(st.sampled_from(["starting", "idle", "busy"]), max_size=10),
                            st.booleans(), st.booleans()), min_size=1, max_size=40)


def _replay(spec: ScalingSpec, evs: list[tuple[float, int, list[str], bool, bool]]) -> list[tuple[object, ...]]:
    p = WorkerPoolPolicy(spec, tick_s=0.5)
    now, out = 0.0, []
    for dt, queued, states, arrive, sample in evs:
        now += dt
        if arrive:
            p.arrival(now)
        workers = [WorkerView(k, s, now - k) for k, s in enumerate(states)]  # type: ignore[arg-type]
        d = p.decide(now, queued, workers, sample=sample)
        idle_ids = {w.id for w in workers if w.state == "idle"}
        assert spec.min <= d.target <= spec.max or (d.target == spec.max)
        assert set(d.stop) <= idle_ids
        assert d.cold <= d.start and d.cold <= queued
        assert d.start == max(0, d.target - len(workers))
        assert len(workers) - len(d.stop) >= min(d.target, len(workers))
        if queued > 0:  # a waiting request is never left without a worker
            assert d.target >= 1 and len(workers) - len(d.stop) + d.start >= 1
        if queued > 0 and not p.decides_after(queued, len(workers), len(idle_ids)):  # skipped: at max, none idle
            assert d.start == 0 and d.stop == ()
        out.append((d.target, d.start, d.cold, d.stop, d.next_check))
    return out


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 3), st.integers(0, 5), st.sampled_from(["fixed:0.05", "gfaas", "hybrid"]), events)
def test_properties_bounds_idle_stops_and_determinism(lo: int, extra: int, keep: str,
                                                     evs: list[tuple[float, int, list[str], bool, bool]]) -> None:
    spec = ScalingSpec(min=lo, max=max(lo, 1) + extra, keep_alive=keep, stable_window_s=4, panic_window_s=1,
                       scale_to_zero_grace_s=2)
    assert _replay(spec, evs) == _replay(spec, evs)


def test_resources_parse_and_refuse_bad_values() -> None:
    assert parse_resources(None) == Resources()
    r = parse_resources({"cpus": 2, "memory": "1GiB", "gpus": 0.5})
    assert (r.cpus, r.memory, r.gpus) == (2, 1 << 30, 0.5)
    for bad, word in [({"cpus": 0}, "cpus"), ({"memory": "lots"}, "memory"), ({"gpus": 2}, "gpus"),
                      ({"disk": 1}, "unknown key"), ([1], "mapping")]:
        with pytest.raises(ConfigError, match=word):
            parse_resources(bad)  # type: ignore[arg-type]


def test_evictions_take_the_longest_idle_first_and_only_as_many_as_needed() -> None:
    led = Ledger(cpus=2, memory=1 << 30)
    one = Resources(cpus=1, memory=0)
    led.reserve(one)
    led.reserve(one)
    cands = [Candidate("w/a", 0, one, "", idle_since=5.0), Candidate("w/b", 3, one, "", idle_since=1.0)]
    assert choose_evictions(led, one, "", cands) == [cands[1]]
    assert choose_evictions(led, Resources(cpus=3, memory=0), "", cands) is None
    led.release(one)
    assert choose_evictions(led, one, "", cands) == []


def test_gpu_shares_are_counted_per_gpu() -> None:
    led = Ledger(cpus=8, memory=1 << 30, gpus=["gpu0", "gpu1"])
    half = Resources(gpus=0.6)
    led.reserve(half, "gpu0")
    assert not led.fits(half, "gpu0") and led.fits(half, "gpu1")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0.05, 1.5), st.integers(0, 600)), max_size=60))
def test_a_ledger_used_as_the_runtime_uses_it_never_exceeds_capacity(ops: list[tuple[bool, float, int]]) -> None:
    led = Ledger(cpus=2, memory=1000)
    held: list[Resources] = []
    for take, cpus, mem in ops:
        if take:
            r = Resources(cpus=cpus, memory=mem)
            if led.fits(r):
                led.reserve(r)
                held.append(r)
        elif held:
            led.release(held.pop(0))
        assert led.used_cpus <= led.cpus + 1e-6 and led.used_memory <= led.memory


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 50), st.lists(st.sampled_from(["busy", "starting"]), min_size=1, max_size=8),
       st.booleans(), st.booleans(), st.lists(st.floats(0.0, 2.0), max_size=6))
def test_a_decision_skipped_at_max_with_no_idle_worker_could_not_have_acted(
        top: int, queued: int, states: list[str], ahead: bool, costs: bool, history: list[float]) -> None:
    """decides_after skips the decision after an event when ``max`` workers are live and none is idle
    (the runtime's pool and the simulator's replay): whatever the policy's history, that decision
    would have started and stopped nothing."""
    spec = ScalingSpec(max=top, keep_alive="gfaas", stable_window_s=4, panic_window_s=1)
    p = WorkerPoolPolicy(spec, tick_s=0.5, ahead=ahead, costs=costs)
    now = 0.0
    for dt in history:  # arrivals, completions and ticks before: the scaler's samples, a burst's peak
        now += dt
        p.arrival(now)
        p.started(0.01)
        p.done(now + 0.001, 0.002)
        p.decide(now, 1, [], sample=True)
    workers = [WorkerView(k, s, now) for k, s in enumerate((states * top)[:top])]  # type: ignore[misc]
    assert not p.decides_after(queued, len(workers), 0)
    d = p.decide(now + 0.1, queued, workers)
    assert (d.start, d.cold, d.stop) == (0, 0, ())
    # one fewer live, or one idle: a decision may act, so it is made
    assert p.decides_after(queued, top - 1, 0)
    assert p.decides_after(queued, top, 1)
    assert not p.decides_after(0, 0, 0)
