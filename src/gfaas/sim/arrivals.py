"""Request arrival processes for the simulator: synthetic patterns and trace loaders.

Every generator returns a sorted float64 numpy array of arrival times in seconds within
``[0, horizon)`` and draws only from ``numpy.random.default_rng(seed)``, so the same arguments give
the same array.

Synthetic patterns follow the invocation behaviour that Shahrad et al. describe for Azure Functions
("Serverless in the Wild", USENIX ATC'20): most functions and applications are invoked rarely, and
invocation frequency spans many orders of magnitude across functions; timer triggers are among the
most common trigger types and give regular, periodic invocations; other functions arrive in bursts.
The paper characterises these shapes; the *numbers* below (rates, gap spreads, burst lengths) are
our own choices unless a docstring says otherwise, picked to give each shape clearly, and every one
is a parameter. Use the trace loaders when a study needs real numbers.

Trace loaders (all tolerant of CRLF line ends, all raising :class:`~gfaas.errors.ConfigError` with
``file:line`` for a bad row):

* :func:`load_azure_functions_invocations`: the Azure Functions 2019 per-minute invocation counts
  (``HashOwner,HashApp,HashFunction,Trigger,1..1440``);
* :func:`load_azure_llm_trace`: Azure LLM inference traces (``TIMESTAMP,ContextTokens,GeneratedTokens``,
  Patel et al., "Splitwise", ISCA'24);
* :func:`load_burstgpt_trace`: the BurstGPT format (``Timestamp,Model,Request tokens,...``);
* :func:`load_rate_series`: one request rate per line (e.g. lambda-scale's ``Burst.txt``).
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from ..errors import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "BURST_MEAN_OFF_S",
    "BURST_MEAN_ON_S",
    "PATTERNS",
    "PERIODIC_JITTER",
    "PERIODIC_PERIOD_S",
    "SPORADIC_RATE",
    "SPORADIC_SIGMA",
    "FunctionTrace",
    "LLMTrace",
    "RateSeries",
    "arrivals_from_rates",
    "bursty",
    "load_azure_functions_invocations",
    "load_azure_llm_trace",
    "load_burstgpt_trace",
    "load_rate_series",
    "pattern",
    "periodic",
    "poisson",
    "scale_to_rate",
    "sporadic",
]

# ---- defaults (see each generator's docstring for where they come from) ------------------------
#: Rate of a typical sporadic function: one invocation per hour. ATC'20 finds that most functions are
#: invoked very infrequently, with frequencies spanning about 8 orders of magnitude; the once-an-hour
#: value is our choice of a representative "rare" rate, not a number taken from the paper.
SPORADIC_RATE = 1.0 / 3600.0
#: Shape of the lognormal gaps of sporadic functions (our choice): CV of the gaps
#: ``sqrt(exp(sigma^2) - 1)`` = 2.9, i.e. far burstier than Poisson (CV 1), as ATC'20 finds for many
#: rarely-invoked functions, without tails so long that short horizons see no arrival at all.
SPORADIC_SIGMA = 1.5
#: Period of a timer trigger (our choice): once a minute, the finest common cron-style schedule.
PERIODIC_PERIOD_S = 60.0
#: Lateness of a timer firing, as a fraction of the period (our choice): up to 1 %.
PERIODIC_JITTER = 0.01
#: Mean length of a burst and of the quiet spell between bursts (our choice): 10 s on, 90 s off,
#: so a bursty function is active 10 % of the time and its burst rate is 10x its mean rate.
BURST_MEAN_ON_S = 10.0
BURST_MEAN_OFF_S = 90.0

PATTERNS = ("poisson", "sporadic", "periodic", "bursty")


# ---- validation helpers -------------------------------------------------------------------------
def _positive(what: str, x: float) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or not (math.isfinite(x) and x > 0):
        raise ConfigError(f"{what} {x!r} must be a finite number > 0")
    return float(x)


def _nonnegative(what: str, x: float) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or not (math.isfinite(x) and x >= 0):
        raise ConfigError(f"{what} {x!r} must be a finite number >= 0")
    return float(x)


def _rng(seed: int) -> np.random.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ConfigError(f"seed {seed!r} must be an integer (it seeds numpy.random.default_rng)")
    return np.random.default_rng(int(seed))


def _points_in_intervals(rng: np.random.Generator, starts: np.ndarray, lengths: np.ndarray,
                         counts: np.ndarray) -> np.ndarray:
    """``counts[i]`` independent uniform points in ``[starts[i], starts[i] + lengths[i])``, sorted."""
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, dtype=np.float64)
    base = np.repeat(starts, counts)
    width = np.repeat(lengths, counts)
    times = base + rng.random(total) * width
    # u < 1, but base + u * width can round up to the interval's end; keep the half-open promise.
    np.minimum(times, np.nextafter(base + width, base), out=times)
    times.sort()
    return times


def _piecewise_poisson(rng: np.random.Generator, starts: np.ndarray, lengths: np.ndarray,
                       rates: np.ndarray) -> np.ndarray:
    """A Poisson process whose rate is ``rates[i]`` on ``[starts[i], starts[i] + lengths[i])``.

    Given its count, a homogeneous Poisson process on an interval places its points independently
    and uniformly, so each piece is a Poisson count plus uniform positions: exact, and vectorised.
    """
    counts = rng.poisson(rates * lengths)
    return _points_in_intervals(rng, starts, lengths, counts)


# ---- synthetic generators -----------------------------------------------------------------------
def poisson(rate: float, horizon: float, seed: int) -> np.ndarray:
    """Homogeneous Poisson arrivals at ``rate`` per second over ``[0, horizon)`` (gap CV = 1).

    The memoryless baseline that most serverless simulators assume; ATC'20 shows that real functions
    depart from it in both directions (timers are more regular, bursts much less).
    """
    rate = _nonnegative("poisson rate", rate)
    horizon = _positive("horizon", horizon)
    rng = _rng(seed)
    return _piecewise_poisson(rng, np.zeros(1), np.array([horizon]), np.array([rate]))


def _renewal(rng: np.random.Generator, first: float, draw_gaps: Callable[[int], np.ndarray],
             mean_gap: float, horizon: float) -> np.ndarray:
    """Arrivals at ``first`` and then after successive gaps, up to ``horizon``; drawn in chunks."""
    if first >= horizon:
        return np.empty(0, dtype=np.float64)
    parts = [np.array([first])]
    t = first
    while True:
        expected = (horizon - t) / mean_gap
        chunk = int(expected * 1.1 + 10.0 * math.sqrt(expected) + 16)
        times = t + np.cumsum(draw_gaps(chunk))
        inside = times[times < horizon]
        parts.append(inside)
        if inside.size < times.size:
            break
        t = float(times[-1])
    return np.concatenate(parts)


def sporadic(rate: float, horizon: float, seed: int, *, sigma: float = SPORADIC_SIGMA) -> np.ndarray:
    """Rare invocations: a renewal process with lognormal gaps of mean ``1/rate``.

    ``rate`` (per second): the long-run mean rate; :data:`SPORADIC_RATE` (once an hour, our choice)
    is a representative value for a rarely used function, ATC'20's most common case. ``sigma``: the
    lognormal shape, default
    :data:`SPORADIC_SIGMA` = 1.5 (our choice; gap CV 2.9). ATC'20 reports heavy-tailed, highly
    variable inter-arrival times for such functions but gives no distribution; the lognormal is our
    choice.

    The process starts in steady state: the first arrival is a uniform fraction of a length-biased
    gap (for a lognormal ``(mu, sigma)`` gap, length-biased is lognormal ``(mu + sigma^2, sigma)``),
    so the count in ``[0, horizon)`` has mean exactly ``rate * horizon`` instead of being biased by
    a start at an arrival.
    """
    rate = _positive("sporadic rate", rate)
    horizon = _positive("horizon", horizon)
    sigma = _nonnegative("sporadic sigma", sigma)
    rng = _rng(seed)
    mean_gap = 1.0 / rate
    mu = math.log(mean_gap) - sigma * sigma / 2.0
    first = float(rng.random() * rng.lognormal(mu + sigma * sigma, sigma))
    return _renewal(rng, first, lambda k: rng.lognormal(mu, sigma, k), mean_gap, horizon)


def periodic(period: float, horizon: float, seed: int, *, jitter: float = PERIODIC_JITTER) -> np.ndarray:
    """Timer-triggered invocations: one every ``period`` seconds, each a little late.

    ``period``: seconds between ticks; :data:`PERIODIC_PERIOD_S` = 60 s is a once-a-minute timer
    (our choice of a typical value; ATC'20 finds timers among the most common triggers and notes
    their regular invocation pattern). The phase of the first tick is uniform in ``[0, period)`` so
    that many periodic functions do not fire in lockstep. ``jitter``: each firing is late by a
    uniform fraction of up to ``jitter * period``; default :data:`PERIODIC_JITTER` = 0.01 (our
    choice: timer delivery is not exact, but close). Must be below 1, which keeps the firings in
    tick order; the gap CV is ``jitter / sqrt(6)``.
    """
    period = _positive("period", period)
    horizon = _positive("horizon", horizon)
    jitter = _nonnegative("jitter", jitter)
    if jitter >= 1.0:
        raise ConfigError(f"jitter {jitter!r} must be below 1 (it is a fraction of the period {period} s); "
                          "larger lateness would reorder the ticks")
    rng = _rng(seed)
    phase = float(rng.random()) * period
    ticks = phase + period * np.arange(max(int(math.ceil((horizon - phase) / period)), 0))
    times = ticks + rng.random(ticks.size) * (jitter * period)
    return times[times < horizon]


def bursty(rate_on: float, horizon: float, seed: int, *, rate_off: float = 0.0,
           mean_on: float = BURST_MEAN_ON_S, mean_off: float = BURST_MEAN_OFF_S) -> np.ndarray:
    """On/off bursts: a two-state Markov-modulated Poisson process.

    During a burst requests arrive as Poisson at ``rate_on`` per second, between bursts at
    ``rate_off`` (default 0: silence). Burst and quiet durations are exponential with means
    ``mean_on`` = :data:`BURST_MEAN_ON_S` (10 s) and ``mean_off`` = :data:`BURST_MEAN_OFF_S` (90 s).
    ATC'20 describes bursty functions qualitatively; these durations are our choice. The mean rate
    is ``(rate_on * mean_on + rate_off * mean_off) / (mean_on + mean_off)``; use
    ``pattern("bursty", mean_rate, ...)`` to set that directly.

    The state at time 0 is drawn from the stationary distribution (on with probability
    ``mean_on / (mean_on + mean_off)``); exponential durations are memoryless, so the first
    spell's remaining length has the same law as a full one.
    """
    rate_on = _nonnegative("burst rate_on", rate_on)
    rate_off = _nonnegative("burst rate_off", rate_off)
    mean_on = _positive("mean burst length mean_on", mean_on)
    mean_off = _positive("mean quiet length mean_off", mean_off)
    horizon = _positive("horizon", horizon)
    rng = _rng(seed)
    on_first = bool(rng.random() < mean_on / (mean_on + mean_off))
    cycle = mean_on + mean_off
    n_pairs = int(horizon / cycle * 1.2 + 4.0 * math.sqrt(horizon / cycle) + 4)
    t = 0.0
    durations: list[np.ndarray] = []
    while t < horizon:
        on = rng.exponential(mean_on, n_pairs)
        off = rng.exponential(mean_off, n_pairs)
        pairs = np.column_stack((on, off) if on_first else (off, on)).ravel()
        durations.append(pairs)
        t += float(pairs.sum())
    lengths = np.concatenate(durations)
    starts = np.concatenate(([0.0], np.cumsum(lengths)[:-1]))
    keep = starts < horizon
    starts, lengths = starts[keep], lengths[keep]
    lengths = np.minimum(lengths, horizon - starts)
    first_rate, second_rate = (rate_on, rate_off) if on_first else (rate_off, rate_on)
    rates = np.where(np.arange(starts.size) % 2 == 0, first_rate, second_rate)
    return _piecewise_poisson(rng, starts, lengths, rates)


def pattern(name: str, mean_rate: float, horizon: float, seed: int) -> np.ndarray:
    """Arrivals of pattern ``name`` with long-run mean ``mean_rate`` per second.

    This is what lets an experiment say "bursty at 20 req/s": each pattern keeps its shape
    parameters at the module defaults and sets its rate parameter from ``mean_rate``:

    * ``poisson``: rate = mean_rate;
    * ``sporadic``: lognormal gaps of mean ``1/mean_rate``, sigma :data:`SPORADIC_SIGMA`;
    * ``periodic``: period ``1/mean_rate``, jitter :data:`PERIODIC_JITTER`;
    * ``bursty``: silence between bursts and burst rate ``mean_rate * (on + off) / on`` with the
      default burst and quiet lengths, so 10x the mean rate.
    """
    mean_rate = _positive("mean rate", mean_rate)
    if name == "poisson":
        return poisson(mean_rate, horizon, seed)
    if name == "sporadic":
        return sporadic(mean_rate, horizon, seed)
    if name == "periodic":
        return periodic(1.0 / mean_rate, horizon, seed)
    if name == "bursty":
        duty = BURST_MEAN_ON_S / (BURST_MEAN_ON_S + BURST_MEAN_OFF_S)
        return bursty(mean_rate / duty, horizon, seed)
    raise ConfigError(f"unknown arrival pattern {name!r}; valid names are {', '.join(PATTERNS)}")


def scale_to_rate(times: np.ndarray, rate: float, horizon: float) -> np.ndarray:
    """Stretch or compress time so that arrivals observed over ``horizon`` have mean ``rate``.

    Multiplies every time by ``(len(times) / horizon) / rate``; the new horizon is
    ``len(times) / rate``. Scaling time keeps the shape of the process (gap CV, order, relative burst
    structure) but shortens or lengthens its time scales (burst durations, timer periods) by the
    same factor; that is the usual way to replay a trace at a different load.
    """
    horizon = _positive("horizon", horizon)
    rate = _positive("target rate", rate)
    arr = np.asarray(times, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ConfigError(f"cannot scale {arr.size} arrival times (shape {arr.shape}) to a rate; give a "
                          "non-empty 1-D array")
    return arr * ((arr.size / horizon) / rate)


# ---- trace loaders ------------------------------------------------------------------------------
def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """CSV rows with their 1-based line numbers; ``newline=''`` lets csv handle LF and CRLF alike."""
    try:
        f = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise ConfigError(f"cannot open trace file {str(path)!r}: {exc.strerror or exc}; check the path") from exc
    with f:
        reader = csv.reader(f)
        line = 1
        try:
            for row in reader:
                yield line, row
                line = reader.line_num + 1
        except csv.Error as exc:
            raise ConfigError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from exc


def _int_cell(path: Path, line: int, column: str, cell: str) -> int:
    try:
        value = int(cell.strip())
    except ValueError:
        raise ConfigError(f"{path}:{line}: column {column} is {cell!r}, not an integer; fix or remove "
                          "the row") from None
    if value < 0:
        raise ConfigError(f"{path}:{line}: column {column} is {value}, a negative count; counts must be >= 0")
    return value


def _table(path: Path, expected: list[str], what: str) -> Iterator[tuple[int, list[str]]]:
    """The data rows of a CSV whose header must be ``expected``: blank rows skipped, widths checked."""
    rows = _rows(path)
    try:
        _, header = next(rows)
    except StopIteration:
        raise ConfigError(f"{path}: the file is empty; expected a header {','.join(expected)}") from None
    _check_header(path, header, expected, what)
    for line, row in rows:
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise ConfigError(f"{path}:{line}: {len(row)} fields, expected {len(header)} ({','.join(expected)})")
        yield line, row


def _check_header(path: Path, header: list[str], expected: list[str], what: str) -> None:
    got = [c.strip() for c in header[: len(expected)]]
    if got != expected:
        raise ConfigError(f"{path}:1: header starts {','.join(got)!r}; a {what} file starts with "
                          f"{','.join(expected)!r}")


@dataclass(frozen=True, eq=False)
class FunctionTrace:
    """One function of the Azure Functions 2019 trace: identifiers and per-minute counts."""

    owner: str
    app: str
    function: str
    trigger: str
    counts: np.ndarray  # int64, invocations in minute 1, 2, ...

    @property
    def name(self) -> str:
        """The function's hash (unique within a trace)."""
        return self.function

    @property
    def minutes(self) -> int:
        return int(self.counts.size)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def mean_rate(self) -> float:
        """Invocations per second over the whole trace."""
        return self.total / (60.0 * self.minutes)

    def arrivals(self, seed: int, minutes: int | None = None) -> np.ndarray:
        """Arrival times in seconds: each minute's count placed uniformly at random in that minute.

        The trace records only counts per minute, so the positions inside a minute are unknown; a
        uniform spread is the maximum-entropy choice and matches a Poisson process conditioned on
        the count. It smooths away any sub-minute burstiness the real function had. ``minutes``
        limits the result to the first that many minutes (default: all).
        """
        counts = self.counts
        if minutes is not None:
            if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= counts.size:
                raise ConfigError(f"minutes {minutes!r} must be an integer in 1..{counts.size} for function "
                                  f"{self.function[:12]}")
            counts = counts[:minutes]
        starts = 60.0 * np.arange(counts.size, dtype=np.float64)
        return _points_in_intervals(_rng(seed), starts, np.full(counts.size, 60.0), counts)


_AZURE_FN_COLS = ["HashOwner", "HashApp", "HashFunction", "Trigger"]


def load_azure_functions_invocations(path: str | Path) -> list[FunctionTrace]:
    """Read an Azure Functions 2019 invocations file (one row per function, counts per minute).

    Columns: ``HashOwner,HashApp,HashFunction,Trigger`` then minute columns ``1..N`` (``N`` = 1440,
    one day, in the published trace; shorter files are accepted as long as the minutes run 1..N).
    """
    p = Path(path)
    rows = _rows(p)
    try:
        _, header = next(rows)
    except StopIteration:
        raise ConfigError(f"{p}: the file is empty; expected a header "
                          f"{','.join(_AZURE_FN_COLS)},1,2,...,1440") from None
    _check_header(p, header, _AZURE_FN_COLS, "Azure Functions invocations")
    minute_cols = [c.strip() for c in header[4:]]
    if not minute_cols or minute_cols != [str(i) for i in range(1, len(minute_cols) + 1)]:
        bad = next((c for i, c in enumerate(minute_cols, 1) if c != str(i)), "(none)")
        raise ConfigError(f"{p}:1: minute columns must be 1,2,...,N after Trigger; found {bad!r} out of order "
                          f"or missing")
    width = len(header)
    out: list[FunctionTrace] = []
    for line, row in rows:
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != width:
            raise ConfigError(f"{p}:{line}: {len(row)} fields, but the header has {width}; every row needs "
                              f"the 4 identifier columns and {width - 4} minute counts")
        try:
            counts = np.array(row[4:]).astype(np.int64)
        except ValueError:
            counts = np.array([_int_cell(p, line, f"minute {i}", c) for i, c in enumerate(row[4:], 1)],
                              dtype=np.int64)
        if (counts < 0).any():
            i = int(np.flatnonzero(counts < 0)[0])
            _int_cell(p, line, f"minute {i + 1}", row[4 + i])
        owner, app, function, trigger = (c.strip() for c in row[:4])
        out.append(FunctionTrace(owner, app, function, trigger, counts))
    log.debug("loaded %d functions from %s", len(out), p)
    return out


@dataclass(frozen=True, eq=False)
class LLMTrace:
    """LLM requests: arrival seconds from the first request, and token counts per request."""

    arrivals: np.ndarray  # float64 seconds, sorted, starting at 0
    context_tokens: np.ndarray  # int64
    generated_tokens: np.ndarray  # int64
    start: datetime | None  # wall time of the first request, when the trace has absolute times
    source: str

    def __len__(self) -> int:
        return int(self.arrivals.size)

    @property
    def duration(self) -> float:
        """Seconds from the first to the last request."""
        return float(self.arrivals[-1]) if self.arrivals.size else 0.0

    @property
    def mean_rate(self) -> float:
        """Requests per second between the first and the last request."""
        d = self.duration
        return (len(self) - 1) / d if d > 0 else 0.0


def _parse_timestamp(p: Path, line: int, cell: str) -> tuple[datetime, float]:
    """Whole seconds as a datetime and the fraction as a float, so no digit of the 7 is lost."""
    text = cell.strip()
    whole, _, frac = text.partition(".")
    try:
        dt = datetime.fromisoformat(whole)
        if frac and not frac.isdigit():
            raise ValueError(frac)
    except ValueError:
        raise ConfigError(f"{p}:{line}: TIMESTAMP {cell!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'") from None
    return dt, (int(frac) / 10 ** len(frac) if frac else 0.0)


def _llm_trace(p: Path, times: list[float], ctx: list[int], gen: list[int],
               base: datetime | None) -> LLMTrace:
    """Sort by time if needed and make the times relative to the earliest request.

    ``times`` are seconds after ``base`` (a wall time), or after the trace's own origin if ``base``
    is None; the earliest request's wall time becomes the trace's ``start``.
    """
    t = np.asarray(times, dtype=np.float64)
    c = np.asarray(ctx, dtype=np.int64)
    g = np.asarray(gen, dtype=np.int64)
    if t.size == 0:
        raise ConfigError(f"{p}: no requests after the header; the trace is empty")
    if (np.diff(t) < 0).any():
        log.info("%s: requests are not in time order; sorting them", p)
        order = np.argsort(t, kind="stable")
        t, c, g = t[order], c[order], g[order]
    t0 = float(t[0])
    start = None if base is None else base + timedelta(seconds=t0)
    return LLMTrace(t - t0, c, g, start, str(p))


def load_azure_llm_trace(path: str | Path) -> LLMTrace:
    """Read an Azure LLM inference trace (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Timestamps look like ``2023-11-16 18:17:03.9799600`` (7 fractional digits, no time zone); they
    are turned into seconds after the earliest request. Rows out of time order are sorted.
    """
    p = Path(path)
    base: datetime | None = None
    times: list[float] = []
    ctx: list[int] = []
    gen: list[int] = []
    for line, row in _table(p, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], "Azure LLM trace"):
        dt, frac = _parse_timestamp(p, line, row[0])
        if base is None:
            base = dt
        # Whole seconds from the datetime difference plus the exact fraction: at a few thousand
        # seconds a float64 still resolves well below the 100 ns of the 7th digit.
        times.append((dt - base).total_seconds() + frac)
        ctx.append(_int_cell(p, line, "ContextTokens", row[1]))
        gen.append(_int_cell(p, line, "GeneratedTokens", row[2]))
    return _llm_trace(p, times, ctx, gen, base)


def load_burstgpt_trace(path: str | Path, model: str | None = None) -> LLMTrace:
    """Read a BurstGPT trace (``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``).

    ``Timestamp`` is seconds from the start of the trace; request and response tokens become context
    and generated tokens. ``model`` keeps only the rows of that model (e.g. ``"ChatGPT"``).
    """
    p = Path(path)
    expected = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]
    times: list[float] = []
    ctx: list[int] = []
    gen: list[int] = []
    for line, row in _table(p, expected, "BurstGPT"):
        if model is not None and row[1].strip() != model:
            continue
        try:
            t = float(row[0])
        except ValueError:
            t = math.nan
        if not (math.isfinite(t) and t >= 0):
            raise ConfigError(f"{p}:{line}: Timestamp {row[0]!r} is not a number of seconds >= 0")
        times.append(t)
        ctx.append(_int_cell(p, line, "Request tokens", row[2]))
        gen.append(_int_cell(p, line, "Response tokens", row[3]))
    if not times and model is not None:
        raise ConfigError(f"{p}: no rows for model {model!r}; check the Model column for the exact name")
    return _llm_trace(p, times, ctx, gen, None)


@dataclass(frozen=True, eq=False)
class RateSeries:
    """Request rates (per second), each holding for ``step_s`` seconds."""

    rates: np.ndarray  # float64
    step_s: float
    source: str

    @property
    def horizon(self) -> float:
        return float(self.rates.size * self.step_s)

    @property
    def mean_rate(self) -> float:
        return float(self.rates.mean()) if self.rates.size else 0.0

    def arrivals(self, seed: int) -> np.ndarray:
        """Piecewise-constant Poisson arrivals following the series (see :func:`arrivals_from_rates`)."""
        return arrivals_from_rates(self.rates, self.step_s, seed)


def load_rate_series(path: str | Path, step_s: float = 1.0) -> RateSeries:
    """Read one request rate per line (requests per second), e.g. lambda-scale's ``Burst.txt``.

    The time step is not part of the file; lambda-scale does not document it, so the default is one
    value per second (``step_s = 1.0``); pass another step if a study says otherwise. Blank lines
    are allowed only at the end (a blank line inside the series would silently shift time).
    """
    step_s = _positive("step_s", step_s)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ConfigError(f"cannot open rate file {str(p)!r}: {exc.strerror or exc}; check the path") from exc
    lines = text.splitlines()  # handles \n, \r\n and \r
    while lines and not lines[-1].strip():
        lines.pop()
    rates = np.empty(len(lines), dtype=np.float64)
    for i, raw in enumerate(lines):
        cell = raw.strip()
        try:
            value = float(cell)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            what = "a blank line" if not cell else repr(cell)
            raise ConfigError(f"{p}:{i + 1}: {what} is not a request rate; every line must hold one finite "
                              "number >= 0 (requests per second)")
        rates[i] = value
    if rates.size == 0:
        raise ConfigError(f"{p}: no rates in the file; expected one number per line")
    return RateSeries(rates, step_s, str(p))


def arrivals_from_rates(rates: np.ndarray, step_s: float, seed: int) -> np.ndarray:
    """Poisson arrivals whose rate is ``rates[i]`` during ``[i * step_s, (i + 1) * step_s)``."""
    step_s = _positive("step_s", step_s)
    r = np.asarray(rates, dtype=np.float64)
    if r.ndim != 1:
        raise ConfigError(f"rates must be a 1-D array, got shape {r.shape}")
    bad = np.flatnonzero(~(np.isfinite(r) & (r >= 0)))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"rate {i} is {float(r[i])!r}; rates must be finite and >= 0 (requests per second)")
    starts = step_s * np.arange(r.size, dtype=np.float64)
    return _piecewise_poisson(_rng(seed), starts, np.full(r.size, step_s), r)
