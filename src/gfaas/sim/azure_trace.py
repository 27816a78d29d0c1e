"""Load one day of the Azure Functions 2019 trace (Shahrad et al., ATC'20) as a :class:`FunctionDay`.

A trace directory holds three files, under either set of names:

* invocations: ``invocations.csv`` or ``invocations_per_function_md.anon.dNN.csv``
  (``HashOwner,HashApp,HashFunction,Trigger,1..1440``: invocations per minute);
* durations: ``durations.csv`` or ``function_durations_percentiles.anon.dNN.csv``
  (``HashOwner,HashApp,HashFunction,Average,...``: average milliseconds);
* memory: ``memory.csv`` (per function, ``HashOwner,HashApp,HashFunction,SampleCount,AverageAllocatedMb,...``,
  as in the schema example) or ``app_memory_percentiles.anon.dNN.csv`` (per *application*,
  ``HashOwner,HashApp,SampleCount,AverageAllocatedMb,...``, as published).

The published trace gives memory per application, not per function. We split an application's average
allocated memory evenly among its functions in the invocations file, so that an application whose
functions are all loaded holds its measured memory. (Shahrad et al. simulate whole applications; a
per-function replay with the even split keeps the total.) A function with no duration or memory row
gets the median of the others (logged). With several days (``d01``, ``d02``, ...) the first is used.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .arrivals import _rows, load_azure_functions_invocations
from .arrivals import _table as _rows_of
from .synthetic_functions import FunctionDay

log = logging.getLogger(__name__)

__all__ = ["load_function_day"]

_FILES = {
    "invocations": ("invocations.csv", "invocations_per_function_md.anon.d*.csv"),
    "durations": ("durations.csv", "function_durations_percentiles.anon.d*.csv"),
    "memory": ("memory.csv", "app_memory_percentiles.anon.d*.csv"),
}
_DUR_COLS = ["HashOwner", "HashApp", "HashFunction", "Average"]
_MEM_FN_COLS = ["HashOwner", "HashApp", "HashFunction", "SampleCount", "AverageAllocatedMb"]
_MEM_APP_COLS = ["HashOwner", "HashApp", "SampleCount", "AverageAllocatedMb"]


def _find(root: Path, what: str) -> Path:
    plain, pattern = _FILES[what]
    if (root / plain).is_file():
        return root / plain
    days = sorted(root.glob(pattern))
    if days:
        if len(days) > 1:
            log.info("%s: %d days of %s files; using %s", root, len(days), what, days[0].name)
        return days[0]
    raise ConfigError(f"{root}: no {what} file; expected {plain} or {pattern.replace('*', 'NN')} "
                      f"(Azure Functions 2019 format)")


def _number(path: Path, line: int, col: str, cell: str) -> float:
    try:
        v = float(cell)
    except ValueError:
        raise ConfigError(f"{path}:{line}: {col} = {cell!r} is not a number") from None
    if not v >= 0:
        raise ConfigError(f"{path}:{line}: {col} = {cell!r}; expected a number >= 0")
    return v


def _table(path: Path, expected: list[str], key_cols: int, value_col: str, what: str) -> dict[tuple[str, ...], float]:
    """``key columns -> value`` of a per-function table (rows read and checked by arrivals' reader)."""
    rows = list(_rows_of(path, expected, what))  # checks the header (and an empty file) first
    idx = _header(path).index(value_col)
    return {tuple(c.strip() for c in row[:key_cols]): _number(path, line, value_col, row[idx]) for line, row in rows}


def _header(path: Path) -> list[str]:
    for _, row in _rows(path):
        return [c.strip() for c in row]
    return []


def load_function_day(directory: str | Path) -> FunctionDay:
    """The trace directory's functions: per-minute counts, memory (MB) and average duration (ms)."""
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"--trace {str(root)!r} is not a directory; give the directory holding "
                          f"invocations.csv, durations.csv and memory.csv (or the per-day trace files)")
    inv_path = _find(root, "invocations")
    fns = load_azure_functions_invocations(inv_path)
    if not fns:
        raise ConfigError(f"{inv_path}: no function rows; expected HashOwner,HashApp,HashFunction,Trigger,1..1440")
    dur = _table(_find(root, "durations"), _DUR_COLS, 3, "Average", "durations")
    mem_path = _find(root, "memory")
    head = _header(mem_path)
    per_app = head[: len(_MEM_APP_COLS)] == _MEM_APP_COLS
    if not per_app and head[: len(_MEM_FN_COLS)] != _MEM_FN_COLS:
        raise ConfigError(f"{mem_path}:1: header starts {','.join(head[:5])!r}; a memory file starts with "
                          f"{','.join(_MEM_FN_COLS)!r} (per function) or {','.join(_MEM_APP_COLS)!r} (per app)")
    if per_app:
        mem = _table(mem_path, _MEM_APP_COLS, 2, "AverageAllocatedMb", "app memory")
    else:
        mem = _table(mem_path, _MEM_FN_COLS, 3, "AverageAllocatedMb", "memory")
    app_size: dict[tuple[str, str], int] = {}
    for f in fns:
        app_size[(f.owner, f.app)] = app_size.get((f.owner, f.app), 0) + 1
    memory = np.full(len(fns), np.nan)
    duration = np.full(len(fns), np.nan)
    for i, f in enumerate(fns):
        d = dur.get((f.owner, f.app, f.function))
        if d is not None:
            duration[i] = d
        if per_app:
            m = mem.get((f.owner, f.app))
            if m is not None:
                memory[i] = m / app_size[(f.owner, f.app)]
        else:
            m = mem.get((f.owner, f.app, f.function))
            if m is not None:
                memory[i] = m
    for name, arr in (("memory", memory), ("duration", duration)):
        missing = np.isnan(arr)
        if missing.any():
            fill = float(np.nanmedian(arr)) if (~missing).any() else (170.0 if name == "memory" else 1000.0)
            log.warning("%s: %d of %d functions have no %s row; using the median %.1f", root,
                        int(missing.sum()), len(fns), name, fill)
            arr[missing] = fill
    width = max(f.counts.size for f in fns)
    counts = np.zeros((len(fns), width), dtype=np.int32)
    for i, f in enumerate(fns):
        counts[i, : f.counts.size] = f.counts
    return FunctionDay(counts, memory, duration, [f.function for f in fns], [f.trigger for f in fns], str(root))
