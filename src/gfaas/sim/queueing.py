"""A single-server FIFO queue on the kernel, and the closed forms it must reproduce.

The queue is the simulator's calibration target: M/M/1, M/D/1 and M/G/1 have exact steady-state
answers, so comparing :func:`simulate_single_server` with :func:`mm1`, :func:`md1` and :func:`mg1`
checks the kernel's ordering and time keeping end to end. ``gfaas.bench.sim`` runs the same model
(:func:`simulate_fifo` on pre-drawn times) against SimPy.

Measurement convention (what :class:`QueueStats` describes):

* jobs ``0 .. warmup-1`` are simulated but not measured, so that the empty start does not bias the
  averages;
* per-job averages (wait, sojourn) are over jobs ``warmup .. n-1``;
* time averages (utilisation, number in system) are over the *measurement window*, from the arrival
  of job ``warmup`` to the departure of the last job (the queue is FIFO with one server, so the last
  job is the last to leave). The window includes the final drain; over a long run its effect is of
  the order of one busy period divided by the run length;
* ``throughput`` is measured jobs divided by the window length, so Little's law ``L = throughput * W``
  holds up to the jobs already in the system when the window opens.

At equal times a departure is processed before an arrival (priority -1), the usual convention that
a server freed at ``t`` can take a job arriving at ``t``.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .kernel import Simulator

log = logging.getLogger(__name__)

__all__ = [
    "QueueStats",
    "QueueTheory",
    "ServiceTime",
    "md1",
    "mg1",
    "mm1",
    "simulate_fifo",
    "simulate_single_server",
]

Sampler = Callable[[np.random.Generator, int], np.ndarray]


# ---- service-time distributions -----------------------------------------------------------------
@dataclass(frozen=True)
class ServiceTime:
    """A service-time distribution: a vectorised sampler plus its first two moments.

    The moments travel with the sampler because the M/G/1 closed form needs ``E[S]`` and ``E[S^2]``
    and recomputing them from samples would make the oracle depend on the thing it checks.
    """

    name: str
    mean: float
    second_moment: float
    sampler: Sampler

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and self.mean > 0):
            raise ConfigError(f"service time {self.name!r} has mean {self.mean!r} s; it must be finite and > 0")
        # E[S^2] >= E[S]^2 (variance >= 0); allow rounding slack for deterministic services.
        if not (math.isfinite(self.second_moment) and self.second_moment >= self.mean**2 * (1 - 1e-12)):
            raise ConfigError(
                f"service time {self.name!r} has second moment {self.second_moment!r} below mean^2 = "
                f"{self.mean**2!r}; E[S^2] must be at least E[S]^2"
            )

    @property
    def scv(self) -> float:
        """Squared coefficient of variation ``Var[S] / E[S]^2`` (1 exponential, 0 deterministic)."""
        return max(self.second_moment / self.mean**2 - 1.0, 0.0)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` independent service times as a float64 array."""
        out = np.asarray(self.sampler(rng, n), dtype=np.float64)
        if out.shape != (n,):
            raise ConfigError(f"service sampler {self.name!r} returned shape {out.shape} for n={n}; "
                              f"it must return a 1-D array of length n")
        return out

    @classmethod
    def exponential(cls, rate: float) -> ServiceTime:
        """Exponential service with rate ``rate`` (mean ``1/rate``): the M in M/M/1."""
        _positive("service rate", rate)
        mean = 1.0 / rate
        return cls(f"exp(rate={rate:g})", mean, 2.0 * mean * mean,
                   lambda rng, n: rng.exponential(mean, n))

    @classmethod
    def deterministic(cls, rate: float) -> ServiceTime:
        """Every job takes exactly ``1/rate`` seconds: the D in M/D/1."""
        _positive("service rate", rate)
        mean = 1.0 / rate
        return cls(f"det(rate={rate:g})", mean, mean * mean,
                   lambda rng, n: np.full(n, mean))

    @classmethod
    def lognormal(cls, mean: float, cv: float) -> ServiceTime:
        """Lognormal with the given mean and coefficient of variation (a heavy-ish tailed M/G/1 case)."""
        _positive("service mean", mean)
        if not (math.isfinite(cv) and cv >= 0):
            raise ConfigError(f"lognormal cv {cv!r} must be finite and >= 0")
        sigma2 = math.log1p(cv * cv)
        mu = math.log(mean) - sigma2 / 2.0
        sigma = math.sqrt(sigma2)
        return cls(f"lognormal(mean={mean:g},cv={cv:g})", mean, mean * mean * (1.0 + cv * cv),
                   lambda rng, n: rng.lognormal(mu, sigma, n))


# ---- closed forms -------------------------------------------------------------------------------
@dataclass(frozen=True)
class QueueTheory:
    """Steady-state means of a stable single-server queue (seconds and jobs)."""

    arrival_rate: float
    rho: float
    mean_wait: float  # Wq: time in queue before service
    mean_sojourn: float  # W: wait + service
    mean_in_queue: float  # Lq = lambda * Wq
    mean_in_system: float  # L = lambda * W


def _positive(what: str, x: float) -> None:
    if not (isinstance(x, int | float) and math.isfinite(x) and x > 0):
        raise ConfigError(f"{what} {x!r} must be a finite number > 0")


def _check_stable(arrival_rate: float, service_mean: float) -> float:
    _positive("arrival rate", arrival_rate)
    _positive("mean service time", service_mean)
    rho = arrival_rate * service_mean
    if rho >= 1.0:
        raise ConfigError(
            f"the queue is unstable: utilisation rho = arrival rate {arrival_rate:g}/s x mean service "
            f"{service_mean:g} s = {rho:g} >= 1, so it has no steady state; lower the arrival rate "
            f"below {1.0 / service_mean:g}/s or shorten the service"
        )
    return rho


def _theory(arrival_rate: float, rho: float, wq: float, service_mean: float) -> QueueTheory:
    w = wq + service_mean
    return QueueTheory(arrival_rate, rho, wq, w, arrival_rate * wq, arrival_rate * w)


def mm1(arrival_rate: float, service_rate: float) -> QueueTheory:
    """M/M/1: ``W = 1/(mu - lambda)``, ``Wq = rho/(mu - lambda)``, ``L = rho/(1 - rho)``."""
    _positive("service rate", service_rate)
    rho = _check_stable(arrival_rate, 1.0 / service_rate)
    wq = rho / (service_rate - arrival_rate)
    return _theory(arrival_rate, rho, wq, 1.0 / service_rate)


def md1(arrival_rate: float, service_rate: float) -> QueueTheory:
    """M/D/1: ``Wq = rho / (2 mu (1 - rho))`` (half the M/M/1 queueing delay)."""
    _positive("service rate", service_rate)
    rho = _check_stable(arrival_rate, 1.0 / service_rate)
    wq = rho / (2.0 * service_rate * (1.0 - rho))
    return _theory(arrival_rate, rho, wq, 1.0 / service_rate)


def mg1(arrival_rate: float, service_mean: float, service_second_moment: float) -> QueueTheory:
    """M/G/1 by Pollaczek-Khinchine: ``Wq = lambda E[S^2] / (2 (1 - rho))``."""
    rho = _check_stable(arrival_rate, service_mean)
    if not (math.isfinite(service_second_moment) and service_second_moment >= service_mean**2 * (1 - 1e-12)):
        raise ConfigError(
            f"service second moment {service_second_moment!r} is below mean^2 = {service_mean**2!r}; "
            "pass E[S^2] (not the variance), which is at least E[S]^2"
        )
    wq = arrival_rate * service_second_moment / (2.0 * (1.0 - rho))
    return _theory(arrival_rate, rho, wq, service_mean)


# ---- simulation ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class QueueStats:
    """Measured behaviour of one run (see the module docstring for the window)."""

    jobs_done: int  # measured jobs (n_jobs - warmup)
    mean_wait: float  # seconds in queue before service
    mean_sojourn: float  # seconds from arrival to departure
    utilisation: float  # fraction of the window the server was busy
    mean_in_system: float  # time-average number of jobs in the system over the window
    throughput: float  # measured jobs per second of window
    window: float  # length of the measurement window, seconds
    events: int  # kernel events executed (2 per job: arrival, departure)


@dataclass
class _Totals:
    """What the queue's callbacks accumulated; ``mark`` is (time, area, busy) at the window start."""

    area: float
    busy: float
    sum_wait: float
    sum_sojourn: float
    mark: tuple[float, float, float]


def _run_fifo(sim: Simulator, ia: list[float], sv: list[float], warmup: int) -> _Totals:
    """The queue's state machine as two closures over local state, run to completion on ``sim``.

    Closures rather than a class because cell variables are cheaper to read and write than instance
    attributes, and this loop is what the benchmark times. ``area`` and ``busy`` integrate the number
    in system and the busy indicator from time 0; the window start is remembered in ``mark``.
    """
    n = len(ia)
    queue: deque[float] = deque()  # arrival times of jobs in the system, head in service
    in_system = 0
    arrived = 0
    served = 0
    last = sim.now
    area = busy = sum_wait = sum_sojourn = 0.0
    mark = (sim.now, 0.0, 0.0)
    schedule = sim.schedule
    append = queue.append
    popleft = queue.popleft

    def arrive() -> None:
        nonlocal in_system, arrived, last, area, busy, mark
        now = sim.now
        if in_system:
            dt = now - last
            area += in_system * dt
            busy += dt
        last = now
        i = arrived
        if i == warmup:
            mark = (now, area, busy)
        arrived = i + 1
        if arrived < n:
            schedule(ia[arrived], arrive)
        append(now)
        in_system += 1
        if in_system == 1:  # server was idle: the job starts at once with zero wait
            schedule(sv[i], depart, priority=-1)

    def depart() -> None:
        nonlocal in_system, served, last, area, busy, sum_wait, sum_sojourn
        now = sim.now
        dt = now - last  # a departure means the system was non-empty since the last change
        area += in_system * dt
        busy += dt
        last = now
        k = served
        arrived_at = popleft()
        if k >= warmup:
            sum_sojourn += now - arrived_at
        served = k + 1
        in_system -= 1
        if in_system:
            if served >= warmup:
                sum_wait += now - queue[0]
            schedule(sv[served], depart, priority=-1)

    schedule(ia[0], arrive)
    sim.run()
    return _Totals(area, busy, sum_wait, sum_sojourn, mark)


def simulate_fifo(interarrivals: Sequence[float] | np.ndarray, services: Sequence[float] | np.ndarray,
                  *, warmup: int = 0, kernel: type[Simulator] | None = None) -> QueueStats:
    """Run one FIFO single-server queue on a fresh :class:`Simulator` with the given times.

    Job ``i`` arrives ``interarrivals[i]`` seconds after job ``i-1`` (job 0 after time 0) and needs
    ``services[i]`` seconds of service. Taking the times as input, rather than a seed, lets the
    benchmark feed the very same numbers to SimPy and compare results exactly. ``kernel``: the
    simulator class to run on (default :data:`gfaas.sim.kernel.Simulator`; ``gfaas bench sim`` times
    the pure-Python reference beside the native kernel).
    """
    ia_arr = np.asarray(interarrivals, dtype=np.float64)
    sv_arr = np.asarray(services, dtype=np.float64)
    n = len(ia_arr)
    if ia_arr.ndim != 1 or sv_arr.shape != ia_arr.shape:
        raise ConfigError(f"interarrival times have shape {ia_arr.shape} and service times {sv_arr.shape}; "
                          "give two 1-D sequences with one entry per job")
    if not 0 <= warmup < n:
        raise ConfigError(f"warmup {warmup} must be >= 0 and smaller than the number of jobs {n}")
    for what, xs in (("interarrival", ia_arr), ("service", sv_arr)):
        bad = np.flatnonzero(~(np.isfinite(xs) & (xs >= 0.0)))
        if bad.size:
            j = int(bad[0])
            raise ConfigError(f"{what} time of job {j} is {float(xs[j])!r}; times must be finite and >= 0")
    ia: list[float] = ia_arr.tolist()
    sv: list[float] = sv_arr.tolist()
    sim = (kernel or Simulator)()
    m = _run_fifo(sim, ia, sv, warmup)
    t0, area0, busy0 = m.mark
    window = sim.now - t0
    jobs = n - warmup
    if window > 0:
        util = (m.busy - busy0) / window
        in_system = (m.area - area0) / window
        throughput = jobs / window
    else:  # every measured job had zero service and arrived at one instant
        util = in_system = 0.0
        throughput = math.inf
    return QueueStats(
        jobs_done=jobs,
        mean_wait=m.sum_wait / jobs,
        mean_sojourn=m.sum_sojourn / jobs,
        utilisation=util,
        mean_in_system=in_system,
        throughput=throughput,
        window=window,
        events=sim.events_run,
    )


def simulate_single_server(arrival_rate: float, service: ServiceTime, *, n_jobs: int,
                           warmup: int = 0, seed: int = 0) -> QueueStats:
    """Poisson arrivals at ``arrival_rate`` into one FIFO server with ``service`` times.

    Draws all interarrival times, then all service times, from ``numpy.random.default_rng(seed)``
    (two separate blocks, so changing the service distribution leaves the arrivals unchanged), and
    runs :func:`simulate_fifo`. The queue need not be stable: an overloaded run simply measures a
    growing queue.
    """
    _positive("arrival rate", arrival_rate)
    if not isinstance(n_jobs, int) or n_jobs < 1:
        raise ConfigError(f"n_jobs {n_jobs!r} must be an integer >= 1")
    rng = np.random.default_rng(seed)
    ia = rng.exponential(1.0 / arrival_rate, n_jobs)
    sv = service.sample(rng, n_jobs)
    log.debug("M/G/1 run: lambda=%g service=%s n=%d warmup=%d seed=%d",
              arrival_rate, service.name, n_jobs, warmup, seed)
    return simulate_fifo(ia, sv, warmup=warmup)
