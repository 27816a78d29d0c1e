"""A seeded synthetic day of serverless functions, per-minute invocation counts (``gfaas sim keepalive``).

Shahrad et al. ("Serverless in the Wild", USENIX ATC'20) characterise the Azure Functions 2019 trace:
most functions are invoked rarely, popularity spans many orders of magnitude, timer triggers give
periodic functions, and others arrive in bursts. The real trace is not reachable from these machines,
so this generator gives a day with that shape. The shapes come from the paper; every *number* below
is our choice (a parameter of :func:`synthetic_day`), not a value measured in the paper.

Each function is one of three kinds (``mix``, default 50% sporadic, 30% periodic, 20% bursty):

* **sporadic**: independent Poisson counts per minute at a daily rate drawn from a lognormal with
  median ``SPORADIC_MEDIAN_PER_DAY`` (6) and sigma ``SPORADIC_SIGMA`` (2.0), clipped to [1, 20,000]:
  about three quarters of them see at most one invocation an hour, a few are invoked every minute
  (the heavy tail of popularity).
* **periodic** (timer triggers): one firing every ``period`` minutes, the period drawn from
  ``PERIODS_MIN`` with weights ``PERIOD_WEIGHTS`` (1 minute to 1 day), a random phase, each firing
  one minute late with probability ``PERIODIC_LATE`` (0.05) and missed with probability
  ``PERIODIC_MISS`` (0.02); ``1 + Poisson(lam)`` invocations per firing, ``lam`` lognormal (median 0.5).
* **bursty**: bursts start as a Poisson process of ``BURSTS_MEDIAN_PER_DAY`` (6; lognormal, sigma 0.8,
  clipped to [1, 48]) a day, last a geometric number of minutes (mean ``BURST_MEAN_MIN``, 10, at most
  60), and in a burst each minute is active with probability 0.9 with ``1 + Poisson(lam)``
  invocations, ``lam`` lognormal (median 5, sigma 1).

Memory per function: lognormal, median ``MEMORY_MEDIAN_MB`` (170 MB; ATC'20 reports most apps
allocating a few hundred MB at most), sigma 0.6, clipped to [64, 2048] MB. Average duration:
lognormal, median 1 s, sigma 1.5, clipped to [10 ms, 10 min] (loaded and reported; the minute model
of :mod:`gfaas.sim.keepalive` treats an invocation as using its minute). All draws come from
``numpy.random.default_rng(seed)``: the same arguments give the same day.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

__all__ = ["KINDS", "FunctionDay", "synthetic_day"]

MINUTES = 1440
KINDS = ("sporadic", "periodic", "bursty")
SPORADIC_MEDIAN_PER_DAY = 6.0
SPORADIC_SIGMA = 2.0
PERIODS_MIN = (1, 2, 5, 10, 15, 20, 30, 60, 120, 180, 360, 720, 1440)
PERIOD_WEIGHTS = (0.12, 0.04, 0.14, 0.14, 0.12, 0.04, 0.12, 0.12, 0.04, 0.03, 0.03, 0.03, 0.03)
PERIODIC_LATE = 0.05
PERIODIC_MISS = 0.02
BURSTS_MEDIAN_PER_DAY = 6.0
BURST_MEAN_MIN = 10.0
MEMORY_MEDIAN_MB = 170.0


@dataclass(frozen=True, eq=False)
class FunctionDay:
    """One day of functions: invocations per minute (functions x minutes), memory and duration."""

    counts: np.ndarray  # int32, shape (functions, minutes)
    memory_mb: np.ndarray  # float64, per function
    duration_ms: np.ndarray  # float64, per function (average)
    names: list[str]
    kinds: list[str]  # "sporadic" / "periodic" / "bursty", or the trace's trigger
    source: str

    def __post_init__(self) -> None:
        n = self.counts.shape[0]
        if not (self.memory_mb.shape == (n,) and self.duration_ms.shape == (n,) and len(self.names) == n
                and len(self.kinds) == n):
            raise ConfigError("a FunctionDay needs one memory, duration, name and kind per row of counts")

    @property
    def functions(self) -> int:
        return int(self.counts.shape[0])

    @property
    def minutes(self) -> int:
        return int(self.counts.shape[1])

    @property
    def invocations(self) -> int:
        return int(self.counts.sum(dtype=np.int64))


def synthetic_day(functions: int = 10_000, seed: int = 0,
                  mix: tuple[float, float, float] = (0.5, 0.3, 0.2)) -> FunctionDay:
    """A synthetic day of ``functions`` functions (see the module docstring for the model)."""
    if functions < 1:
        raise ConfigError(f"functions={functions}: give at least 1")
    if len(mix) != 3 or min(mix) < 0 or not abs(sum(mix) - 1.0) < 1e-9:
        raise ConfigError(f"mix={mix!r}: give three shares (sporadic, periodic, bursty) >= 0 summing to 1")
    rng = np.random.default_rng(seed)
    n, m = functions, MINUTES
    kind = rng.choice(3, size=n, p=list(mix))
    counts = np.zeros((n, m), dtype=np.int32)

    sp = np.flatnonzero(kind == 0)
    rate = np.clip(np.exp(np.log(SPORADIC_MEDIAN_PER_DAY) + SPORADIC_SIGMA * rng.standard_normal(sp.size)),
                   1.0, 20_000.0)
    counts[sp] = rng.poisson((rate / m)[:, None], size=(sp.size, m))

    pe = np.flatnonzero(kind == 1)
    period = np.asarray(PERIODS_MIN)[rng.choice(len(PERIODS_MIN), size=pe.size, p=PERIOD_WEIGHTS)]
    phase = (rng.random(pe.size) * period).astype(np.int64)
    lam_p = np.exp(np.log(0.5) + 1.0 * rng.standard_normal(pe.size))
    minute = np.arange(m)[None, :]
    fire = ((minute - phase[:, None]) % period[:, None] == 0) & (minute >= phase[:, None])
    late = fire & (rng.random((pe.size, m)) < PERIODIC_LATE)
    fire = (fire & ~late) | np.roll(late, 1, axis=1) & (minute > 0)
    fire &= rng.random((pe.size, m)) >= PERIODIC_MISS
    counts[pe] = fire * (1 + rng.poisson(lam_p[:, None], size=(pe.size, m)))

    bu = np.flatnonzero(kind == 2)
    bursts = np.clip(np.exp(np.log(BURSTS_MEDIAN_PER_DAY) + 0.8 * rng.standard_normal(bu.size)), 1.0, 48.0)
    lam_b = np.exp(np.log(5.0) + 1.0 * rng.standard_normal(bu.size))
    starts = rng.random((bu.size, m)) < (bursts / m)[:, None]
    lengths = np.minimum(rng.geometric(1.0 / BURST_MEAN_MIN, size=(bu.size, m)), 60)
    # A minute is in a burst when some start s <= t has s + length > t: the running maximum of the
    # bursts' end minutes, compared with the minute.
    ends = np.where(starts, minute + lengths, 0)
    in_burst = np.maximum.accumulate(ends, axis=1) > minute
    active = in_burst & (rng.random((bu.size, m)) < 0.9)
    counts[bu] = active * (1 + rng.poisson(lam_b[:, None], size=(bu.size, m)))

    memory = np.clip(np.exp(np.log(MEMORY_MEDIAN_MB) + 0.6 * rng.standard_normal(n)), 64.0, 2048.0)
    duration = np.clip(np.exp(np.log(1000.0) + 1.5 * rng.standard_normal(n)), 10.0, 600_000.0)
    return FunctionDay(counts, memory, duration, [f"syn-{i:05d}" for i in range(n)],
                       [KINDS[k] for k in kind], f"synthetic(functions={n}, seed={seed})")
