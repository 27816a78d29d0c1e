"""Arrival generators (seeded, rate-accurate, right burstiness) and trace loaders (exact parsing, clear errors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gfaas.errors import ConfigError
from gfaas.sim import arrivals as A
from gfaas.sim.bundled import BUNDLED_TRACES, trace_path


def _cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


# ---- generators ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", A.PATTERNS)
def test_same_seed_same_array_other_seed_other_array(name: str) -> None:
    """Every pattern is a pure function of its seed."""
    a = A.pattern(name, 2.0, 5000.0, seed=11)
    b = A.pattern(name, 2.0, 5000.0, seed=11)
    c = A.pattern(name, 2.0, 5000.0, seed=12)
    assert a.dtype == np.float64 and a.size > 100
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("name", A.PATTERNS)
def test_arrivals_are_sorted_and_inside_the_horizon(name: str) -> None:
    """Times are non-decreasing and in [0, horizon)."""
    t = A.pattern(name, 5.0, 3000.0, seed=1)
    assert np.all(np.diff(t) >= 0)
    assert t[0] >= 0.0 and t[-1] < 3000.0


# Horizons long enough that the fixed seed's rate error is a few standard deviations inside the limit:
# bursty's count varies with the number of on/off cycles (relative SD about 1.3/sqrt(cycles)).
@pytest.mark.parametrize("name,rate,horizon,tol", [
    ("poisson", 3.0, 200_000.0, 0.01),
    ("sporadic", 0.5, 2_000_000.0, 0.02),
    ("periodic", 0.25, 400_000.0, 0.001),
    ("bursty", 1.0, 2_000_000.0, 0.04),
])
def test_empirical_mean_rate_matches_the_requested_rate(name: str, rate: float, horizon: float, tol: float) -> None:
    """pattern(name, r) produces r arrivals per second on average over a long horizon."""
    t = A.pattern(name, rate, horizon, seed=5)
    got = t.size / horizon
    err = got / rate - 1
    assert abs(err) < tol, f"{name}: {got:.5f}/s for {rate}/s requested, relative error {err:+.3%} (limit {tol:.1%})"


def test_burstiness_ordering_by_coefficient_of_variation() -> None:
    """Gap CV: periodic ~ 0, poisson ~ 1, sporadic well above 1, bursty far above 1."""
    h = 400_000.0
    cvs = {name: _cv(A.pattern(name, 1.0, h, seed=9)) for name in A.PATTERNS}
    assert cvs["periodic"] < 0.01, cvs
    assert 0.98 < cvs["poisson"] < 1.02, cvs
    assert cvs["sporadic"] > 2.0, cvs
    assert cvs["bursty"] > 5.0, cvs
    # The periodic CV is jitter / sqrt(6) for uniform lateness.
    assert cvs["periodic"] == pytest.approx(A.PERIODIC_JITTER / np.sqrt(6), rel=0.05)


def test_bursty_arrivals_cluster_in_on_periods() -> None:
    """With rate_off = 0 a large share of 1 s bins is empty, far more than Poisson at the same mean."""
    h = 100_000.0
    bins = np.arange(0.0, h + 1.0, 1.0)
    bursty = np.histogram(A.bursty(10.0, h, seed=2), bins)[0]
    flat = np.histogram(A.poisson(1.0, h, seed=2), bins)[0]
    assert (bursty == 0).mean() > 0.85  # ~90 % of time is quiet
    assert (flat == 0).mean() == pytest.approx(np.exp(-1.0), abs=0.01)


def test_periodic_ticks_once_per_period_with_bounded_lateness() -> None:
    """Gaps of a periodic pattern stay within period * (1 +- jitter)."""
    t = A.periodic(60.0, 86_400.0, seed=4, jitter=0.02)
    gaps = np.diff(t)
    assert t.size in (1439, 1440)
    assert gaps.min() > 60.0 * 0.98 and gaps.max() < 60.0 * 1.02


def test_poisson_zero_rate_is_empty() -> None:
    """Rate 0 yields no arrivals (an idle function), not an error."""
    assert A.poisson(0.0, 100.0, seed=1).size == 0


def test_unknown_pattern_lists_the_valid_names() -> None:
    """An unknown pattern name is a ConfigError listing every valid name."""
    with pytest.raises(ConfigError) as exc:
        A.pattern("spiky", 1.0, 10.0, seed=0)
    msg = str(exc.value)
    assert "'spiky'" in msg
    for name in ("sporadic", "periodic", "bursty", "poisson"):
        assert name in msg


@pytest.mark.parametrize("call,needle", [
    (lambda: A.poisson(-1.0, 10.0, 0), "poisson rate -1.0"),
    (lambda: A.poisson(1.0, 0.0, 0), "horizon 0.0"),
    (lambda: A.periodic(10.0, 100.0, 0, jitter=1.0), "jitter 1.0"),
    (lambda: A.bursty(5.0, 100.0, 0, mean_on=0.0), "mean_on 0.0"),
    (lambda: A.sporadic(1.0, 100.0, 1.5), "seed 1.5"),
    (lambda: A.pattern("bursty", float("nan"), 10.0, 0), "mean rate nan"),
])
def test_bad_generator_arguments_name_the_value(call: object, needle: str) -> None:
    """Invalid rates, horizons, jitter, durations and seeds are ConfigErrors naming the bad value."""
    with pytest.raises(ConfigError) as exc:
        call()  # type: ignore[operator]
    assert needle in str(exc.value)


def test_scale_to_rate_changes_the_rate_and_keeps_the_shape() -> None:
    """Scaling time hits the target rate exactly and leaves the gap CV unchanged."""
    t = A.pattern("bursty", 1.0, 100_000.0, seed=3)
    scaled = A.scale_to_rate(t, 20.0, 100_000.0)
    new_horizon = t.size / 20.0
    assert scaled.size / new_horizon == pytest.approx(20.0, rel=1e-12)
    assert scaled[-1] < new_horizon
    assert _cv(scaled) == pytest.approx(_cv(t), rel=1e-9)
    with pytest.raises(ConfigError, match="non-empty"):
        A.scale_to_rate(np.empty(0), 1.0, 10.0)


def test_arrivals_from_rates_follow_the_steps() -> None:
    """Piecewise-constant Poisson: silent steps stay silent, per-step means match the rates."""
    rates = np.tile([0.0, 50.0, 5.0], 2000)
    t = A.arrivals_from_rates(rates, 2.0, seed=8)
    step = np.floor(t / 2.0).astype(int)
    counts = np.bincount(step, minlength=rates.size)
    assert counts[0::3].sum() == 0
    assert counts[1::3].mean() == pytest.approx(100.0, rel=0.01)
    assert counts[2::3].mean() == pytest.approx(10.0, rel=0.03)
    with pytest.raises(ConfigError, match="rate 1 is -1.0"):
        A.arrivals_from_rates(np.array([1.0, -1.0]), 1.0, seed=0)


# ---- loaders on small files ---------------------------------------------------------------------


def _write(tmp_path: Path, name: str, lines: list[str], eol: str = "\r\n", final_eol: bool = True) -> Path:
    p = tmp_path / name
    p.write_bytes((eol.join(lines) + (eol if final_eol else "")).encode())
    return p


def test_azure_functions_loader_reads_crlf_and_spreads_counts_within_minutes(tmp_path: Path) -> None:
    """A CRLF file parses to FunctionTraces; arrivals put exactly each minute's count inside that minute."""
    p = _write(tmp_path, "inv.csv", [
        "HashOwner,HashApp,HashFunction,Trigger,1,2,3",
        "o1,a1,f1,http,3,0,2",
        "o2,a2,f2,timer,1,1,1",
    ])
    fns = A.load_azure_functions_invocations(p)
    assert [(f.owner, f.app, f.name, f.trigger) for f in fns] == [("o1", "a1", "f1", "http"), ("o2", "a2", "f2", "timer")]
    assert fns[0].counts.tolist() == [3, 0, 2] and fns[0].total == 5 and fns[0].minutes == 3
    assert fns[0].mean_rate == pytest.approx(5 / 180)
    t = fns[0].arrivals(seed=1)
    assert np.histogram(t, bins=[0, 60, 120, 180])[0].tolist() == [3, 0, 2]
    assert np.all(np.diff(t) >= 0)
    assert np.array_equal(t, fns[0].arrivals(seed=1))
    assert fns[0].arrivals(seed=1, minutes=2).size == 3
    with pytest.raises(ConfigError, match="minutes 4"):
        fns[0].arrivals(seed=1, minutes=4)


def test_azure_functions_loader_rejects_a_bad_header(tmp_path: Path) -> None:
    """A wrong identifier column or out-of-order minute columns fail at line 1 with the expected header."""
    p = _write(tmp_path, "bad.csv", ["Owner,HashApp,HashFunction,Trigger,1,2", "o,a,f,http,1,2"])
    with pytest.raises(ConfigError) as exc:
        A.load_azure_functions_invocations(p)
    assert f"{p}:1:" in str(exc.value) and "HashOwner,HashApp,HashFunction,Trigger" in str(exc.value)
    p2 = _write(tmp_path, "bad2.csv", ["HashOwner,HashApp,HashFunction,Trigger,1,3", "o,a,f,http,1,2"])
    with pytest.raises(ConfigError, match=r":1: minute columns must be 1,2,...,N.*'3'"):
        A.load_azure_functions_invocations(p2)


@pytest.mark.parametrize("row,needle", [
    ("o,a,f,http,1,x,3", ":3: column minute 2 is 'x', not an integer"),
    ("o,a,f,http,1,-2,3", ":3: column minute 2 is -2, a negative count"),
    ("o,a,f,http,1,2", ":3: 6 fields, but the header has 7"),
])
def test_azure_functions_loader_names_file_and_line_of_a_bad_row(tmp_path: Path, row: str, needle: str) -> None:
    """Non-numeric, negative and short rows fail with file:line and the column."""
    p = _write(tmp_path, "inv.csv", ["HashOwner,HashApp,HashFunction,Trigger,1,2,3", "o,a,g,http,0,0,0", row])
    with pytest.raises(ConfigError) as exc:
        A.load_azure_functions_invocations(p)
    assert str(p) + needle in str(exc.value)


def test_llm_trace_loader_keeps_seven_fractional_digits_and_sorts(tmp_path: Path) -> None:
    """Timestamps become exact seconds after the earliest request; out-of-order rows are sorted."""
    p = _write(tmp_path, "llm.csv", [
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:17:03.9799600,4808,10",
        "2023-11-16 18:17:04.0000001,100,7",
        "2023-11-16 18:17:03.9799599,5,1",
        "2023-11-16 18:18:00,20,2",
    ], final_eol=False)
    tr = A.load_azure_llm_trace(p)
    assert len(tr) == 4
    np.testing.assert_allclose(tr.arrivals, [0.0, 1e-7, 0.0200402, 56.0200401], rtol=0, atol=1e-12)
    assert tr.context_tokens.tolist() == [5, 4808, 100, 20]
    assert tr.generated_tokens.tolist() == [1, 10, 7, 2]
    assert str(tr.start) == "2023-11-16 18:17:03.979960"
    assert tr.duration == pytest.approx(56.0200401, abs=1e-12)


@pytest.mark.parametrize("row,needle", [
    ("2023-11-16 18:17:0x,1,2", ":3: TIMESTAMP '2023-11-16 18:17:0x'"),
    ("2023-11-16 18:17:05.5,1,two", ":3: column GeneratedTokens is 'two'"),
    ("2023-11-16 18:17:05.5,1", ":3: 2 fields, expected 3"),
])
def test_llm_trace_loader_names_the_bad_line(tmp_path: Path, row: str, needle: str) -> None:
    """Malformed timestamps, token counts and short rows fail with file:line."""
    p = _write(tmp_path, "llm.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03.1,1,1", row])
    with pytest.raises(ConfigError) as exc:
        A.load_azure_llm_trace(p)
    assert str(p) + needle in str(exc.value)
    bad_header = _write(tmp_path, "h.csv", ["TIME,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03,1,1"])
    with pytest.raises(ConfigError, match=":1: header starts"):
        A.load_azure_llm_trace(bad_header)


def test_burstgpt_loader_filters_by_model(tmp_path: Path) -> None:
    """BurstGPT rows map request/response tokens to context/generated tokens; model filtering works."""
    p = _write(tmp_path, "burst.csv", [
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
        "5,ChatGPT,100,20,120,Conversation log",
        "7.5,GPT-4,300,0,300,API log",
        "9,ChatGPT,50,5,55,Conversation log",
    ], eol="\n")
    tr = A.load_burstgpt_trace(p)
    assert tr.arrivals.tolist() == [0.0, 2.5, 4.0] and tr.start is None
    gpt = A.load_burstgpt_trace(p, model="ChatGPT")
    assert gpt.arrivals.tolist() == [0.0, 4.0] and gpt.context_tokens.tolist() == [100, 50]
    with pytest.raises(ConfigError, match="no rows for model 'Claude'"):
        A.load_burstgpt_trace(p, model="Claude")


def test_rate_series_loader_accepts_crlf_and_trailing_blanks(tmp_path: Path) -> None:
    """One rate per line, CRLF, trailing blank lines ignored; arrivals follow the series."""
    p = _write(tmp_path, "rates.txt", ["5", "5.70000000000000", "0", "", ""])
    rs = A.load_rate_series(p, step_s=2.0)
    assert rs.rates.tolist() == [5.0, 5.7, 0.0] and rs.step_s == 2.0 and rs.horizon == 6.0
    t = rs.arrivals(seed=1)
    assert np.array_equal(t, A.arrivals_from_rates(rs.rates, 2.0, seed=1))
    assert not np.any(t >= 4.0)  # the last step has rate 0


@pytest.mark.parametrize("lines,needle", [
    (["1", "", "2"], ":2: a blank line is not a request rate"),
    (["1", "-3"], ":2: '-3' is not a request rate"),
    (["1", "2", "fast"], ":3: 'fast' is not a request rate"),
])
def test_rate_series_loader_names_the_bad_line(tmp_path: Path, lines: list[str], needle: str) -> None:
    """Blank lines inside the series, negative and non-numeric rates fail with file:line."""
    p = _write(tmp_path, "rates.txt", lines)
    with pytest.raises(ConfigError) as exc:
        A.load_rate_series(p)
    assert str(p) + needle in str(exc.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A path that does not exist is a ConfigError naming it."""
    missing = tmp_path / "nope.csv"
    with pytest.raises(ConfigError, match="nope.csv"):
        A.load_azure_functions_invocations(missing)
    with pytest.raises(ConfigError, match="nope.csv"):
        A.load_rate_series(missing)


# ---- the bundled traces (gfaas/sim/data, copies of the public traces named in SOURCES.md) --------------------------------------------------------------------------


def test_shared_azure_functions_example() -> None:
    """The 3-function schema example (4 rows): triggers, totals and a full day of minutes."""
    fns = A.load_azure_functions_invocations(trace_path("azure-functions-example"))
    assert [f.trigger for f in fns] == ["queue", "queue", "queue", "timer"]
    assert [f.total for f in fns] == [1150, 1125, 1125, 1125]
    assert {f.minutes for f in fns} == {1440}
    assert fns[0].function.startswith("c13acdc7567b")
    assert fns[3].arrivals(seed=0).size == 1125


def test_shared_azure_llm_code_trace() -> None:
    """The Azure LLM code trace: 8819 requests over ~57 min, first gap 52 ms."""
    tr = A.load_azure_llm_trace(trace_path("azure-llm-code"))
    assert len(tr) == 8819
    assert tr.arrivals[0] == 0.0 and tr.arrivals[1] == pytest.approx(0.052, abs=1e-9)
    assert tr.duration == pytest.approx(3435.948056, abs=1e-6)
    assert (tr.context_tokens[0], tr.generated_tokens[0]) == (4808, 10)
    assert np.all(np.diff(tr.arrivals) >= 0)


def test_shared_lambdascale_rates() -> None:
    """lambda-scale Burst.txt: 1007 rates, max 14.3, mean about 4.05."""
    rs = A.load_rate_series(trace_path("lambdascale-burst"))
    assert rs.rates.size == 1007 and rs.rates.max() == 14.3 and rs.rates.min() == 0.0
    assert rs.mean_rate == pytest.approx(4.05, abs=0.005)


def test_bundled_traces_match_their_sources_and_reject_unknown_names() -> None:
    """Every bundled trace exists in the package; an unknown name names the choices."""
    for name in BUNDLED_TRACES:
        assert trace_path(name).is_file()
    sources = (trace_path("azure-llm-code").parent / "SOURCES.md").read_text()
    for rel in BUNDLED_TRACES.values():
        assert rel.split("/")[0] in sources
    with pytest.raises(ConfigError, match="azure-llm-code"):
        trace_path("nope")
