"""Autoscaling decisions: how many workers a function wants, and how long an idle one stays loaded.

Pure and clock-injected (every call takes ``now`` in seconds; no wall clock, threads or files), so
the runtime and the keep-alive simulator (``gfaas sim keepalive``) run the same objects.

* :class:`ConcurrencyScaler`: a concurrency-target scaler in the manner of Knative's KPA. It averages
  the observed concurrency (in-flight plus queued requests) over a *stable* window and a shorter
  *panic* window; the desired count is ``ceil(average / target_concurrency)``, clamped to
  ``[min, max]``. When the panic-window demand reaches ``panic_threshold`` times the current
  capacity it enters panic mode: it follows the panic window and never scales down until a whole
  stable window passes without the panic condition. It returns 0 (with ``min == 0``) only after no
  request was seen for ``scale_to_zero_grace_s``.
* Keep-alive / pre-warm policies (:func:`keep_alive_policy`), one instance per function:

  - ``fixed:N``: keep an idle instance N minutes after each use, never pre-warm (Lambda-style).
  - ``hybrid``: our restatement of the hybrid histogram policy of Shahrad et al., "Serverless in the
    Wild" (USENIX ATC'20), written from the paper's description (no code of theirs was used). Each
    function keeps a histogram of its idle times (time between consecutive invocations) over a
    4-hour range in 1-minute bins. When the histogram is *representative* (at least
    ``min_samples`` idle times and a coefficient of variation of the bin counts of at least
    ``cv_threshold``, i.e. the idle times concentrate in a few bins rather than spread flat), the
    instance is unloaded after each use and pre-loaded at the 5th percentile idle time (less a 10%
    margin), then kept until the 99th percentile (plus a 10% margin). When it is not representative,
    a standard keep-alive of the whole 4-hour range applies. When more than ``oob_fraction`` of the
    idle times fall beyond the range, a time-series forecast takes over: we use simple exponential
    smoothing (alpha 0.5) of the out-of-range idle times instead of the paper's ARIMA, pre-warming at
    85% of the forecast and keeping the instance for 30% of it (a +-15% band around the forecast).
  - ``gfaas``: gfaas's default (``gfaas:<C>`` sets its price). A cold start is worth ``C``
    *break-even minutes* of an idle instance (default 40). (1) *Ski rental while learning*: until a
    function has ``min_samples`` (10) idle times, keep the instance C minutes (at most 4 hours):
    with nothing known, keeping for the break-even time costs at most twice the best choice in
    hindsight, where hybrid holds every new function for 4 hours. (2) *Periodic functions*: when
    the last four idle times agree within a minute, or 80% of the histogram lies within a minute of
    its fullest bin (periods over 2 minutes), unload after use, pre-load one minute before the
    expected invocation and keep for three minutes. (3) *Priced histogram* otherwise: choose the
    keep-alive K maximising ``hits(K) - idle_minutes(K) / C`` over the recency-weighted idle-time
    histogram (each idle time weighs 1/0.98 times the one before), plus a 10% margin. One price
    for all functions spends idle memory where it saves the most cold starts (a Pareto-efficient
    allocation), which a fixed keep-alive, the same for every function, cannot.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

from ..errors import ConfigError

__all__ = [
    "ConcurrencyScaler",
    "FixedKeepAlive",
    "GfaasKeepAlive",
    "HybridKeepAlive",
    "KeepAlive",
    "ScalingSpec",
    "keep_alive_policy",
    "parse_scaling",
]

_KEEP_ALIVE_FORMS = "'fixed:<minutes>' (e.g. fixed:10), 'hybrid', 'gfaas' or 'gfaas:<break-even minutes>'"


@dataclass(frozen=True)
class ScalingSpec:
    """A function's scaling settings (the ``scaling:`` mapping of a workflow spec)."""

    min: int = 0  # workers kept even when idle (0 allows scale to zero)
    max: int = 1  # never more workers than this
    target_concurrency: float = 1.0  # in-flight requests per worker the scaler aims for
    keep_alive: str = "gfaas"  # keep-alive/pre-warm policy: "fixed:<minutes>", "hybrid", "gfaas"
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0  # panic when the short-window demand >= threshold x current capacity
    scale_to_zero_grace_s: float = 30.0

    def __post_init__(self) -> None:
        def bad(field: str, fix: str) -> ConfigError:
            return ConfigError(f"scaling.{field} = {getattr(self, field)!r}: {fix}")

        if not isinstance(self.min, int) or isinstance(self.min, bool) or self.min < 0:
            raise bad("min", "give a whole number of workers >= 0 (0 allows scale to zero)")
        if not isinstance(self.max, int) or isinstance(self.max, bool) or self.max < max(self.min, 1):
            raise bad("max", f"give a whole number >= max(min, 1) = {max(self.min, 1)}")
        if not self.target_concurrency > 0:
            raise bad("target_concurrency", "give a number of in-flight requests per worker > 0")
        for f in ("stable_window_s", "panic_window_s", "scale_to_zero_grace_s"):
            if not getattr(self, f) > 0:
                raise bad(f, "give a number of seconds > 0")
        if self.panic_window_s > self.stable_window_s:
            raise bad("panic_window_s", f"the panic window must not be longer than stable_window_s "
                                        f"({self.stable_window_s})")
        if not self.panic_threshold >= 1:
            raise bad("panic_threshold", "give a factor >= 1 of the current capacity")
        keep_alive_policy(self.keep_alive)  # validates the name


def parse_scaling(obj: Mapping[str, Any] | None) -> ScalingSpec:
    """A :class:`ScalingSpec` from a spec's ``scaling:`` mapping (None or empty: the defaults)."""
    if obj is None:
        return ScalingSpec()
    if not isinstance(obj, Mapping):
        raise ConfigError(f"scaling: expected a mapping, got {type(obj).__name__} ({obj!r})")
    known = [f.name for f in fields(ScalingSpec)]
    unknown = sorted(str(k) for k in obj if k not in known)
    if unknown:
        raise ConfigError(f"scaling: unknown key(s) {', '.join(unknown)}; known keys: {', '.join(known)}")
    args: dict[str, Any] = {}
    for k, v in obj.items():
        if k in ("min", "max"):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"scaling.{k} = {v!r}: give a whole number of workers")
        elif k == "keep_alive":
            if not isinstance(v, str):
                raise ConfigError(f"scaling.keep_alive = {v!r}: give {_KEEP_ALIVE_FORMS}")
        else:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ConfigError(f"scaling.{k} = {v!r}: give a number")
            v = float(v)
        args[str(k)] = v
    return ScalingSpec(**args)


class ConcurrencyScaler:
    """Knative-KPA-like: observes concurrency samples, decides a desired worker count."""

    def __init__(self, spec: ScalingSpec) -> None:
        self.spec = spec
        self._samples: deque[tuple[float, float]] = deque()
        self._total = 0.0  # the sum of the samples' concurrency (whole numbers: exact in a float)
        self._last_request: float | None = None  # last time a sample showed demand
        self._panic_since: float | None = None
        self._last_panic_condition: float | None = None
        self._panic_peak = 0

    @property
    def panicking(self) -> bool:
        return self._panic_since is not None

    def observe(self, now: float, concurrency: float) -> None:
        """Record the in-flight plus queued requests at ``now`` (times must not go backwards)."""
        if self._samples and now < self._samples[-1][0]:
            raise ConfigError(f"scaler sample at {now} s is earlier than the last one at "
                              f"{self._samples[-1][0]} s; pass non-decreasing times")
        if not concurrency >= 0:
            raise ConfigError(f"concurrency {concurrency!r} at {now} s: pass a count >= 0")
        self._samples.append((now, float(concurrency)))
        self._total += float(concurrency)
        if concurrency > 0:
            self._last_request = now
        self._prune(now)

    def _prune(self, now: float) -> None:
        horizon = now - self.spec.stable_window_s
        while self._samples and self._samples[0][0] <= horizon:
            self._total -= self._samples.popleft()[1]
        if not self._samples:
            self._total = 0.0

    def _average(self, now: float, window: float) -> float:
        """The mean of the samples in ``(now - window, now]``. Called on every decision,
        so it costs O(samples in the window) only for windows shorter than the stable one (panic);
        the stable window's is a running sum (the samples are pruned to it)."""
        if window >= self.spec.stable_window_s:  # every sample kept is newer than now - window
            total, n = self._total, len(self._samples)
            for t, c in reversed(self._samples):  # a decision made with a clock read before a sample
                if t <= now:
                    break
                total, n = total - c, n - 1
            return total / n if n > 0 else 0.0
        total, n = 0.0, 0
        for t, c in reversed(self._samples):
            if t <= now - window:
                break
            if t <= now:
                total, n = total + c, n + 1
        return total / n if n > 0 else 0.0

    def desired(self, now: float, current: int) -> int:
        """The worker count to aim for now, given ``current`` workers (clamped to [min, max])."""
        s = self.spec
        self._prune(now)
        want_stable = math.ceil(self._average(now, s.stable_window_s) / s.target_concurrency - 1e-9)
        panic_demand = self._average(now, s.panic_window_s) / s.target_concurrency
        want_panic = math.ceil(panic_demand - 1e-9)
        if panic_demand > 0 and panic_demand >= s.panic_threshold * max(current, 1):
            if self._panic_since is None:
                self._panic_since = now
                self._panic_peak = current
            self._last_panic_condition = now
        elif (self._panic_since is not None and self._last_panic_condition is not None
              and now - self._last_panic_condition >= s.stable_window_s):
            self._panic_since = None
            self._panic_peak = 0
        if self._panic_since is not None:
            # Panic: follow the short window, never below what we already had (no scale-down).
            self._panic_peak = max(self._panic_peak, current, want_panic)
            want = self._panic_peak
        else:
            want = want_stable
        want = min(max(want, s.min), s.max)
        if want == 0:
            idle_long = self._last_request is None or now - self._last_request >= s.scale_to_zero_grace_s
            if not idle_long:
                want = 1
        return want


class KeepAlive(Protocol):
    """A function's keep-alive / pre-warm policy (one instance per function)."""

    def on_invocation(self, now: float) -> None:
        """An invocation arrives at ``now`` (an idle period, if any, ends)."""

    def keep_alive_s(self, now: float) -> float:
        """How long an idle instance is kept after its last use (after the pre-warm load if any)."""

    def prewarm_after_s(self, now: float) -> float | None:
        """None: keep the instance loaded; else unload it right after use and load it again this many
        seconds after the last invocation."""


class FixedKeepAlive:
    """Keep an idle instance ``minutes`` after each use; never pre-warm."""

    #: Its decisions never depend on the history: the simulator may evaluate it in closed form.
    stationary = True

    def __init__(self, minutes: float) -> None:
        if not (isinstance(minutes, int | float) and math.isfinite(minutes) and minutes > 0):
            raise ConfigError(f"fixed keep-alive of {minutes!r} minutes: give minutes > 0, e.g. fixed:10")
        self.minutes = float(minutes)

    @property
    def name(self) -> str:
        return f"fixed:{self.minutes:g}"

    def on_invocation(self, now: float) -> None:
        pass

    def keep_alive_s(self, now: float) -> float:
        return self.minutes * 60.0

    def prewarm_after_s(self, now: float) -> float | None:
        return None


RANGE_MIN = 240  # histogram range in 1-minute bins: 4 hours (ATC'20)


class _IdleHistogram:
    """Idle times (minutes, 1-minute bins) of one function, with out-of-range bookkeeping."""

    def __init__(self, decay: float = 1.0) -> None:
        self.counts = [0.0] * RANGE_MIN
        self.total = 0.0  # in-range weight
        self.sumsq = 0.0
        self.n = 0  # idle times seen (in and out of range)
        self.oob = 0.0  # weight of out-of-range idle times
        self.decay = decay
        self.forecast_min: float | None = None  # exponential smoothing of out-of-range idle times
        self.recent: deque[int] = deque(maxlen=4)
        self.last: float | None = None
        self.weight = 1.0
        self.lo, self.hi = RANGE_MIN, -1  # lowest and highest occupied bins

    def add(self, now: float) -> None:
        last, self.last = self.last, now
        if last is None:
            return
        idle_min = max(0.0, (now - last) / 60.0)
        b = int(idle_min)
        self.n += 1
        # Recency without touching every bin: each new idle time weighs 1/decay times the one before
        # (the same ratios as decaying all old counts), renormalised before the weights overflow.
        w = self.weight
        if self.decay != 1.0:
            self.weight = w = w / self.decay
            if w > 1e100:
                self.counts = [c / w for c in self.counts]
                self.total /= w
                self.sumsq /= w * w
                self.oob /= w
                self.weight = w = 1.0
        if b >= RANGE_MIN:
            self.oob += w
            f = self.forecast_min
            self.forecast_min = idle_min if f is None else 0.5 * idle_min + 0.5 * f
            self.recent.append(b)
            return
        if b > self.hi:
            self.hi = b
        if b < self.lo:
            self.lo = b
        c = self.counts[b]
        self.counts[b] = c + w
        self.total += w
        self.sumsq += 2 * c * w + w * w
        self.recent.append(b)

    def cv(self) -> float:
        mean = self.total / RANGE_MIN
        if mean <= 0:
            return 0.0
        var = max(0.0, self.sumsq / RANGE_MIN - mean * mean)
        return math.sqrt(var) / mean

    def percentile_bin(self, q: float) -> int:
        """The bin holding the q-th percentile (0 < q < 100) of the in-range idle times."""
        target = self.total * q / 100.0
        if q <= 50:
            acc = 0.0
            for b in range(self.lo, self.hi + 1):
                c = self.counts[b]
                acc += c
                if acc >= target and c > 0:
                    return b
            return RANGE_MIN - 1
        acc = 0.0
        above = self.total - target  # weight allowed above the percentile
        for b in range(self.hi, self.lo - 1, -1):
            c = self.counts[b]
            acc += c
            if acc > above + 1e-12 and c > 0:
                return b
        return 0


def _window(pre_bin: int, keep_bin: int, margin: float) -> tuple[float, float | None]:
    """(keep-alive s, pre-warm s or None) from the head and tail bins with a margin."""
    prewarm_min = pre_bin * (1.0 - margin)
    keep_min = (keep_bin + 1) * (1.0 + margin) - prewarm_min
    if prewarm_min < 1.0:  # a pre-warm within the first minute: just keep the instance loaded
        return keep_min * 60.0 + prewarm_min * 60.0, None
    return keep_min * 60.0, prewarm_min * 60.0


class HybridKeepAlive:
    """The hybrid histogram policy of Shahrad et al. (ATC'20), restated (see the module docstring)."""

    name = "hybrid"

    def __init__(self, *, min_samples: int = 10, cv_threshold: float = 2.0, oob_fraction: float = 0.5,
                 head: float = 5.0, tail: float = 99.0, margin: float = 0.1) -> None:
        self.hist = _IdleHistogram()
        self.min_samples, self.cv_threshold, self.oob_fraction = min_samples, cv_threshold, oob_fraction
        self.head, self.tail, self.margin = head, tail, margin
        self._decision: tuple[float, float | None] = (RANGE_MIN * 60.0, None)
        self._stale = False  # an idle time came since _decision: worked out when next read, not per call

    def on_invocation(self, now: float) -> None:
        self.hist.add(now)
        self._stale = True

    def _current(self) -> tuple[float, float | None]:
        if self._stale:
            self._decision, self._stale = self._decide(), False
        return self._decision

    def _decide(self) -> tuple[float, float | None]:
        h = self.hist
        if h.n and h.oob / (h.oob + h.total) > self.oob_fraction and h.forecast_min is not None:
            return _forecast_window(h.forecast_min)
        if h.n < self.min_samples or h.cv() < self.cv_threshold:
            return RANGE_MIN * 60.0, None  # standard keep-alive: the whole range
        return _window(h.percentile_bin(self.head), h.percentile_bin(self.tail), self.margin)

    def keep_alive_s(self, now: float) -> float:
        return self._current()[0]

    def prewarm_after_s(self, now: float) -> float | None:
        return self._current()[1]


def _forecast_window(forecast_min: float) -> tuple[float, float | None]:
    """Pre-warm at 85% of the forecast idle time and keep for 30% of it (a +-15% band)."""
    return 0.30 * forecast_min * 60.0, 0.85 * forecast_min * 60.0


class GfaasKeepAlive:
    """gfaas's keep-alive: ski rental while it learns, then a priced idle-time histogram, with
    periodic functions pre-warmed (see the module docstring)."""

    def __init__(self, break_even_min: float = 40.0, *, min_samples: int = 10, margin: float = 0.1,
                 decay: float = 0.98, periodic_tolerance_min: int = 1, periodic_share: float = 0.8) -> None:
        if not (math.isfinite(break_even_min) and break_even_min > 0):
            raise ConfigError(f"gfaas keep-alive break-even of {break_even_min!r} minutes: give minutes > 0, "
                              f"e.g. gfaas:40")
        self.hist = _IdleHistogram(decay)
        self.break_even_min = float(break_even_min)
        self.min_samples, self.margin = min_samples, margin
        self.tol = periodic_tolerance_min
        self.periodic_share = periodic_share
        # Ski rental: keeping an instance longer than a cold start is worth never pays on its own, and
        # keeping it exactly that long costs at most twice the best choice made in hindsight.
        self.learning_keep_s = min(self.break_even_min, RANGE_MIN) * 60.0
        self._decision: tuple[float, float | None] = (self.learning_keep_s, None)
        self._stale = False  # an idle time came since _decision: worked out when next read, not per call

    @property
    def name(self) -> str:
        return "gfaas" if self.break_even_min == 40.0 else f"gfaas:{self.break_even_min:g}"

    def on_invocation(self, now: float) -> None:
        self.hist.add(now)
        self._stale = True

    def _current(self) -> tuple[float, float | None]:
        if self._stale:
            self._decision, self._stale = self._decide(), False
        return self._decision

    def _decide(self) -> tuple[float, float | None]:
        h = self.hist
        if h.n == 0:
            return self.learning_keep_s, None
        recent = list(h.recent)
        if len(recent) >= 3:
            med = sorted(recent)[len(recent) // 2]
            if med > 2 * self.tol and all(abs(b - med) <= self.tol for b in recent):
                return _window(med - self.tol, med + self.tol, 0.0)  # periodic: a window around the period
        mode = self._mode(h)
        if mode is not None and mode > 2 * self.tol:
            return _window(mode - self.tol, mode + self.tol, 0.0)
        keep = self._priced_keep(h)
        if h.n < self.min_samples:
            keep = max(keep, self.learning_keep_s)
        return keep, None

    def _mode(self, h: _IdleHistogram) -> int | None:
        """The period (bin) when at least ``periodic_share`` of the weight lies within the tolerance
        of the fullest bin, else None."""
        if h.n < 3 or h.hi < 0:
            return None
        counts = h.counts
        best = max(range(h.lo, h.hi + 1), key=counts.__getitem__)
        near = sum(counts[max(0, best - self.tol): best + self.tol + 1])
        return best if near >= self.periodic_share * (h.total + h.oob) else None

    def _priced_keep(self, h: _IdleHistogram) -> float:
        """The keep-alive K (s) that maximises hits(K) - idle_minutes(K) / break_even_min over the
        (recency-weighted) idle times seen: each warm start must pay for the idle minutes it costs."""
        total = h.total + h.oob
        best_k, best = 0.0, 0.0
        hits = below = 0.0
        counts = h.counts
        for b in range(h.lo, h.hi + 1):
            c = counts[b]
            if c <= 0:
                continue
            hits += c
            below += c * b
            k = b + 1.0
            score = hits - (below + (total - hits) * k) / self.break_even_min
            if score > best:
                best, best_k = score, k
        return best_k * 60.0 * (1.0 + self.margin)

    def keep_alive_s(self, now: float) -> float:
        return self._current()[0]

    def prewarm_after_s(self, now: float) -> float | None:
        return self._current()[1]


def keep_alive_policy(name: str) -> KeepAlive:
    """A fresh policy object by name: ``fixed:<minutes>``, ``hybrid`` or ``gfaas``."""
    if not isinstance(name, str):
        raise ConfigError(f"keep-alive policy {name!r}: give {_KEEP_ALIVE_FORMS}")
    n = name.strip().lower()
    if n == "hybrid":
        return HybridKeepAlive()
    if n == "gfaas":
        return GfaasKeepAlive()
    for prefix, make, what in (("gfaas:", GfaasKeepAlive, "break-even minutes"), ("fixed:", FixedKeepAlive, "minutes")):
        if n.startswith(prefix):
            try:
                minutes = float(n[len(prefix):])
            except ValueError:
                raise ConfigError(f"keep-alive policy {name!r}: the {what} must be a number > 0; give "
                                  f"{_KEEP_ALIVE_FORMS}") from None
            return make(minutes)
    raise ConfigError(f"unknown keep-alive policy {name!r}; give {_KEEP_ALIVE_FORMS}")
