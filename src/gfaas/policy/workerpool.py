"""How many workers one function has: when to start one, when to stop one (issue 22, item 2).

:class:`WorkerPoolPolicy` combines the two parts of :mod:`gfaas.policy.autoscale` for one function:
the concurrency scaler (how many workers the demand needs) and the keep-alive policy (how long the
last instance stays loaded, and when a periodic function is pre-warmed). It is pure and
clock-injected: the runtime (:mod:`gfaas.runtime.local`) and the autoscaling simulator
(:mod:`gfaas.sim.autoscale`) call the same object with the same inputs, so a decision differs between
them only when their inputs do.

The caller reports three kinds of event and applies what :meth:`WorkerPoolPolicy.decide` returns:

* :meth:`arrival` when a request for the function arrives (the keep-alive policy learns its idle
  times from these), :meth:`done` when one finishes;
* :meth:`decide` on a fixed tick (``sample=True``: the scaler records the concurrency, in-flight plus
  queued, only then, as Knative's autoscaler samples on its own period rather than at arrivals, which
  would bias the average towards busy moments), and after an event (``sample=False``) when
  :meth:`decides_after` says it can change anything: only while requests wait, and not at ``max``
  workers with none idle. With none waiting there is nothing to start for, and a stop of a worker
  that just went idle waits for the next tick (at most ``tick_s``), so a warm call costs no decision
  at all; at ``max`` with none idle nothing can start or stop, so a queued call costs none either.

The target count is ``max(min, scaler's count, keep-alive floor, burst floor, hold, fast path)``,
at most ``max``:

* the scaler's count follows the demand (stable and panic windows); it reaches 0 only when no
  request was seen for ``scale_to_zero_grace_s``;
* the keep-alive floor is 1 while the keep-alive policy wants the last instance loaded: for
  ``keep_alive_s`` after the last use, or, for a pre-warmed function, from ``prewarm_after_s`` after
  the last use for ``keep_alive_s``; else 0. So a function goes to zero only when both allow it;
* the **burst floor** (issue 36) is the size of the function's recent bursts while the
  keep-alive policy predicts the next one (see *Scaling ahead of the burst* below); else 0;
* the **hold** keeps the workers pre-warmed for a burst that then came, until a panic window
  passes in which the demand (busy plus queued, at a decision) never needed them all;
* the **fast path**: when more requests wait than idle and starting workers can take, the workers
  they need start at once, in the decision that follows the arrival (no tick): ``ceil((busy +
  queued) / target_concurrency) - live`` of them, never more than the requests left without a
  worker (``queued - idle - starting``), at most ``max``. A request at zero workers is the case
  of one. The scaler has no scale-up rate of its own (Knative's default, 1000x, is none in
  practice), so ``max`` and the waiting requests are the cap: a start is never made for a request
  that something already takes.

**Scaling ahead of the burst.** The keep-alive policy learns from the idle time between
invocations, and inside a burst those are near zero, so a function that bursts every five minutes
looks to it like one that never stops. The policy therefore keeps a second instance of the same
keep-alive policy (the same name: ``fixed:N`` never pre-warms, so nothing changes for it) that is
told of one arrival per *burst*: a burst begins at an arrival that finds nothing in flight after a
pause of at least :data:`BURST_GAP_S` (a minute, the histograms' bin: shorter pauses predict
nothing), close to how the minute-granular keep-alive simulator sees a function. Each burst's peak
concurrency (in flight plus queued) is recorded. When that burst-level policy pre-warms (its
histogram found the bursts' period), the burst floor is, from the pre-warm point for its keep-alive
window (both from the last burst's start), ``ceil(peak / target_concurrency)`` for the smaller peak
of the last two bursts (one outlier burst does not hold extra workers), at most ``max``. A burst
that arrives in that window keeps the pre-warmed workers under the hold. A function whose bursts
have no pattern the keep-alive policy sees gets no burst floor (the fast path and the idle rule
below still apply).

**Flapping.** Workers started at once for a burst would otherwise be stopped at the next tick, since
the stable window's average has barely moved, and started again at the burst's next request. So an
extra worker stops only once it has been idle for a panic window (``panic_window_s``): one that
went idle a moment ago is part of a burst still running. Each worker ends a panic window after its
own last request, not the whole count a stable window after the burst as the scaler's panic mode
holds it (which still applies when the demand reaches ``panic_threshold`` times the workers at a
tick). ``panic_window_s`` is the knob: shorter saves worker-seconds and costs more starts. With
measured starts, the idle time is shorter still (:meth:`idle_stop_s`, below).

**Starts that cost little.** The caller also reports what each worker start took
(:meth:`started`) and how long each request held its worker (:meth:`done`'s ``busy_s``); the policy
keeps the median of the last :data:`COST_SAMPLES` of each. Two rules follow from them:

* an extra idle worker stops once idle for ``BREAK_EVEN_STARTS`` of its starts (at least a tick, at
  most a panic window): keeping it longer costs more worker-seconds than the start it might save
  (the ski-rental break-even, with room for the wait a start adds to its request). With starts of
  0.3 s and more this is the panic window of before; a 25 ms start keeps an idle worker 0.5 s;
* when a start costs at most :data:`CHEAP_START_SHARE` of a request's service (**cheap starts**;
  the waiting these rules add to a request is about one start, so this bounds it at half a
  service), the pool reacts to each
  waiting request instead of provisioning for an average: the concurrency scaler's count (whose
  headroom and stable window exist to hide slow starts) holds no worker beyond the last one (which
  it keeps until ``scale_to_zero_grace_s`` passes without a request, as before), and a waiting request gets
  a start only if no busy or starting worker is expected to free up sooner than a new one would be
  ready (each busy worker is expected to free at its start of service plus the median service; one
  that ran past that, a median service from now). When it is left to a busy worker, the pool
  decides again once that worker is a start late.

Without samples of both (before the first start and the first completion) the rules of before
apply, and ``costs=False`` turns them off (the policy of before this change, for comparisons).

A start made while requests wait for a worker (more queued requests than idle and starting
workers) is a **cold start**; others (the floor, the minimum, a pre-warm) are not. Extra workers
stop only when idle, the longest idle first. ``ahead=False`` gives the reactive policy of before
issue 36 (no burst floor, no hold, stops as soon as the target allows, scale-out beyond one worker
on the tick), for comparisons.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError
from .autoscale import ConcurrencyScaler, KeepAlive, ScalingSpec, keep_alive_policy

__all__ = ["BREAK_EVEN_STARTS", "BURST_GAP_S", "CHEAP_START_SHARE", "COST_SAMPLES", "PoolDecision", "WorkerPoolPolicy", "WorkerView"]

#: A pause this long (nothing in flight) ends a burst: the keep-alive histograms' 1-minute bin.
BURST_GAP_S = 60.0
#: An extra idle worker is kept this many of its measured starts (see *Starts that cost little*).
BREAK_EVEN_STARTS = 20
#: The start and service times the cost rules take the median of (the last ones reported).
COST_SAMPLES = 16
#: Starts are cheap when the median start is at most this share of the median service.
CHEAP_START_SHARE = 0.5

WorkerStateName = Literal["starting", "idle", "busy"]


@dataclass(frozen=True)
class WorkerView:
    """One worker as the policy sees it: its id, state and since when it is in that state."""

    id: int
    state: WorkerStateName
    since: float


@dataclass(frozen=True)
class PoolDecision:
    """What to do now. ``cold`` of the ``start`` starts are for waiting requests (cold starts);
    ``stop`` names idle workers; call :meth:`WorkerPoolPolicy.decide` again by ``next_check``
    (None: nothing changes until the next event)."""

    target: int
    start: int = 0
    cold: int = 0
    stop: tuple[int, ...] = ()
    next_check: float | None = None


class WorkerPoolPolicy:
    """One function's worker-count decisions (see the module docstring)."""

    def __init__(self, spec: ScalingSpec, tick_s: float = 0.5, *, ahead: bool = True, costs: bool = True) -> None:
        if not tick_s > 0:
            raise ConfigError(f"tick_s={tick_s!r}: give the scaler's sampling period in seconds (> 0)")
        self.spec = spec
        self.tick_s = float(tick_s)
        self.ahead = ahead
        self.use_costs = ahead and costs
        self.start_samples: deque[float] = deque(maxlen=COST_SAMPLES)
        self.busy_samples: deque[float] = deque(maxlen=COST_SAMPLES)
        self.scaler = ConcurrencyScaler(spec)
        self.keep: KeepAlive = keep_alive_policy(spec.keep_alive)
        self.last_use: float | None = None  # the last arrival or completion (or the deploy)
        self.arrivals = 0
        # Scaling ahead of the burst: the same keep-alive policy told of one arrival per burst.
        self.bursts: KeepAlive = keep_alive_policy(spec.keep_alive)
        self.burst_start: float | None = None
        self.peaks: deque[int] = deque(maxlen=2)  # peak concurrency of the last two bursts (the last runs on)
        # Arrivals less completions, set to busy + queued at each decision (a request that expires
        # in the queue has no completion; the next decision corrects the count).
        self.in_flight = 0
        self.hold = 0  # a predicted burst's workers, kept until hold_until
        self.hold_until = 0.0

    def deployed(self, now: float) -> None:
        """The function was deployed (its pre-warmed workers count as just used, so the keep-alive
        floor holds them as it would after a request)."""
        self._used(now)

    def arrival(self, now: float) -> None:
        self.keep.on_invocation(now)
        self.arrivals += 1
        if self.ahead:
            if self.burst_start is None or (self.in_flight == 0 and (self.last_use is None
                                                                   or now - self.last_use >= BURST_GAP_S)):
                self._burst_begins(now)
            self.in_flight += 1
            if self.in_flight > self.peaks[-1]:
                self.peaks[-1] = self.in_flight
        self._used(now)

    def done(self, now: float, busy_s: float | None = None) -> None:
        """A request finished; ``busy_s``: how long it held its worker (None: not known)."""
        if self.last_use is None or now > self.last_use:  # _used, inlined: once per call served
            self.last_use = now
        if self.in_flight > 0:
            self.in_flight -= 1
        if busy_s is not None and busy_s >= 0:
            self.busy_samples.append(busy_s)

    def started(self, took_s: float) -> None:
        """A worker start took ``took_s`` seconds (decision to ready)."""
        if took_s >= 0:
            self.start_samples.append(took_s)

    def costs(self) -> tuple[float, float] | None:
        """(median start, median service) in seconds, or None before a sample of each (or with the
        cost rules off)."""
        if not self.use_costs or not self.start_samples or not self.busy_samples:
            return None
        return statistics.median(self.start_samples), statistics.median(self.busy_samples)

    def idle_stop_s(self, costs: tuple[float, float] | None = None) -> float:
        """How long an extra worker stays idle before it stops (``costs``: :meth:`costs`, if the
        caller has them already)."""
        c = self.costs() if costs is None else costs
        if c is None:
            return self.spec.panic_window_s
        return min(self.spec.panic_window_s, max(self.tick_s, BREAK_EVEN_STARTS * c[0]))

    def _used(self, now: float) -> None:
        self.last_use = now if self.last_use is None else max(self.last_use, now)

    def _burst_begins(self, now: float) -> None:
        win = self._burst_window()
        if win is not None and win[0] <= now < win[1]:  # it came as predicted: keep what was pre-warmed
            self._hold(now, self.burst_workers())
        self.bursts.on_invocation(now)
        self.burst_start = now
        self.peaks.append(0)

    def _hold(self, now: float, workers: int) -> None:
        held = self.hold if now < self.hold_until else 0
        self.hold, self.hold_until = max(held, workers), now + self.spec.panic_window_s

    def decides_after(self, queued: int, live: int, idle: int) -> bool:
        """After an arrival (once a warm worker took it, if one could) or a completion (once the worker
        took the next request, if any): call :meth:`decide` now only if ``queued`` requests still
        wait and a decision could act for them; else the next tick decides (see the module docstring).

        ``live``: the workers :meth:`decide` would be given (starting, idle and busy); ``idle``: those
        idle. With ``max`` of them live and none idle a decision can do nothing: it starts none (its
        target is at most ``max``) and stops none (only idle workers stop). Under a sustained queue
        that is every arrival and completion, and such a decision cost more CPU than the call it was
        made for (benchmarks/results/queued-ab.json)."""
        return queued > 0 and (idle > 0 or live < self.spec.max)

    def keep_floor(self, now: float) -> tuple[int, float | None]:
        """1 while the keep-alive policy wants the last instance loaded, else 0; and when that changes."""
        if self.last_use is None:
            return 0, None
        keep = self.keep.keep_alive_s(now)
        pre = self.keep.prewarm_after_s(now)
        if pre is None:
            end = self.last_use + keep
            return (1, end) if now < end else (0, None)
        load, end = self.last_use + pre, self.last_use + pre + keep
        if now < load:
            return 0, load
        return (1, end) if now < end else (0, None)

    def burst_workers(self) -> int:
        """The workers the last bursts needed: the smaller peak of the last two, per
        ``target_concurrency``, at most ``max`` (0 before any burst)."""
        if not self.peaks:
            return 0
        need = math.ceil(min(self.peaks) / self.spec.target_concurrency - 1e-9)
        return min(need, self.spec.max)

    def _burst_window(self) -> tuple[float, float] | None:
        """When the burst-level keep-alive policy expects the next burst: its pre-warm window from
        the last burst's start, or None when it predicts none."""
        if not self.ahead or self.burst_start is None:
            return None
        pre = self.bursts.prewarm_after_s(self.burst_start)
        if pre is None:
            return None
        load = self.burst_start + pre
        return load, load + self.bursts.keep_alive_s(self.burst_start)

    def burst_floor(self, now: float) -> tuple[int, float | None]:
        """The burst's size while the next burst is predicted, else 0; and when that changes."""
        win = self._burst_window()
        if win is None:
            return 0, None
        if now < win[0]:
            return 0, win[0]
        return (self.burst_workers(), win[1]) if now < win[1] else (0, None)

    def decide(self, now: float, queued: int, workers: Sequence[WorkerView], *, sample: bool = False) -> PoolDecision:
        """The target worker count now and the starts and stops that reach it."""
        if queued < 0:
            raise ConfigError(f"queued={queued!r}: give the number of waiting requests (>= 0)")
        s = self.spec
        idle = sorted((w for w in workers if w.state == "idle"), key=lambda w: (w.since, w.id))
        starting = sum(1 for w in workers if w.state == "starting")
        busy = sum(1 for w in workers if w.state == "busy")
        live = len(workers)
        if sample:
            self.scaler.observe(now, busy + queued)
        floor, floor_change = self.keep_floor(now)
        costs = self.costs()
        cheap = costs is not None and costs[0] <= CHEAP_START_SHARE * costs[1]
        recheck: float | None = None
        scaled = self.scaler.desired(now, live)  # called either way: it keeps its panic state
        # Cheap starts: the scaler's count holds no headroom, but still the last worker until no
        # request has come for scale_to_zero_grace_s (a function goes to zero as it did).
        want = max(s.min, floor, min(scaled, 1) if cheap else scaled)
        if queued > 0:  # never zero while a request waits (from zero, the start comes at once)
            want = max(want, 1)
        changes = [floor_change]
        if self.ahead:
            self.in_flight = busy + queued
            burst, burst_change = self.burst_floor(now)
            changes.append(burst_change)
            if self.hold and now < self.hold_until and busy + queued >= self.hold:
                self.hold_until = now + s.panic_window_s  # the held workers are all still needed
            if now >= self.hold_until:
                self.hold = 0
            if cheap:
                assert costs is not None
                fast, recheck = _starts_for_waiting(now, queued, workers, *costs, room=s.max - live)
                # The workers in use (busy, starting) are held; idle ones only by the floors.
                used = live + fast if fast > 0 else busy + starting
                want = max(want, burst, self.hold, used)
            else:
                need = math.ceil((busy + queued) / s.target_concurrency - 1e-9)
                unmet = queued - len(idle) - starting
                fast = min(unmet, need - live)
                # Requests in demand hold the workers they need (never more than live plus the fast path).
                want = max(want, burst, self.hold, min(live + max(fast, 0), need))
        want = min(want, s.max)
        start = max(0, want - live)
        cold = min(start, max(0, queued - len(idle) - starting))
        stop: tuple[int, ...] = ()
        if live > want:
            # Ahead of the burst, an extra worker stops only once idle for a panic window: one that
            # went idle a moment ago is part of the burst still running (else starts and stops flap).
            hold_s = self.idle_stop_s(costs)
            quiet = idle if not self.ahead else [w for w in idle if now - w.since >= hold_s]
            stop = tuple(w.id for w in quiet[:live - want])
        # Keep sampling while anything is up or waiting (the scaler's windows move with time); else
        # sleep until a floor changes (a pre-warm, or an expiry).
        active = live > 0 or queued > 0 or self.scaler.panicking
        pending = [c for c in changes if c is not None]
        nxt = now + self.tick_s if active else (min(pending) if pending else None)
        if recheck is not None:  # a request left to a busy worker: look again if it is late
            nxt = recheck if nxt is None else min(nxt, recheck)
        return PoolDecision(want, start, cold, stop, nxt)


def _starts_for_waiting(now: float, queued: int, workers: Sequence[WorkerView], start_s: float,
                        service_s: float, room: int) -> tuple[int, float | None]:
    """How many of ``queued`` waiting requests (in order) a new worker would serve sooner than the
    workers there are (at most ``room``), and when to decide again if any was left to a busy or
    starting worker (that worker's expected free time plus a start). Each worker is expected free:
    idle now, starting once started (its state's ``since`` plus ``start_s``), busy at ``since +
    service_s`` (if past, a service from now); each request served takes ``service_s``.

    It stops at ``room`` starts: past that the answer cannot change, and an overloaded pool's queue
    (thousands) must not cost a pass per arrival. Before that, each worker takes at most a couple of
    requests within a start of now (a start is at most half a service), so the pass is short."""
    if room <= 0:
        return 0, None
    free: list[float] = []
    for w in workers:
        if w.state == "idle":
            free.append(now)
        elif w.state == "starting":
            free.append(max(now, w.since + start_s))
        else:
            due = w.since + service_s
            free.append(due if due > now else now + service_s)
    heapq.heapify(free)
    starts = 0
    recheck: float | None = None
    for _ in range(queued):
        first = free[0] if free else math.inf
        if first - now > start_s:  # a new worker is ready first
            starts += 1
            if starts == room:
                break
            heapq.heappush(free, now + start_s + service_s)
        else:
            if first > now:
                late = first + start_s
                recheck = late if recheck is None else min(recheck, late)
            heapq.heapreplace(free, first + service_s)
    return starts, recheck
