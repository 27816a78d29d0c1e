"""Replay arrivals against one scaled function, in simulated time (the twin of ``gfaas bench autoscale``).

The runtime's :class:`gfaas.runtime.pool.FunctionPool` and this replay call the same
:class:`gfaas.policy.workerpool.WorkerPoolPolicy` on the same events: an arrival, a worker ready,
a request done, and a tick every ``tick_s`` where the scaler samples. What the runtime measures, this
models: a worker start takes ``start_s``, a request runs ``service_s`` on one worker, a queued request
goes to the first idle worker (FIFO). So the cold starts, worker-seconds and latencies of the two
differ only by what the model leaves out (start and service times that vary, thread wake-ups).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..policy.autoscale import ScalingSpec
from ..policy.workerpool import WorkerPoolPolicy, WorkerView

__all__ = ["ReplayResult", "replay"]


@dataclass(frozen=True)
class ReplayResult:
    requests: int
    cold_starts: int
    starts: int
    worker_seconds: float
    p50_ms: float
    p99_ms: float
    peak_workers: int

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "cold_starts": self.cold_starts, "starts": self.starts,
                "worker_seconds": round(self.worker_seconds, 3), "p50_ms": round(self.p50_ms, 3),
                "p99_ms": round(self.p99_ms, 3), "peak_workers": self.peak_workers}


@dataclass
class _W:
    id: int
    state: str
    since: float
    started: float


def replay(arrivals: Sequence[float], spec: ScalingSpec, *, service_s: float | Sequence[float], start_s: float,
           tick_s: float = 0.5, prewarm: bool = True, end_s: float | None = None,
           ahead: bool = True, costs: bool = True) -> ReplayResult:
    """Serve ``arrivals`` (seconds from the deploy, sorted) with workers scaled by ``spec``.

    ``service_s``: one time for every request, or measured times, taken in turn (request k runs
    ``service_s[k % len]``), so the replay sees the spread a real run has.
    ``prewarm``: one worker (and ``min``) ready at time 0, as the runtime's deploy starts them.
    ``end_s``: when worker-seconds stop counting (default: the last completion).
    ``ahead``: the policy scales ahead of the burst (False: the reactive policy of before issue 36).
    ``costs``: the policy's rules for cheap starts (False: without them, as before they came)."""
    services = [float(service_s)] if isinstance(service_s, int | float) else [float(x) for x in service_s]
    if not services or min(services) < 0 or start_s < 0 or not tick_s > 0:
        raise ConfigError(f"service_s={service_s!r} (times >= 0, at least one), start_s={start_s} >= 0 and "
                          f"tick_s={tick_s} > 0 are needed")
    times = list(arrivals)
    if any(b < a for a, b in itertools.pairwise(times)) or (times and times[0] < 0):
        raise ConfigError("arrivals must be sorted times >= 0 (seconds from the deploy)")
    pol = WorkerPoolPolicy(spec, tick_s, ahead=ahead, costs=costs)
    ids = itertools.count()
    workers: dict[int, _W] = {}
    queue: deque[float] = deque()
    events: list[tuple[float, int, int, str, int]] = []  # (time, order, seq, kind, worker id)
    seq = itertools.count()
    latencies: list[float] = []
    cold = starts = peak = 0
    worker_s = 0.0
    order = {"ready": 0, "done": 1, "arrive": 2, "tick": 3}

    def push(t: float, kind: str, wid: int = -1) -> None:
        heapq.heappush(events, (t, order[kind], next(seq), kind, wid))

    def views() -> list[WorkerView]:
        return [WorkerView(w.id, w.state, w.since) for w in workers.values()]  # type: ignore[arg-type]

    running: dict[int, float] = {}  # worker -> arrival time of its request
    served = itertools.count()

    def dispatch(now: float) -> None:
        for w in sorted(workers.values(), key=lambda w: w.id):
            if not queue:
                return
            if w.state == "idle":
                running[w.id] = queue.popleft()
                w.state, w.since = "busy", now
                push(now + services[next(served) % len(services)], "done", w.id)

    def act(now: float, sample: bool) -> None:
        nonlocal cold, starts, worker_s, peak
        d = pol.decide(now, len(queue), views(), sample=sample)
        for wid in d.stop:
            w = workers.pop(wid)
            worker_s += now - w.started
        for k in range(d.start):
            w = _W(next(ids), "starting", now, now)
            workers[w.id] = w
            starts += 1
            cold += k < d.cold
            push(now + start_s, "ready", w.id)
        peak = max(peak, len(workers))

    if prewarm:
        pol.deployed(0.0)
        for _ in range(max(spec.min, 1)):
            w = _W(next(ids), "idle", 0.0, 0.0)
            workers[w.id] = w
        peak = len(workers)
    for t in times:
        push(t, "arrive")
    push(0.0, "tick")
    last = times[-1] if times else 0.0
    horizon = end_s
    clock = 0.0
    while events:
        now, _, _, kind, wid = heapq.heappop(events)
        if horizon is not None and now > horizon:
            break
        if kind == "arrive":  # the runtime's order: a warm worker takes it, else it queues and a decision follows
            queue.append(now)
            pol.arrival(now)
            dispatch(now)
            if pol.decides_after(len(queue), len(workers), sum(w.state == "idle" for w in workers.values())):
                act(now, sample=False)
        elif kind == "ready":
            w = workers[wid]
            pol.started(now - w.started)
            w.state, w.since = "idle", now
            dispatch(now)
            act(now, sample=False)
        elif kind == "done":
            w = workers[wid]
            latencies.append(now - running.pop(wid))
            busy_s = now - w.since
            w.state, w.since = "idle", now
            pol.done(now, busy_s)
            dispatch(now)
            if pol.decides_after(len(queue), len(workers), sum(w.state == "idle" for w in workers.values())):
                act(now, sample=False)
        else:  # tick: on until the horizon; without one, until no request is left and only min workers are up
            act(now, sample=True)
            if horizon is not None:
                more = now + tick_s <= horizon
            else:
                more = now < last or bool(queue or running) or len(workers) > spec.min
            if more:
                push(now + tick_s, "tick")
        clock = now
    stop_at = horizon if horizon is not None else clock
    worker_s += sum(max(0.0, stop_at - w.started) for w in workers.values())
    lat = np.asarray(latencies, dtype=float) * 1e3
    p50, p99 = (float(np.percentile(lat, 50)), float(np.percentile(lat, 99))) if len(lat) else (0.0, 0.0)
    return ReplayResult(len(latencies), cold, starts, worker_s, p50, p99, peak)
