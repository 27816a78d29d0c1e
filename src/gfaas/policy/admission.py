"""Admission control: how many invocations of a workflow may be in flight, and whether to take one more.

Issue 23: under overload a server's goodput collapses when it admits everything (every request waits
longer than its client will, and the work done for it is wasted) and holds when it admits what it can
finish in time and refuses the rest at once. :class:`AdaptiveLimit` keeps one workflow's limit the way
Netflix's concurrency-limits (its "gradient" limiters) and Envoy's adaptive concurrency filter do,
restated here from their documentation (no code of theirs was used):

* it tracks two averages of finished invocations: the baseline, what an invocation takes when it
  does not queue, and the latency it has now. The baseline is the runtime's own measure of the
  time each invocation spent outside its queues when the caller has it (``service_s``); else a slow
  average of the latency (which drifts up under sustained queueing: the caller should pass
  ``service_s`` where it can);
* after each finished invocation, ``gradient = clamp(tolerance * slow / fast, 0.5, 1)`` shrinks the
  limit while latency rises above the baseline, and ``sqrt(limit)`` of head-room lets it grow when
  latency is at the baseline: ``new = limit * gradient + sqrt(limit)``, smoothed;
* a request is admitted while the in-flight count is under the limit and nobody waits; else it may
  wait in the caller's queue (at most ``max_waiting``), if its deadline allows: the wait it would see
  (the invocations ahead of it over the recent completion rate) plus the fast latency must fit in
  its timeout. Otherwise it is refused at once, with a ``Retry-After`` of about the time the excess
  needs to drain. Each completion lets :meth:`release` admit one waiter (the caller wakes exactly
  that one), so the runtime behind sees about ``limit`` invocations however many clients wait.
* the excess counts the clients refused earlier and told to come back later than now (``deferred``):
  they are ahead of a client refused now. Without them, under a full queue, a thousand refused clients
  were all told 1 s, came back together, found the queue as full, and were refused again; counting
  them spreads the returns over the time the backlog really needs (fewer refusals of clients that
  honour ``Retry-After``: ``benchmarks/results/overload-retry-ab.json``).

Pure and clock-injected: the caller passes ``now`` and the latencies it measured.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from ..errors import ConfigError

__all__ = ["Admission", "AdaptiveLimit"]

MAX_PROMISED = 1 << 16  # refused clients' returns remembered (past it, later refusals are not counted)


@dataclass(frozen=True)
class Admission:
    """An admission decision: ``ok`` (admitted now), ``wait`` (queue for :meth:`AdaptiveLimit.release`),
    or neither: refused with ``reason`` and ``retry_after_s``."""

    ok: bool
    retry_after_s: float = 0.0
    reason: str = ""
    wait: bool = False


class AdaptiveLimit:
    """One workflow's concurrency limit and deadline check (see the module docstring)."""

    def __init__(self, initial: int = 64, min_limit: int = 4, max_limit: int = 4096, tolerance: float = 1.5,
                 smoothing: float = 0.2, slow_n: int = 500, fast_n: int = 20, rate_window_s: float = 2.0,
                 max_waiting: int = 1024) -> None:
        if not 1 <= min_limit <= initial <= max_limit:
            raise ConfigError(f"admission limits must satisfy 1 <= min_limit ({min_limit}) <= initial ({initial}) "
                              f"<= max_limit ({max_limit})")
        if not tolerance >= 1 or not 0 < smoothing <= 1 or slow_n < fast_n or fast_n < 1 or not rate_window_s > 0:
            raise ConfigError("admission: tolerance >= 1, 0 < smoothing <= 1, slow_n >= fast_n >= 1 and "
                              "rate_window_s > 0 are needed")
        self.limit = float(initial)
        self.min_limit, self.max_limit = min_limit, max_limit
        self.tolerance, self.smoothing = tolerance, smoothing
        self._a_slow, self._a_fast = 2.0 / (slow_n + 1), 2.0 / (fast_n + 1)
        self.slow: float | None = None  # seconds
        self.fast: float | None = None
        self.rate_window_s = rate_window_s
        self._done: deque[float] = deque()  # completion times within the rate window
        self._first_done: float | None = None
        if max_waiting < 0:
            raise ConfigError(f"admission: max_waiting={max_waiting} must be >= 0")
        self.max_waiting = max_waiting
        self.in_flight = 0
        self.admitted = 0
        self.refused = 0
        self._promised: list[float] = []  # a heap of the times refused clients were told to come back

    def deferred(self, now: float) -> int:
        """Refused clients told to come back after ``now`` (see the module docstring)."""
        promised = self._promised
        while promised and promised[0] <= now:
            heapq.heappop(promised)
        return len(promised)

    def count_refusal(self, now: float, decision: Admission) -> None:
        """Count a refusal made (as :meth:`refusal` does with ``count=True``) and the return it asked
        for: the whole seconds of its ``Retry-After`` header."""
        self.refused += 1
        if len(self._promised) < MAX_PROMISED:
            heapq.heappush(self._promised, now + max(1.0, math.ceil(decision.retry_after_s)))

    def rate(self, now: float) -> float:
        """Completions per second over the last ``rate_window_s``; 0 until a whole window has passed
        since the first completion with at least 10 completions in it (before that, a rate counted
        while the first invocations are still in flight would be far too low to predict waits)."""
        while self._done and self._done[0] <= now - self.rate_window_s:
            self._done.popleft()
        if self._first_done is None or now - self._first_done < self.rate_window_s or len(self._done) < 10:
            return 0.0
        return len(self._done) / self.rate_window_s

    @property
    def cap(self) -> int:
        return max(self.min_limit, int(self.limit))

    def admit(self, now: float, timeout_s: float | None = None, waiting: int = 0) -> Admission:
        """Take one more invocation now (counted in flight until :meth:`finished`), let it wait
        behind the ``waiting`` ones, or refuse it."""
        refused = self.refusal(now, timeout_s, waiting)
        if refused is not None:
            return refused
        if self.in_flight < self.cap and waiting == 0:
            self.in_flight += 1
            self.admitted += 1
            return Admission(True)
        return Admission(False, wait=True)

    def refusal(self, now: float, timeout_s: float | None = None, waiting: int = 0, *,
                count: bool = True) -> Admission | None:
        """The refusal :meth:`admit` would answer now (counted as one unless ``count`` is False), or
        None when it would admit the request or let it wait; takes no place. A server can answer
        refusals with this before it has built anything for the request, and hand the rest to
        :meth:`admit`."""
        cap = self.cap
        rate = self.rate(now)
        ahead = self.in_flight + waiting
        out: Admission | None = None
        if timeout_s is not None and rate > 0 and self.fast is not None:
            expected = ahead / rate + self.fast
            if expected > timeout_s:
                out = Admission(False, self._drain(ahead + self.deferred(now), rate),
                                f"it would finish in about {expected:.2f} s ({ahead} ahead at "
                                f"{rate:.0f}/s), after its timeout of {timeout_s:g} s")
        if out is None and (self.in_flight >= cap or waiting > 0) and waiting >= self.max_waiting:
            deferred = self.deferred(now)
            out = Admission(False, self._drain(ahead - cap + 1 + deferred, rate),
                            f"{self.in_flight} invocations in flight (the limit now is {cap}) and {waiting} "
                            f"waiting (max_waiting={self.max_waiting})" +
                            (f"; {deferred} refused clients are due back before you" if deferred else ""))
        if out is not None and count:
            self.count_refusal(now, out)
        return out

    def release(self) -> bool:
        """Whether one waiter may be admitted now (then it counts in flight)."""
        if self.in_flight < self.cap:
            self.in_flight += 1
            self.admitted += 1
            return True
        return False

    @staticmethod
    def _drain(excess: int, rate: float) -> float:
        return min(30.0, max(1.0, excess / rate)) if rate > 0 else 1.0

    def finished(self, now: float, latency_s: float | None, service_s: float | None = None) -> None:
        """An admitted invocation ended; ``latency_s`` None when it did not complete (a timeout or an
        error: it frees its place but says nothing of the latency). ``service_s``: the part of it not
        spent queueing (the baseline)."""
        self.in_flight = max(0, self.in_flight - 1)
        if latency_s is None or not latency_s >= 0:
            return
        self._done.append(now)
        if self._first_done is None:
            self._first_done = now
        base = latency_s if service_s is None or not service_s >= 0 else min(service_s, latency_s)
        if self.slow is None or self.fast is None:
            self.slow, self.fast = base, latency_s
            return
        self.slow += (self._a_fast if service_s is not None else self._a_slow) * (base - self.slow)
        self.fast += self._a_fast * (latency_s - self.fast)
        grad = max(0.5, min(1.0, self.tolerance * self.slow / self.fast)) if self.fast > 0 else 1.0
        new = self.limit * grad + math.sqrt(self.limit)
        self.limit = min(float(self.max_limit), max(float(self.min_limit),
                                                    (1 - self.smoothing) * self.limit + self.smoothing * new))
