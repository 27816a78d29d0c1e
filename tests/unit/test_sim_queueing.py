"""The FIFO queue model: exact per-sample oracles, closed forms, and long runs against theory.

Long-run tests use a fixed seed, so they are deterministic. Their sizes were chosen so that 2 % is
about three standard deviations of the estimator (measured over 10 seeds: mean sojourn relative SD
0.5 % for M/M/1 and 0.2 % for M/D/1 at rho=0.5 with 300k jobs, 0.65 % for M/M/1 at rho=0.8 with
1.5M jobs, about 0.6 % for M/D/1 at rho=0.8 with 1M jobs), i.e. the fixed seed is not a lucky one.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from gfaas.errors import ConfigError
from gfaas.sim.queueing import (
    QueueStats,
    QueueTheory,
    ServiceTime,
    md1,
    mg1,
    mm1,
    simulate_fifo,
    simulate_single_server,
)

# ---- closed forms -------------------------------------------------------------------------------


def test_mm1_closed_form_values() -> None:
    """M/M/1 at lambda=0.5, mu=1: W=2, Wq=1, L=1, Lq=0.5."""
    t = mm1(0.5, 1.0)
    assert t == QueueTheory(arrival_rate=0.5, rho=0.5, mean_wait=1.0, mean_sojourn=2.0,
                            mean_in_queue=0.5, mean_in_system=1.0)
    t8 = mm1(0.8, 1.0)
    assert t8.mean_sojourn == pytest.approx(5.0, rel=1e-12)
    assert t8.mean_in_system == pytest.approx(0.8 / 0.2, rel=1e-12)


def test_md1_closed_form_values() -> None:
    """M/D/1 at lambda=0.8, mu=1: Wq = 0.8 / (2 * 0.2) = 2, W = 3, L = 2.4."""
    t = md1(0.8, 1.0)
    assert t.mean_wait == pytest.approx(2.0, rel=1e-12)
    assert t.mean_sojourn == pytest.approx(3.0, rel=1e-12)
    assert t.mean_in_system == pytest.approx(2.4, rel=1e-12)


@pytest.mark.parametrize("lam,mu", [(0.1, 1.0), (0.5, 2.0), (0.8, 1.0), (9.0, 10.0)])
def test_pollaczek_khinchine_reduces_to_mm1_and_md1(lam: float, mu: float) -> None:
    """P-K with exponential moments equals M/M/1, with deterministic moments equals M/D/1."""
    exp, det = ServiceTime.exponential(mu), ServiceTime.deterministic(mu)
    for got, want in ((mg1(lam, exp.mean, exp.second_moment), mm1(lam, mu)),
                      (mg1(lam, det.mean, det.second_moment), md1(lam, mu))):
        assert got.mean_wait == pytest.approx(want.mean_wait, rel=1e-12)
        assert got.mean_in_system == pytest.approx(want.mean_in_system, rel=1e-12)


def test_unstable_queue_is_refused_with_the_numbers() -> None:
    """rho >= 1 is a ConfigError that says the queue is unstable and shows rho."""
    with pytest.raises(ConfigError) as exc:
        mm1(1.25, 1.0)
    msg = str(exc.value)
    assert "unstable" in msg and "1.25" in msg and ">= 1" in msg
    with pytest.raises(ConfigError, match="unstable"):
        md1(2.0, 2.0)
    with pytest.raises(ConfigError, match="unstable"):
        mg1(1.0, 1.0, 2.0)


@pytest.mark.parametrize("call", [lambda: mm1(0.0, 1.0), lambda: mm1(0.5, -1.0), lambda: md1(math.nan, 1.0),
                                  lambda: mg1(0.5, 1.0, 0.5), lambda: ServiceTime.lognormal(1.0, -1.0)])
def test_bad_parameters_are_config_errors(call: object) -> None:
    """Non-positive rates, NaN, E[S^2] < E[S]^2 and negative CV are refused."""
    with pytest.raises(ConfigError):
        call()  # type: ignore[operator]


def test_service_time_moments() -> None:
    """The distributions carry the right first two moments (they feed the P-K oracle)."""
    exp = ServiceTime.exponential(4.0)
    assert (exp.mean, exp.second_moment, exp.scv) == (0.25, 0.125, 1.0)
    det = ServiceTime.deterministic(4.0)
    assert (det.mean, det.second_moment, det.scv) == (0.25, 0.0625, 0.0)
    ln = ServiceTime.lognormal(2.0, 1.5)
    assert ln.mean == 2.0 and ln.second_moment == pytest.approx(4.0 * (1 + 2.25))
    draws = ln.sample(np.random.default_rng(0), 400_000)
    assert draws.mean() == pytest.approx(2.0, rel=0.02)
    assert (draws**2).mean() == pytest.approx(ln.second_moment, rel=0.1)
    assert np.all(det.sample(np.random.default_rng(0), 5) == 0.25)


# ---- exact oracles ------------------------------------------------------------------------------


def test_hand_computed_three_job_run() -> None:
    """Three jobs with a departure and an arrival at the same instant (departure first): exact stats."""
    s = simulate_fifo([1.0, 1.0, 1.0], [1.5, 0.5, 0.25])
    # Arrivals 1, 2, 3. Job 0: 1 -> 2.5. Job 1 waits 0.5: 2.5 -> 3.0. Job 2 arrives at 3.0 as job 1
    # leaves, starts at once: 3.0 -> 3.25. The server is busy all of [1, 3.25].
    assert s == QueueStats(jobs_done=3, mean_wait=0.5 / 3, mean_sojourn=2.75 / 3, utilisation=1.0,
                           mean_in_system=2.75 / 2.25, throughput=3 / 2.25, window=2.25, events=6)


def test_warmup_jobs_are_excluded_from_the_averages() -> None:
    """With warmup=1 only jobs 1.. count, and the window opens at job 1's arrival."""
    s = simulate_fifo([1.0, 1.0, 1.0], [1.5, 0.5, 0.25], warmup=1)
    assert s.jobs_done == 2
    assert s.mean_wait == pytest.approx(0.25)
    assert s.mean_sojourn == pytest.approx((1.0 + 0.25) / 2)
    assert s.window == pytest.approx(1.25)  # from 2.0 to 3.25
    # In system over [2, 3.25]: 2 jobs on [2, 2.5], 1 job on [2.5, 3.25].
    assert s.mean_in_system == pytest.approx((2 * 0.5 + 1 * 0.75) / 1.25)


def _lindley(ia: np.ndarray, sv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Waits by Lindley's recursion in closed form: W_n = P_n - min_{j<=n} P_j, P the partial sums of S - A."""
    steps = np.concatenate(([0.0], sv[:-1] - ia[1:]))
    p = np.cumsum(steps)
    wait = p - np.minimum.accumulate(np.minimum(p, 0.0))
    return wait, wait + sv


@pytest.mark.parametrize("rho", [0.3, 0.9, 1.2])
def test_simulation_equals_lindley_recursion_sample_by_sample(rho: float) -> None:
    """On the same draws, the event simulation and Lindley's recursion agree to 1e-9 (stable or not)."""
    rng = np.random.default_rng(7)
    n = 20_000
    ia = rng.exponential(1.0 / rho, n)
    sv = rng.exponential(1.0, n)
    wait, sojourn = _lindley(ia, sv)
    s = simulate_fifo(ia, sv)
    arrivals = np.cumsum(ia)
    departures = arrivals + sojourn
    window = departures.max() - arrivals[0]
    assert s.mean_wait == pytest.approx(wait.mean(), rel=1e-9)
    assert s.mean_sojourn == pytest.approx(sojourn.mean(), rel=1e-9)
    assert s.window == pytest.approx(window, rel=1e-12)
    # Starting and ending empty, the area under N(t) is the sum of sojourns and busy time the sum of services.
    assert s.mean_in_system == pytest.approx(sojourn.sum() / window, rel=1e-9)
    assert s.utilisation == pytest.approx(sv.sum() / window, rel=1e-9)
    assert s.events == 2 * n


def test_simulate_fifo_validates_its_input() -> None:
    """Mismatched lengths, negative or NaN times and a warmup >= n are ConfigErrors naming the problem."""
    with pytest.raises(ConfigError, match="shape"):
        simulate_fifo([1.0, 2.0], [1.0])
    with pytest.raises(ConfigError, match="service time of job 1 is -1.0"):
        simulate_fifo([1.0, 2.0], [1.0, -1.0])
    with pytest.raises(ConfigError, match="interarrival time of job 0 is nan"):
        simulate_fifo([math.nan], [1.0])
    with pytest.raises(ConfigError, match="warmup 2"):
        simulate_fifo([1.0, 1.0], [1.0, 1.0], warmup=2)
    with pytest.raises(ConfigError, match="n_jobs"):
        simulate_single_server(0.5, ServiceTime.exponential(1.0), n_jobs=0)


def test_same_seed_same_result_and_arrivals_do_not_depend_on_the_service_law() -> None:
    """A seed fixes the run; swapping the service distribution keeps the arrival stream."""
    a = simulate_single_server(0.5, ServiceTime.exponential(1.0), n_jobs=5000, seed=3)
    b = simulate_single_server(0.5, ServiceTime.exponential(1.0), n_jobs=5000, seed=3)
    assert a == b
    c = simulate_single_server(0.5, ServiceTime.deterministic(1.0), n_jobs=5000, seed=3)
    assert c.window != a.window
    # The deterministic run is exactly the arrivals of seed 3 (drawn first) with unit services.
    rng = np.random.default_rng(3)
    ia = rng.exponential(2.0, 5000)
    assert simulate_fifo(ia, np.full(5000, 1.0)) == c


# ---- long runs against theory -------------------------------------------------------------------
_CASES = {
    # (rho, service kind): n_jobs
    (0.5, "exp"): 300_000,
    (0.5, "det"): 300_000,
    (0.8, "exp"): 1_500_000,
    (0.8, "det"): 1_000_000,
}
_SEED = 20240611


@functools.cache
def _long_run(rho: float, kind: str) -> tuple[QueueStats, QueueTheory]:
    service = ServiceTime.exponential(1.0) if kind == "exp" else ServiceTime.deterministic(1.0)
    theory = mm1(rho, 1.0) if kind == "exp" else md1(rho, 1.0)
    stats = simulate_single_server(rho, service, n_jobs=_CASES[(rho, kind)], warmup=10_000, seed=_SEED)
    return stats, theory


def _rel(got: float, want: float) -> float:
    return got / want - 1.0


@pytest.mark.parametrize("rho,kind", list(_CASES))
def test_long_run_matches_theory_within_2_percent(rho: float, kind: str) -> None:
    """M/M/1 and M/D/1 at rho 0.5 and 0.8: mean sojourn, number in system and utilisation near theory."""
    s, t = _long_run(rho, kind)
    for name, got, want, tol in (("mean sojourn W", s.mean_sojourn, t.mean_sojourn, 0.02),
                                 ("mean in system L", s.mean_in_system, t.mean_in_system, 0.02),
                                 ("utilisation", s.utilisation, rho, 0.01)):
        err = _rel(got, want)
        assert abs(err) < tol, (f"M/{'M' if kind == 'exp' else 'D'}/1 rho={rho}: {name} = {got:.5f}, "
                                f"theory {want:.5f}, relative error {err:+.4%} (limit {tol:.0%})")


@pytest.mark.parametrize("rho,kind", list(_CASES))
def test_littles_law_within_1_percent(rho: float, kind: str) -> None:
    """L = lambda W within 1 %, with lambda both the measured throughput and the nominal arrival rate."""
    s, _ = _long_run(rho, kind)
    for name, lam in (("measured throughput", s.throughput), ("nominal arrival rate", rho)):
        err = _rel(s.mean_in_system, lam * s.mean_sojourn)
        assert abs(err) < 0.01, (f"rho={rho} {kind}: L = {s.mean_in_system:.5f} but lambda*W with the {name} "
                                 f"= {lam * s.mean_sojourn:.5f}, relative error {err:+.4%}")


def test_mg1_lognormal_matches_pollaczek_khinchine() -> None:
    """M/G/1 with lognormal service (CV 1.5) at rho 0.6 is within 5 % of P-K (estimator SD about 1.6 %)."""
    service = ServiceTime.lognormal(1.0, 1.5)
    t = mg1(0.6, service.mean, service.second_moment)
    s = simulate_single_server(0.6, service, n_jobs=400_000, warmup=5000, seed=_SEED)
    err = _rel(s.mean_sojourn, t.mean_sojourn)
    assert abs(err) < 0.05, f"M/G/1: W = {s.mean_sojourn:.4f}, P-K {t.mean_sojourn:.4f}, error {err:+.4%}"
