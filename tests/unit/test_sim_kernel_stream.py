"""``Simulator.at_many``: events fed to the heap lazily run exactly as if each had been pushed by
``at`` at submission (same ``(time, priority, seq)`` order), with the counters unchanged."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.sim.kernel import Simulator

# Every test here runs on each implementation (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("sim_kernel")

times = st.lists(st.integers(0, 12).map(lambda k: k / 4), max_size=30)  # many ties on purpose


def _script(sim: Simulator, log: list[tuple[Any, ...]], streams: list[tuple[list[float], int]],
            singles: list[tuple[float, int]], lazy: bool) -> None:
    """Submit every stream (``at_many`` or one ``at`` per time) interleaved with single events;
    each callback also schedules a child at the same instant and one a bit later, so the events
    a stream's events schedule interleave with the stream's own."""

    def rec(name: str) -> None:
        log.append((sim.now, name, sim.pending, sim.events_run))
        if not name.startswith("child"):
            sim.schedule(0.0, rec, f"child0-{name}")
            sim.schedule(0.25, rec, f"child1-{name}", priority=-1)

    for k, (ts, prio) in enumerate(streams):
        if lazy:
            sim.at_many(ts, rec, f"s{k}", priority=prio)
        else:
            for t in ts:
                sim.at(t, rec, f"s{k}", priority=prio)
        if k < len(singles):
            t, prio1 = singles[k]
            sim.at(t, rec, f"single{k}", priority=prio1)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(times, st.integers(-1, 1)), max_size=4),
       st.lists(st.tuples(st.integers(0, 12).map(lambda k: k / 4), st.integers(-1, 1)), max_size=4),
       st.floats(0.0, 4.0))
def test_at_many_gives_the_event_log_of_one_at_per_time(streams: list[tuple[list[float], int]],
                                                        singles: list[tuple[float, int]], until: float) -> None:
    logs = []
    for lazy in (False, True):
        sim = Simulator()
        log: list[tuple[Any, ...]] = []
        _script(sim, log, streams, singles, lazy)
        before = sim.pending
        sim.run(until)  # in two slices, so peek/run(until) see a partly fed stream
        mid = (sim.pending, sim.events_run, sim.peek())
        sim.run()
        logs.append((before, mid, log, sim.events_run, sim.pending))
    assert logs[0] == logs[1]


def test_numpy_times_unsorted_with_ties_keep_submission_order() -> None:
    sim = Simulator()
    log: list[tuple[float, int]] = []
    ts = np.array([2.0, 1.0, 2.0, 0.5, 1.0])
    sim.at_many(ts, lambda: log.append((sim.now, len(log))))
    assert sim.pending == 5 and sim.peek() == 0.5
    sim.run()
    assert [t for t, _ in log] == [0.5, 1.0, 1.0, 2.0, 2.0]
    assert sim.events_run == 5 and sim.pending == 0


def test_at_many_keeps_the_heap_small() -> None:
    """A million arrivals: the heap holds the next one, not all of them."""
    sim = Simulator()
    sim.at_many(np.arange(1_000_000) * 1e-3, lambda: None)
    assert sim.pending == 1_000_000 and sim.heap_size == 1
    sim.run(1.0)
    assert sim.events_run == 1001 and sim.heap_size == 1


def test_at_many_rejects_past_nan_and_infinite_times_before_scheduling_any() -> None:
    sim = Simulator(start=1.0)
    for bad in ([2.0, 0.5], [float("nan")], [3.0, float("inf")]):
        with pytest.raises(ConfigError, match="not before now"):
            sim.at_many(bad, lambda: None)
    assert sim.pending == 0


def test_cluster_submit_many_runs_as_one_submit_per_arrival() -> None:
    """The same requests, event for event: ``submit_many`` against a loop of ``submit`` on 2 nodes."""
    from gfaas.sim.arrivals import poisson
    from gfaas.sim.cluster import Cluster
    from gfaas.sim.systems import system
    from gfaas.sim.workflows import workflow
    from gfaas.topology import preset

    out = []
    for many in (False, True):
        c = Cluster(preset("dgx-a100*2"), system("gfaas"), seed=3)
        c.deploy(workflow("traffic"), 4)
        ts = poisson(60.0, 1.0, seed=2)
        if many:
            c.submit_many("traffic", ts)
        else:
            for t in ts:
                c.submit("traffic", float(t))
        recs = c.run()
        out.append(([(r.ident, r.arrival, r.finish, sorted(r.edges.items())) for r in recs], c.sim.events_run))
    assert out[0] == out[1] and len(out[0][0]) > 30


def test_run_restores_the_callers_gc_thresholds_even_when_a_callback_raises() -> None:
    """run() collects less often while it runs (a speed measure) and gives the thresholds back."""
    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []
    sim = Simulator()
    sim.schedule(1.0, lambda: seen.append(gc.get_threshold()))

    def boom() -> None:
        raise RuntimeError("callback failed")

    sim.schedule(2.0, boom)
    with pytest.raises(RuntimeError, match="callback failed"):
        sim.run()
    assert seen and seen[0][0] >= 100_000
    assert gc.get_threshold() == before
