"""The in-storage accelerator scheduling policy: busy flag, fail-over to CPU, FCFS queue, depth limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError, Overloaded
from gfaas.policy.accel_sched import ACCEL, CPU, QUEUE, FcfsQueue, Waiting, place


def test_place_prefers_the_idle_home_drive() -> None:
    """An idle, healthy home drive takes the request even when CPUs are free."""
    assert place(1, [True, False], [True, True], cpus_free=3) == ACCEL


def test_place_fails_over_to_cpu_when_the_drive_is_busy_or_absent() -> None:
    """A busy drive (busy flag) or an unhealthy one sends the request to a free CPU."""
    assert place(0, [True, False], [True, True], cpus_free=1) == CPU
    assert place(1, [False, False], [True, False], cpus_free=1) == CPU


def test_place_queues_when_nothing_is_free() -> None:
    """Busy home drive and no free CPU: the request waits (another idle drive cannot take it)."""
    assert place(0, [True, False], [True, True], cpus_free=0) == QUEUE
    assert place(0, [False], [False], cpus_free=0) == QUEUE


def test_place_names_bad_inputs() -> None:
    """A home drive out of range and a negative CPU count are refused with the value named."""
    with pytest.raises(ConfigError, match=r"home drive 2 does not exist: there are 2 drives \(0\.\.1\)"):
        place(2, [False, False], [True, True], 0)
    with pytest.raises(ConfigError, match="cpus_free=-1"):
        place(0, [False], [True], -1)


def test_fcfs_queue_serves_in_arrival_order_per_drive_and_overall() -> None:
    """A freed drive takes the earliest request for it; a freed CPU the earliest of all, never one twice."""
    q = FcfsQueue(depth=10, drives=2)
    for rid, home in [(0, 1), (1, 0), (2, 1), (3, 0)]:
        q.push(Waiting(rid, home))
    assert len(q) == 4
    assert q.next_for_drive(0) == Waiting(1, 0)
    assert q.next_any() == Waiting(0, 1)
    assert q.next_any() == Waiting(2, 1)  # 1 went to drive 0 already: skipped
    assert q.next_for_drive(1) is None  # 0 and 2 were taken by CPUs
    assert len(q) == 1
    assert q.next_for_drive(0) == Waiting(3, 0)
    assert q.next_any() is None and len(q) == 0


def test_fcfs_queue_refuses_beyond_its_depth() -> None:
    """The depth limit refuses the next request with Overloaded naming the depth; taking one makes room."""
    q = FcfsQueue(depth=2, drives=1)
    q.push(Waiting(0, 0))
    q.push(Waiting(1, 0))
    with pytest.raises(Overloaded, match=r"queue is full \(2 of 2 waiting\): request 2 for drive 0 refused"):
        q.push(Waiting(2, 0))
    assert q.next_any() == Waiting(0, 0)
    q.push(Waiting(2, 0))
    assert len(q) == 2


def test_fcfs_queue_bad_arguments() -> None:
    """Depth must be a whole number >= 1; drives must exist."""
    with pytest.raises(ConfigError, match=r"queue depth 0: give a whole number >= 1"):
        FcfsQueue(0, 1)
    with pytest.raises(ConfigError, match="drives=-1"):
        FcfsQueue(5, -1)
    q = FcfsQueue(5, 2)
    with pytest.raises(ConfigError, match=r"request 7: home drive 2 does not exist \(2 drives\)"):
        q.push(Waiting(7, 2))
    with pytest.raises(ConfigError, match="drive 5 does not exist"):
        q.next_for_drive(5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("push"), st.integers(0, 2)),
                          st.tuples(st.just("drive"), st.integers(0, 2)),
                          st.just(("any", 0))), max_size=60))
def test_fcfs_queue_matches_a_list_model(ops: list[tuple[str, int]]) -> None:
    """Against a plain list: each take returns the earliest matching waiting request, lengths agree."""
    q = FcfsQueue(depth=1000, drives=3)
    model: list[Waiting] = []
    rid = 0
    for op, arg in ops:
        if op == "push":
            q.push(Waiting(rid, arg))
            model.append(Waiting(rid, arg))
            rid += 1
        else:
            want = next((w for w in model if op == "any" or w.home == arg), None)
            got = q.next_any() if op == "any" else q.next_for_drive(arg)
            assert got == want
            if want is not None:
                model.remove(want)
        assert len(q) == len(model)
