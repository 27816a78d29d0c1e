"""A synthetic trace in the Azure Functions 2019 format: bursty per-minute counts for the workflows.

The real trace (Shahrad et al., "Serverless in the Wild", ATC'20) is not shipped with gfaas, so the
cluster-scale experiment (``gfaas sim run cluster-day``) writes one of its own in the same file
format, ``HashOwner,HashApp,HashFunction,Trigger,1..N`` (one row per function, invocations per
minute), and reads it back through :func:`gfaas.sim.arrivals.load_azure_functions_invocations`:
pointing the experiment at the real ``invocations_per_function_md.anon.d01.csv`` is then a change of
path, not of code.

Burst model (our choices, every one a parameter; ATC'20 describes bursty functions qualitatively):

* each workflow has a mean rate: ``requests`` (the expected total over all rows) times its share in
  :data:`WORKFLOW_SHARES`;
* its arrivals follow :func:`gfaas.sim.arrivals.bursty`, a two-state on/off Markov-modulated Poisson
  process: bursts of mean :data:`BURST_ON_S` = 2 minutes at :data:`BURST_PEAK` = 4x the mean rate,
  calm spells of mean :data:`BURST_OFF_S` = 8 minutes at the rate that keeps the mean (here a quarter
  of the mean: ``(1 - duty * peak) / (1 - duty)`` with ``duty = on / (on + off)`` = 0.2), so a burst
  is 16x the calm rate and an hour holds about six bursts per workflow;
* the per-minute count of a row is the number of those arrivals in that minute. The positions
  within a minute are not written (the format has none); whoever reads the file spreads each
  minute's count again (``FunctionTrace.arrivals``: uniformly at random within the minute).

Identifiers: ``HashOwner`` and ``HashApp`` are SHA-256 hex digests like the real trace's (of
``"gfaas"`` and ``"gfaas/<workflow>"``), ``HashFunction`` is the workflow's name, so that a reader
can tell which row drives which workflow; ``Trigger`` is ``http``.
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .arrivals import bursty

__all__ = ["BURST_OFF_S", "BURST_ON_S", "BURST_PEAK", "WORKFLOW_SHARES", "burst_counts", "synthetic_azure_trace",
           "write_azure_invocations"]

#: Share of all requests per reference workflow (our choice: light, single-model workflows are
#: invoked most, the heavy fan-in video workflow least, echoing ATC'20's skew across functions).
WORKFLOW_SHARES: dict[str, float] = {"traffic": 0.25, "driving": 0.10, "video": 0.05, "image": 0.30,
                                     "social": 0.20, "yelp": 0.10}
#: Mean burst and calm lengths in seconds, and the burst rate as a multiple of the mean (our choices).
BURST_ON_S = 120.0
BURST_OFF_S = 480.0
BURST_PEAK = 4.0


def burst_counts(mean_rate: float, minutes: int, seed: int, *, peak: float = BURST_PEAK,
                 mean_on: float = BURST_ON_S, mean_off: float = BURST_OFF_S) -> np.ndarray:
    """Invocations per minute (int64, ``minutes`` values) of the burst model in the module docstring."""
    if isinstance(minutes, bool) or not isinstance(minutes, int) or minutes < 1:
        raise ConfigError(f"minutes={minutes!r}; give a whole number of minutes >= 1")
    if not (math.isfinite(mean_rate) and mean_rate >= 0):
        raise ConfigError(f"mean rate {mean_rate!r} must be a finite number >= 0 (requests per second)")
    duty = mean_on / (mean_on + mean_off)
    if not 1.0 <= peak <= 1.0 / duty:
        raise ConfigError(f"peak={peak!r} must be in [1, {1.0 / duty:g}]: above (on + off) / on the calm "
                          "rate would have to be negative to keep the mean")
    calm = mean_rate * (1.0 - duty * peak) / (1.0 - duty)
    times = bursty(mean_rate * peak, 60.0 * minutes, seed, rate_off=calm, mean_on=mean_on, mean_off=mean_off)
    return np.bincount((times // 60.0).astype(np.int64), minlength=minutes)[:minutes].astype(np.int64)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_azure_invocations(path: str | Path, counts: Mapping[str, np.ndarray], *, owner: str = "gfaas",
                            trigger: str = "http") -> Path:
    """Write per-minute ``counts`` (row name -> counts) as an Azure Functions 2019 invocations file."""
    if not counts:
        raise ConfigError("no rows to write; give at least one function's counts")
    widths = {name: len(c) for name, c in counts.items()}
    if len(set(widths.values())) != 1 or min(widths.values()) < 1:
        raise ConfigError(f"every row needs the same number (>= 1) of minutes; got {widths}")
    minutes = next(iter(widths.values()))
    p = Path(path)
    with p.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["HashOwner", "HashApp", "HashFunction", "Trigger", *range(1, minutes + 1)])
        for name, c in counts.items():
            arr = np.asarray(c)
            if arr.dtype.kind not in "iu" or (arr < 0).any():
                raise ConfigError(f"counts of {name!r} must be integers >= 0")
            w.writerow([_digest(owner), _digest(f"{owner}/{name}"), name, trigger, *arr.tolist()])
    return p


def synthetic_azure_trace(path: str | Path, requests: float, minutes: int = 60, seed: int = 0,
                          shares: Mapping[str, float] = WORKFLOW_SHARES) -> dict[str, np.ndarray]:
    """Write the module docstring's bursty trace for ``shares``' workflows to ``path``.

    ``requests``: the expected total over all rows and minutes (the realised total is random).
    Row ``i`` (in ``shares``' order) is drawn with seed ``seed + i``. Returns the counts written.
    """
    if not (math.isfinite(requests) and requests > 0):
        raise ConfigError(f"requests={requests!r} must be a finite number > 0 (the expected total)")
    total = sum(shares.values())
    if not shares or not math.isfinite(total) or total <= 0 or any(s < 0 for s in shares.values()):
        raise ConfigError(f"shares {dict(shares)} must be >= 0 with a positive sum")
    rate = requests / (60.0 * minutes)
    counts = {name: burst_counts(rate * s / total, minutes, seed + i) for i, (name, s) in enumerate(shares.items())}
    write_azure_invocations(path, counts)
    return counts
