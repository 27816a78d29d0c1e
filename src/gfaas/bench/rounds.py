"""Rows measured in several rounds, and what the rounds say together (``gfaas bench overload --rounds``).

One row per connection count, each run once, made the goodput ratios of ``overload*.json`` follow
whatever the shared 2-core machine was doing in those ten seconds: rows of one server at one count
differ by a tenth or more from round to round (``goodput_runs`` in the committed files: 1,549-2,155/s
at 16 connections in ``overload.json``), more than the gap the 2,000/16 target is about. Rounds run the counts forward, then backward, and so on (16, 256,
2,000, 2,000, 256, 16, ...), so a slow drift weighs on every count alike and no count always runs on
the freshest server; a count's goodput is then the median of its rounds. Refusal latencies take the
worst round (a target on them must not be met by one lucky round); counts of requests add up.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["round_order", "summarize"]


def round_order(connections: Sequence[int], rounds: int) -> list[tuple[int, int]]:
    """``(round, connections)`` in the order to measure them: forward in even rounds, backward in odd."""
    out: list[tuple[int, int]] = []
    for r in range(rounds):
        seq = list(connections) if r % 2 == 0 else list(reversed(connections))
        out += [(r, n) for n in seq]
    return out


def _worst(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per connection count, in the order the counts first appear in ``rows``: the median
    goodput, latencies and load generator CPU of its rounds, each round's goodput, the worst refusal
    p99s, and sums of the request counts. A file of one round per count gives its rows back as they are
    (with ``rounds`` 1 and ``goodput_runs``)."""
    counts: list[int] = []
    for r in rows:
        if r["connections"] not in counts:
            counts.append(r["connections"])
    out = []
    for n in counts:
        rs = [r for r in rows if r["connections"] == n]
        med = {k: statistics.median(r[k] for r in rs) for k in ("goodput_rps", "p50_ms", "p99_ms", "loadgen_cpu_frac")}
        line: dict[str, Any] = {"connections": n, "rounds": len(rs), **{k: round(v, 3) for k, v in med.items()},
                                "goodput_runs": [r["goodput_rps"] for r in rs]}
        for k in ("sent", "ok", "rejected", "failed", "lost", "duplicated"):
            line[k] = sum(r[k] for r in rs)
        for k in ("reject_p99_ms", "reject_p99_after_1s_ms"):
            line[k] = _worst([r.get(k) for r in rs])
        out.append(line)
    return out
