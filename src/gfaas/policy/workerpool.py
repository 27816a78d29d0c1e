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
  :meth:`decides_after` says it can change anything: only while requests wait. With none waiting
  there is nothing to start for, and a stop of a worker that just went idle waits for the next tick
  (at most ``tick_s``), so a warm call costs no decision at all.

The target count is ``max(min, scaler's count, keep-alive floor)``, at most ``max``:

* the scaler's count follows the demand (stable and panic windows); it reaches 0 only when no
  request was seen for ``scale_to_zero_grace_s``;
* the keep-alive floor is 1 while the keep-alive policy wants the last instance loaded: for
  ``keep_alive_s`` after the last use, or, for a pre-warmed function, from ``prewarm_after_s`` after
  the last use for ``keep_alive_s``; else 0. So a function goes to zero only when both allow it;
* a request that arrives while the function has no worker starts one at once, without waiting for
  a tick (the scale-from-zero path); beyond one worker, scaling out waits for the scaler's tick, so
  a queue that forms for a moment does not start a worker that the stable window then stops.

A start made while requests wait for a worker (more queued requests than idle and starting
workers) is a **cold start**; others (the floor, the minimum, a pre-warm) are not. Extra workers
stop only when idle, the longest idle first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError
from .autoscale import ConcurrencyScaler, KeepAlive, ScalingSpec, keep_alive_policy

__all__ = ["PoolDecision", "WorkerPoolPolicy", "WorkerView"]

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

    def __init__(self, spec: ScalingSpec, tick_s: float = 0.5) -> None:
        if not tick_s > 0:
            raise ConfigError(f"tick_s={tick_s!r}: give the scaler's sampling period in seconds (> 0)")
        self.spec = spec
        self.tick_s = float(tick_s)
        self.scaler = ConcurrencyScaler(spec)
        self.keep: KeepAlive = keep_alive_policy(spec.keep_alive)
        self.last_use: float | None = None  # the last arrival or completion (or the deploy)
        self.arrivals = 0

    def deployed(self, now: float) -> None:
        """The function was deployed (its pre-warmed workers count as just used, so the keep-alive
        floor holds them as it would after a request)."""
        self._used(now)

    def arrival(self, now: float) -> None:
        self.keep.on_invocation(now)
        self.arrivals += 1
        self._used(now)

    def done(self, now: float) -> None:
        if self.last_use is None or now > self.last_use:  # _used, inlined: once per call served
            self.last_use = now

    def _used(self, now: float) -> None:
        self.last_use = now if self.last_use is None else max(self.last_use, now)

    @staticmethod
    def decides_after(queued: int) -> bool:
        """After an arrival (once a warm worker took it, if one could) or a completion (once the worker
        took the next request, if any): call :meth:`decide` now only if ``queued`` requests still
        wait; else the next tick decides (see the module docstring)."""
        return queued > 0

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
        want = max(s.min, floor, self.scaler.desired(now, live))
        if queued > 0:  # never zero while a request waits (from zero, the start comes at once)
            want = max(want, 1)
        want = min(want, s.max)
        start = max(0, want - live)
        cold = min(start, max(0, queued - len(idle) - starting))
        stop: tuple[int, ...] = ()
        if live > want:
            stop = tuple(w.id for w in idle[:live - want])
        # Keep sampling while anything is up or waiting (the scaler's windows move with time); else
        # sleep until the keep-alive floor changes (a pre-warm, or an expiry).
        active = live > 0 or queued > 0 or self.scaler.panicking
        nxt = now + self.tick_s if active else floor_change
        return PoolDecision(want, start, cold, stop, nxt)
