"""Keep-alive simulator: replay a day of per-minute invocation counts under keep-alive policies.

The model, per function (one instance, as in Shahrad et al.'s ATC'20 simulation), in minutes:

* An invocation occupies the minute it arrives in. The policy object (the same
  :func:`gfaas.policy.autoscale.keep_alive_policy` object the runtime uses) is told of each minute
  with invocations, at ``now = minute * 60`` s, and then asked for ``keep_alive_s`` ``k`` and
  ``prewarm_after_s`` ``p`` (both measured from that invocation).
* With ``p`` None the instance stays loaded until ``k`` after the invocation; with ``p`` it is
  unloaded right after the minute and loaded again from ``p`` to ``p + k``. The next invocation
  ``i`` minutes later is warm iff it falls in the loaded interval: ``i <= k`` (no pre-warm), or
  ``p <= i <= p + k`` (bounds inclusive; a pre-warm under one minute counts as "keep loaded").
* The day's first invocation of a function is a cold start; a cold start counts once per cold
  minute (the instance then serves that minute's invocations).
* Idle memory: the function's memory times the loaded minutes that serve no invocation, i.e.
  ``|[max(p, 1), p + k] & [1, i]|`` minutes for each gap, and after the last invocation up to the
  end of the day.

Output: total cold starts, the 75th percentile over functions (with any invocation) of each
function's cold-start percentage (cold starts / invocations x 100), and idle memory in GB-minutes
(GB = 1024 MB). Policies whose decisions never depend on the history (``stationary``: ``fixed:N``)
are evaluated for all functions at once with numpy; the others step through each function's
invocation minutes in Python (about a microsecond each, a few million per synthetic day).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..policy.autoscale import KeepAlive, keep_alive_policy
from .synthetic_functions import FunctionDay

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_POLICIES", "FIXED_CURVE_MIN", "PolicyResult", "simulate", "simulate_policy"]

DEFAULT_POLICIES = ("fixed:10", "fixed:60", "hybrid", "gfaas")
#: The fixed keep-alives of the Pareto curve (minutes).
FIXED_CURVE_MIN = (5, 10, 15, 20, 30, 45, 60, 90, 120)


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    cold_starts: int
    cold_start_pct_p75: float
    idle_memory_gb_min: float
    cold_per_function: np.ndarray  # int64
    idle_gb_min_per_function: np.ndarray  # float64

    def as_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "cold_starts": self.cold_starts,
                "cold_start_pct_p75": round(self.cold_start_pct_p75, 4),
                "idle_memory_gb_min": round(self.idle_memory_gb_min, 3)}


def _overlap_idle(p: float, k: float, i: np.ndarray | float) -> Any:
    """Idle loaded minutes in a gap of ``i`` minutes: |[max(p, 1), p + k] & [1, i]|."""
    return np.maximum(0.0, np.minimum(p + k, i) - max(p, 1.0))


def _stationary(day: FunctionDay, policy: KeepAlive) -> tuple[np.ndarray, np.ndarray]:
    k = policy.keep_alive_s(0.0) / 60.0
    pre = policy.prewarm_after_s(0.0)
    p = 0.0 if pre is None or pre < 60.0 else pre / 60.0
    rows, cols = np.nonzero(day.counts)
    n = day.functions
    same = rows[1:] == rows[:-1]
    gaps = (cols[1:] - cols[:-1]).astype(np.float64)
    warm = same & (gaps >= p) & (gaps <= p + k)
    cold_mask = np.ones(rows.size, dtype=bool)
    cold_mask[1:] = ~warm
    cold = np.bincount(rows[cold_mask], minlength=n).astype(np.int64)
    idle = np.where(same, _overlap_idle(p, k, gaps), 0.0)
    last = np.ones(rows.size, dtype=bool)
    last[:-1] = ~same
    tail = _overlap_idle(p, k, (day.minutes - cols[last]).astype(np.float64))
    idle_min = np.bincount(rows[:-1], weights=idle, minlength=n) + np.bincount(rows[last], weights=tail, minlength=n)
    return cold, idle_min


def _stepped(day: FunctionDay, name: str, progress: Callable[[int, int], None] | None) -> tuple[np.ndarray, np.ndarray]:
    n, minutes = day.functions, day.minutes
    cold = np.zeros(n, dtype=np.int64)
    idle_min = np.zeros(n, dtype=np.float64)
    rows, cols = np.nonzero(day.counts)
    bounds = np.searchsorted(rows, np.arange(n + 1))
    col_list = cols.tolist()
    for f in range(n):
        a, b = int(bounds[f]), int(bounds[f + 1])
        if a == b:
            continue
        pol = keep_alive_policy(name)
        on, keep, pre = pol.on_invocation, pol.keep_alive_s, pol.prewarm_after_s
        c, idle = 1, 0.0
        prev = col_list[a]
        on(prev * 60.0)
        k, p = keep(prev * 60.0) / 60.0, pre(prev * 60.0)
        pm = 0.0 if p is None or p < 60.0 else p / 60.0
        for t in col_list[a + 1:b]:
            i = t - prev
            if not (pm <= i <= pm + k):
                c += 1
            lo = pm if pm > 1.0 else 1.0
            hi = pm + k if pm + k < i else i
            if hi > lo:
                idle += hi - lo
            now = t * 60.0
            on(now)
            k, p = keep(now) / 60.0, pre(now)
            pm = 0.0 if p is None or p < 60.0 else p / 60.0
            prev = t
        idle += float(_overlap_idle(pm, k, float(minutes - prev)))
        cold[f], idle_min[f] = c, idle
        if progress is not None and f % 1000 == 999:
            progress(f + 1, n)
    return cold, idle_min


def simulate_policy(day: FunctionDay, name: str,
                    progress: Callable[[int, int], None] | None = None) -> PolicyResult:
    """Replay ``day`` under the keep-alive policy ``name`` (see the module docstring)."""
    t0 = time.perf_counter()
    probe = keep_alive_policy(name)
    if getattr(probe, "stationary", False):
        cold, idle_min = _stationary(day, probe)
    else:
        cold, idle_min = _stepped(day, name, progress)
    inv = day.counts.sum(axis=1, dtype=np.int64)
    used = inv > 0
    pct = 100.0 * cold[used] / inv[used]
    idle_gb = idle_min * day.memory_mb / 1024.0
    log.debug("%s: %d functions in %.2f s", name, day.functions, time.perf_counter() - t0)
    return PolicyResult(name, int(cold.sum()), float(np.percentile(pct, 75)) if pct.size else 0.0,
                        float(idle_gb.sum()), cold, idle_gb)


def simulate(day: FunctionDay, policies: Sequence[str] = DEFAULT_POLICIES,
             progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """The JSON document of ``gfaas sim keepalive`` (without provenance) for ``day``."""
    for name in policies:
        keep_alive_policy(name)  # refuse a bad name before any long run
    out = []
    for name in policies:
        if progress is not None:
            progress(name, 0, day.functions)
        cb = (lambda d, t, _n=name: progress(_n, d, t)) if progress is not None else None
        out.append(simulate_policy(day, name, cb).as_json())
    return {"functions": day.functions, "invocations": day.invocations, "source": day.source, "policies": out}


def fixed_curve(day: FunctionDay, minutes: Sequence[float] = FIXED_CURVE_MIN) -> list[dict[str, Any]]:
    """The fixed keep-alive Pareto curve: one point per keep-alive in ``minutes``."""
    return [simulate_policy(day, f"fixed:{m:g}").as_json() for m in minutes]


def pareto_figure(doc: dict[str, Any], curve: list[dict[str, Any]], path: str) -> bool:
    """Write the Pareto plot (idle GB-min vs cold-start % p75) to ``path``; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot([c["idle_memory_gb_min"] for c in curve], [c["cold_start_pct_p75"] for c in curve], "o-",
            color="0.5", label="fixed keep-alive (5-120 min)")
    for c in curve:
        ax.annotate(c["policy"].split(":")[1], (c["idle_memory_gb_min"], c["cold_start_pct_p75"]),
                    textcoords="offset points", xytext=(3, 3), fontsize=7, color="0.4")
    markers = iter("s^Dv*Px")
    for p in doc["policies"]:
        if p["policy"].startswith("fixed:"):
            continue
        ax.plot([p["idle_memory_gb_min"]], [p["cold_start_pct_p75"]], next(markers, "o"), markersize=9,
                label=p["policy"])
    ax.set_xlabel("idle memory of loaded instances (GB x minutes, one day)")
    ax.set_ylabel("cold starts, % of invocations (75th pct of functions)")
    ax.set_title(f"Keep-alive policies: {doc['functions']:,} functions, one day")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
