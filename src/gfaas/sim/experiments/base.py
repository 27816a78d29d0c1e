"""What every experiment returns and how it is written out (JSON, Markdown table, PNG figure)."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError

log = logging.getLogger(__name__)

#: The default tolerance of a paper comparison, relative to the paper's value: ours is "within"
#: when it is no further than this fraction of the paper's number from it. Relative, not in
#: percentage points: a paper's 7% reduction is not matched by our 0%, whatever the scale.
DEFAULT_REL_TOL = 0.25

Progress = Callable[[int, int, str], None]


def _quiet(done: int, total: int, what: str) -> None:
    del done, total, what


@dataclass
class Comparison:
    """One headline number of the paper next to ours, with the tolerance it is judged by.

    ``within`` means ``|ours - paper| <= rel_tol * |paper|`` (or ``<= abs_tol``, for a paper value
    at or near zero, where a relative band is empty): the same rule for reductions (``%``) and
    ratios (``x``). An experiment that sets a tolerance other than the default says why next to it.
    """

    metric: str
    paper: float
    ours: float
    unit: str = "%"  # "%": a reduction in percent; "x": a ratio
    rel_tol: float = DEFAULT_REL_TOL
    abs_tol: float = 0.0
    #: "max": the paper states an upper bound ("<= 1.3x"): within iff ours does not exceed it (the
    #: tolerances are not used); "min": a lower bound; "": a value to match within the tolerance.
    bound: str = ""

    def __post_init__(self) -> None:
        if self.rel_tol < 0 or self.abs_tol < 0:
            raise ConfigError(f"{self.metric}: tolerances must be >= 0 (rel_tol={self.rel_tol}, abs_tol={self.abs_tol})")
        if self.bound not in ("", "max", "min"):
            raise ConfigError(f"{self.metric}: bound={self.bound!r}; use '', 'max' or 'min'")

    @property
    def band(self) -> float:
        """How far from the paper's value ours may be."""
        return max(self.rel_tol * abs(self.paper), self.abs_tol)

    @property
    def within(self) -> bool:
        if self.bound == "max":
            return self.ours <= self.paper
        if self.bound == "min":
            return self.ours >= self.paper
        return abs(self.ours - self.paper) <= self.band

    @property
    def tolerance_text(self) -> str:
        if self.bound:
            return "at most the paper's" if self.bound == "max" else "at least the paper's"
        text = f"±{self.rel_tol * 100:g}%"
        return text + (f" (at least ±{self.abs_tol:g}{'%' if self.unit == '%' else 'x'})" if self.abs_tol else "")

    @property
    def same_direction(self) -> bool:
        if self.unit == "%":
            return (self.ours > 0) == (self.paper > 0) or abs(self.paper) < 1
        return (self.ours > 1) == (self.paper > 1) or abs(self.paper - 1) < 0.01

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "paper": self.paper, "ours": round(self.ours, 2), "unit": self.unit,
                "tolerance": {"relative": self.rel_tol, "absolute": self.abs_tol}, "bound": self.bound,
                "within_tolerance": self.within, "same_direction": self.same_direction}


@dataclass
class Result:
    experiment: str
    title: str
    rows: list[dict[str, Any]]
    paper: list[Comparison]
    figure: dict[str, Any] = field(default_factory=dict)  # {"x": key, "y": key, "series": key, "logy": bool}
    notes: str = ""
    #: Data beside the rows (written to the JSON as "data" when there is any), e.g. a time series.
    data: dict[str, Any] = field(default_factory=dict)
    #: An experiment's own figure, ``plotter(result, plt) -> matplotlib Figure``, instead of the generic
    #: one that ``figure`` describes (not written to the JSON).
    plotter: Callable[[Result, Any], Any] | None = field(default=None, repr=False, compare=False)

    @property
    def within_tolerance(self) -> bool:
        return all(c.within for c in self.paper)

    def as_json(self) -> dict[str, Any]:
        out = {"experiment": self.experiment, "title": self.title, "rows": self.rows,
               "paper": [c.as_dict() for c in self.paper], "within_tolerance": self.within_tolerance,
               "notes": self.notes}
        if self.data:
            out["data"] = self.data
        return out

    def markdown(self) -> str:
        lines = [f"## {self.title} (`gfaas sim run {self.experiment}`)", ""]
        if self.paper:
            lines += ["| metric | paper | ours | tolerance (of the paper's value) | within | same direction |",
                      "|---|---:|---:|:-:|:-:|:-:|"]
            for c in self.paper:
                u = "%" if c.unit == "%" else "x"
                lines.append(f"| {c.metric} | {c.paper:g}{u} | {c.ours:.1f}{u} | {c.tolerance_text} |"
                             f" {'yes' if c.within else 'no'} | {'yes' if c.same_direction else 'no'} |")
            lines.append("")
        if self.rows:
            keys = list(self.rows[0])
            lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            for r in self.rows:
                lines.append("| " + " | ".join(_fmt(r.get(k)) for k in keys) + " |")
            lines.append("")
        if self.notes:
            lines += [self.notes, ""]
        return "\n".join(lines)

    def write(self, out_dir: str) -> list[str]:
        """Write NAME.json, NAME.md and (with matplotlib) NAME.png; return the paths written."""
        os.makedirs(out_dir, exist_ok=True)
        base = os.path.join(out_dir, self.experiment)
        paths = [base + ".json", base + ".md"]
        with open(paths[0], "w") as f:
            json.dump(self.as_json(), f, indent=1)
        with open(paths[1], "w") as f:
            f.write(self.markdown())
        png = self._plot(base + ".png")
        if png:
            paths.append(png)
        return paths

    def _plot(self, path: str) -> str | None:
        if not (self.figure or self.plotter) or not self.rows:
            return None
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log.warning("matplotlib is not installed, so no PNG for %s (pip install 'gfaas[plot]')", self.experiment)
            return None
        if self.plotter is not None:
            own = self.plotter(self, plt)
            own.savefig(path, dpi=110)
            plt.close(own)
            return path
        fig_spec = self.figure
        panels = sorted({r.get(fig_spec.get("panel", ""), "") for r in self.rows}, key=str)
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
        for ax, panel in zip(axes[0], panels, strict=True):
            rows = [r for r in self.rows if r.get(fig_spec.get("panel", ""), "") == panel]
            series = sorted({r[fig_spec["series"]] for r in rows}, key=str)
            xs = sorted({r[fig_spec["x"]] for r in rows}, key=lambda v: (isinstance(v, str), v))
            if all(isinstance(x, (int, float)) for x in xs):
                for s in series:
                    pts = sorted((r[fig_spec["x"]], r[fig_spec["y"]]) for r in rows if r[fig_spec["series"]] == s)
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=str(s))
                if fig_spec.get("logx"):
                    ax.set_xscale("log")
            else:
                width = 0.8 / max(len(series), 1)
                for i, s in enumerate(series):
                    vals = [next((r[fig_spec["y"]] for r in rows if r[fig_spec["series"]] == s and
                                  r[fig_spec["x"]] == x), 0.0) for x in xs]
                    ax.bar([j + i * width for j in range(len(xs))], vals, width, label=str(s))
                ax.set_xticks([j + 0.4 - width / 2 for j in range(len(xs))], [str(x) for x in xs], rotation=30)
            if fig_spec.get("logy"):
                ax.set_yscale("log")
            ax.set_title(str(panel))
            ax.set_xlabel(fig_spec["x"])
            ax.set_ylabel(fig_spec["y"])
        axes[0][-1].legend(fontsize=7)
        fig.suptitle(self.title, fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)



def int_param(params: Mapping[str, str], key: str, default: int, low: int = 1) -> int:
    """An experiment's ``--set key=N``: a whole number >= ``low``, or ``default`` when not given."""
    raw = params.get(key)
    if raw in (None, ""):
        return default
    try:
        v = int(str(raw))
    except ValueError:
        v = low - 1
    if v < low:
        raise ConfigError(f"{key}={raw!r}: give a whole number >= {low}")
    return v


def float_param(params: Mapping[str, str], key: str, default: float) -> float:
    """An experiment's ``--set key=X``: a finite number > 0, or ``default`` when not given."""
    raw = params.get(key)
    if raw in (None, ""):
        return default
    try:
        v = float(str(raw))
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise ConfigError(f"{key}={raw!r}: give a number > 0")
    return v

def reduction(ours: float, baseline: float) -> float:
    """Percent reduction of ``ours`` against ``baseline`` (positive when ours is lower)."""
    return (1.0 - ours / baseline) * 100.0 if baseline > 0 else 0.0


def mean(xs: Sequence[float]) -> float:
    if not xs:
        raise ConfigError("mean of no values")
    return sum(xs) / len(xs)


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    run: Callable[..., Result]  # run(quick, progress, **params)
    paper_ref: str
    #: the ``KEY=VALUE`` parameters it takes (``gfaas sim run NAME --set KEY=VALUE``), as strings
    params: tuple[str, ...] = ()
    #: part of ``gfaas sim run all`` (heavy experiments are run and saved on their own)
    in_all: bool = True


REGISTRY: dict[str, Experiment] = {}


def register(name: str, title: str, paper_ref: str, *, params: tuple[str, ...] = (),
             in_all: bool = True) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    def deco(fn: Callable[..., Result]) -> Callable[..., Result]:
        REGISTRY[name] = Experiment(name, title, fn, paper_ref, params, in_all)
        return fn

    return deco


def run_experiment(name: str, quick: bool = False, progress: Progress | None = None,
                   params: dict[str, str] | None = None) -> Result:
    if name not in REGISTRY:
        raise ConfigError(f"unknown experiment {name!r}; `gfaas sim list` shows: {', '.join(REGISTRY)}")
    exp = REGISTRY[name]
    unknown = sorted(set(params or {}) - set(exp.params))
    if unknown:
        takes = ", ".join(exp.params) if exp.params else "none"
        raise ConfigError(f"experiment {name!r} has no parameter {', '.join(map(repr, unknown))}; it takes: {takes}")
    return exp.run(quick, progress or _quiet, **(params or {}))
