"""Benchmark: the gfaas event kernel against SimPy on the same M/M/1 queue.

What is compared. One FIFO single-server queue at ``rho = 0.8`` (arrival rate 0.8/s, service rate
1/s). Both simulators get the *same* pre-drawn arrays of interarrival and service times
(``numpy.random.default_rng(seed)``), drawn before any timer starts, so they do identical work and
must produce identical sojourn times; the benchmark checks that the two mean sojourn times agree to
a relative 1e-9 and raises otherwise.

* gfaas: :func:`gfaas.sim.queueing.simulate_fifo`, two callbacks (arrival, departure) on
  :class:`gfaas.sim.kernel.Simulator` (the native kernel where it is built: ``core``); it also
  integrates the time-average statistics, which the SimPy side does not, so any bias is against gfaas.
  The pure-Python kernel (:class:`~gfaas.sim.kernel.PySimulator`, the reference) runs the same jobs
  too: ``python_kernel_jobs_per_s`` and ``core_over_python`` (1.0 when the core is the Python one).
* SimPy: the idiomatic model, a source process that waits each interarrival time and starts one
  process per job; the job requests a ``simpy.Resource`` of capacity 1, holds it for its service
  time and records its sojourn time.

Units. ``events`` (the argument) is the number of gfaas kernel events; the gfaas model executes
exactly two per job, so ``jobs = events // 2``. Each kernel counts events its own way, so
``gfaas_events_per_s`` and ``simpy_events_per_s`` are not the same unit (a SimPy job is about six
SimPy events: timeouts, process start, request, release, process end). The comparable figure is
``jobs_per_s``, and ``ratio = gfaas_jobs_per_s / simpy_jobs_per_s``. SimPy's event count comes from
a separate, untimed run with ``Environment.step`` wrapped in a counter, so that counting costs
nothing in the timed runs.

Timing. Each simulator runs ``repeats`` times (default 3) in this process and the fastest run
counts; ``time.perf_counter`` brackets the simulation only. Benchmarks may read the wall clock; the
kernel never does.

Run ``python -m gfaas.bench.sim [--events N] [--seed S]`` to print the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from ..errors import ConfigError, require_extra
from ..sim.kernel import CORE, PySimulator
from ..sim.queueing import simulate_fifo

log = logging.getLogger(__name__)

ARRIVAL_RATE = 0.8
SERVICE_RATE = 1.0
MODEL = "M/M/1 rho=0.8"
_AGREE_REL = 1e-9


def _draw(jobs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.exponential(1.0 / ARRIVAL_RATE, jobs), rng.exponential(1.0 / SERVICE_RATE, jobs)


def _simpy_mm1(simpy: Any, ia: list[float], sv: list[float], count_events: bool) -> tuple[float, int]:
    """Run the queue on SimPy; return (mean sojourn, SimPy events processed or 0 if not counted)."""
    counter = [0]
    if count_events:
        class CountingEnvironment(simpy.Environment):
            def step(self) -> None:
                counter[0] += 1
                super().step()

        env = CountingEnvironment()
    else:
        env = simpy.Environment()
    server = simpy.Resource(env, capacity=1)
    sojourns: list[float] = []

    def job(service: float) -> Generator[Any, Any, None]:
        arrived = env.now
        with server.request() as req:
            yield req
            yield env.timeout(service)
        sojourns.append(env.now - arrived)

    def source() -> Generator[Any, Any, None]:
        for gap, service in zip(ia, sv, strict=True):
            yield env.timeout(gap)
            env.process(job(service))

    env.process(source())
    env.run()
    if len(sojourns) != len(ia):
        raise RuntimeError(f"SimPy model finished {len(sojourns)} of {len(ia)} jobs")
    # Sum in job order, as the gfaas model does, so equal sojourns give bit-equal means.
    total = 0.0
    for s in sojourns:
        total += s
    return total / len(sojourns), counter[0]


def _best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best = float("inf")
    result: Any = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def _machine() -> str:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu or platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def run(events: int = 200_000, seed: int = 1, repeats: int = 3) -> dict[str, Any]:
    """Time both simulators on the same M/M/1 run; see the module docstring for the definitions."""
    if not isinstance(events, int) or events < 2:
        raise ConfigError(f"events {events!r} must be an integer >= 2 (two kernel events per job)")
    if not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats {repeats!r} must be an integer >= 1")
    simpy: Any = require_extra("simpy", "dev")
    jobs = events // 2
    ia, sv = _draw(jobs, seed)
    ia_list: list[float] = ia.tolist()
    sv_list: list[float] = sv.tolist()

    g_time, g_stats = _best_of(repeats, lambda: simulate_fifo(ia, sv))
    p_time, p_stats = _best_of(repeats, lambda: simulate_fifo(ia, sv, kernel=PySimulator))
    if p_stats != g_stats:
        raise RuntimeError(f"the {CORE} kernel and the pure-Python one disagree on the same jobs: {g_stats} vs {p_stats}")
    s_time, (s_sojourn, _) = _best_of(repeats, lambda: _simpy_mm1(simpy, ia_list, sv_list, False))
    _, simpy_events = _simpy_mm1(simpy, ia_list, sv_list, True)

    g_sojourn = g_stats.mean_sojourn
    if abs(g_sojourn - s_sojourn) > _AGREE_REL * abs(s_sojourn):
        raise RuntimeError(
            f"the two simulators disagree on the same input: mean sojourn gfaas {g_sojourn!r} vs SimPy "
            f"{s_sojourn!r}; the models are no longer the same and the timing comparison is void"
        )
    g_jobs_per_s = jobs / g_time
    s_jobs_per_s = jobs / s_time
    result: dict[str, Any] = {
        "model": MODEL,
        "jobs": jobs,
        "events": g_stats.events,
        "simpy_events": simpy_events,
        "gfaas_events_per_s": g_stats.events / g_time,
        "simpy_events_per_s": simpy_events / s_time,
        "gfaas_jobs_per_s": g_jobs_per_s,
        "simpy_jobs_per_s": s_jobs_per_s,
        "ratio": g_jobs_per_s / s_jobs_per_s,
        "core": CORE,
        "python_kernel_jobs_per_s": jobs / p_time,
        "core_over_python": p_time / g_time,
        "gfaas_seconds": g_time,
        "simpy_seconds": s_time,
        "mean_sojourn_gfaas": g_sojourn,
        "mean_sojourn_simpy": s_sojourn,
        "mean_sojourn_theory": 1.0 / (SERVICE_RATE - ARRIVAL_RATE),
        "seed": seed,
        "repeats": repeats,
        "simpy_version": getattr(simpy, "__version__", "unknown"),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "machine": _machine(),
    }
    log.info("sim bench: gfaas %.0f jobs/s, SimPy %.0f jobs/s, ratio %.2f",
             g_jobs_per_s, s_jobs_per_s, result["ratio"])
    return result


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: print :func:`run`'s result as JSON."""
    ap = argparse.ArgumentParser(prog="python -m gfaas.bench.sim", description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000, help="gfaas kernel events (2 per job)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="runs per simulator; the fastest counts")
    args = ap.parse_args(argv)
    json.dump(run(events=args.events, seed=args.seed, repeats=args.repeats), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
