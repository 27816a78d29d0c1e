"""Design-space exploration of the accelerator (seed 004 §4.2, Fig. 7-8).

The space: square arrays from 4x4 to 1024x1024 (powers of two), total scratchpad from 128 KiB to
32 MiB at :data:`STEPS_PER_OCTAVE` sizes per doubling, and three DRAMs (DDR4 19.2, DDR5 38, HBM2
460 GB/s). Scratchpads scale with the array the way the paper asks ("sufficient on-chip resources
for the PEs"): an array keeps only the sizes on which the compiler can place one double-buffered
fold of it (for output-stationary, 4-byte partial sums of ``rows x cols`` in half the output
scratchpad, i.e. 32 bytes of scratchpad per PE with the presets' 1/4 : 1/2 : 1/4 split), so a
1024x1024 array gets only 32 MiB. Everything else (dataflow, clock, node, cells, precision) comes
from a base config, the ``dscs`` preset by default; the vector unit has one lane per array column,
as in the presets.

Speed: a compiled layer's shape (``m, k, n, groups`` and its byte counts) depends on the config only
through the element size (``precision``), never on the array or the scratchpads (tiling is what
changes, and the timing model re-derives its folds from the shape). So each model is compiled once
with the base config, and the same layer list is timed on every point.

Each point gets, per model at batch 1, a latency and an energy per inference; across the models the
mean and geometric-mean throughput (inferences/s), the chip's mean average power (its energy over
latency) and, apart, the DRAM traffic's; and the chip's peak power and area. A point is feasible when its peak power is
within the budget (4.2 W, the accelerator's share of a <= 25 W drive). Pareto frontiers
(:func:`pareto_front`) of the feasible points trade performance (geometric-mean throughput) against
the chip's average power and against area.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .arch import AccelConfig, KiB, MiB, preset
from .compiler import choose_tile, compile_model
from .layers import MatLayer, VecLayer
from .power import area_mm2, energy, peak_power_w
from .timing import time_model

log = logging.getLogger("gfaas.accel.dse")

__all__ = ["MEMORIES", "PAPER_POINT", "Point", "DseResult", "design_space", "explore", "fits",
           "pareto_front", "sram_sizes"]

#: Memory technologies of the search space, GB/s (seed 004 §4.2).
MEMORIES: dict[str, float] = {"ddr4": 19.2, "ddr5": 38.0, "hbm2": 460.0}
ARRAY_SIDES: tuple[int, ...] = tuple(2 ** i for i in range(2, 11))  # 4 .. 1024
MIN_SRAM, MAX_SRAM = 128 * KiB, 32 * MiB
STEPS_PER_OCTAVE = 4
#: The accelerator's share of the drive's power (seed 004 Table 2: the DSA's 4.2 W TDP).
DEFAULT_BUDGET_W = 4.2
#: The paper's chosen design: 128x128, 4 MB of scratchpad, DDR5.
PAPER_POINT = (128, 4 * MiB, "ddr5")

Layers = Sequence[MatLayer | VecLayer]


def sram_sizes(steps_per_octave: int = STEPS_PER_OCTAVE) -> list[int]:
    """Total scratchpad sizes from 128 KiB to 32 MiB, ``steps_per_octave`` per doubling, in whole KiB."""
    if isinstance(steps_per_octave, bool) or not isinstance(steps_per_octave, int) or steps_per_octave < 1:
        raise ConfigError(f"steps per octave {steps_per_octave!r} must be a positive integer (e.g. 4)")
    octaves = round(math.log2(MAX_SRAM / MIN_SRAM))
    return [round(MIN_SRAM / KiB * 2 ** (i / steps_per_octave)) * KiB for i in range(octaves * steps_per_octave + 1)]


def _with_array(base: AccelConfig, side: int, sram: int, memory: str) -> AccelConfig:
    """``base`` with a ``side x side`` array (one vector lane per column), ``sram`` bytes split 1/4
    inputs, 1/2 weights, 1/4 outputs as in the presets, and ``memory``'s bandwidth."""
    return base.with_(name=f"{side}x{side}-{sram // KiB}KiB-{memory}", rows=side, cols=side, vector_lanes=side,
                      ifmap_sram=sram // 4, filter_sram=sram // 2, ofmap_sram=sram - sram // 4 - sram // 2,
                      dram_gbps=MEMORIES[memory])


def fits(cfg: AccelConfig) -> bool:
    """Whether the compiler can place one double-buffered fold of the array in the scratchpads (its
    own check, :func:`gfaas.accel.compiler.choose_tile` on a 1x1x1 GEMM)."""
    try:
        choose_tile(1, 1, 1, 1, cfg, cfg.element_bytes)
    except ConfigError:
        return False
    return True


def _check_memories(memories: Sequence[str]) -> None:
    bad = [m for m in memories if m not in MEMORIES]
    if bad or not memories:
        raise ConfigError(f"memories {list(memories)!r}: choose from {', '.join(MEMORIES)}")


def design_space(base: AccelConfig | None = None, sides: Sequence[int] = ARRAY_SIDES,
                 memories: Sequence[str] = tuple(MEMORIES), steps_per_octave: int = STEPS_PER_OCTAVE
                 ) -> list[tuple[AccelConfig, str]]:
    """Every (config, memory name) of the space (module docstring), arrays outermost."""
    base = base or preset("dscs")
    _check_memories(memories)
    for s in sides:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ConfigError(f"array side {s!r} must be a positive integer (e.g. 128)")
    out = []
    for side in sides:
        for sram in sram_sizes(steps_per_octave):
            cfgs = [(_with_array(base, side, sram, mem), mem) for mem in memories]
            if fits(cfgs[0][0]):
                out.extend(cfgs)
    return out


@dataclass(frozen=True)
class Point:
    """One evaluated design point (module docstring)."""

    config: AccelConfig
    memory: str
    latency_s: dict[str, float]
    energy_j: dict[str, float]
    #: The chip's average power (energy without DRAM over latency), mean over the models.
    avg_power_w: float
    #: The DRAM traffic's power, mean over the models (outside the chip's budget, as in power.py).
    dram_power_w: float
    peak_power_w: float
    area_mm2: float
    geomean_ips: float
    mean_ips: float
    feasible: bool

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def perf_per_w(self) -> float:
        return self.geomean_ips / self.avg_power_w

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {"name": c.name, "rows": c.rows, "cols": c.cols, "sram_bytes": c.sram_bytes, "memory": self.memory,
                "dram_gbps": c.dram_gbps, "geomean_ips": self.geomean_ips, "mean_ips": self.mean_ips,
                "avg_power_w": self.avg_power_w, "dram_power_w": self.dram_power_w, "peak_power_w": self.peak_power_w, "area_mm2": self.area_mm2,
                "perf_per_w": self.perf_per_w, "feasible": self.feasible, "latency_s": dict(self.latency_s),
                "energy_j": dict(self.energy_j)}


def evaluate(cfg: AccelConfig, memory: str, programs: dict[str, Layers], budget_w: float) -> Point:
    """Time and cost every model's layers on ``cfg``."""
    lat: dict[str, float] = {}
    ej: dict[str, float] = {}
    chip_w, dram_w = [], []
    for name, layers in programs.items():
        t = time_model(cfg, layers)
        lat[name] = t.seconds(cfg)
        if lat[name] <= 0:
            raise ConfigError(f"model {name!r} takes no cycles on {cfg.name}: nothing to explore")
        e = energy(cfg, t)
        ej[name] = e.total_j
        chip_w.append((e.total_j - e.dynamic_j["dram"]) / lat[name])
        dram_w.append(e.dynamic_j["dram"] / lat[name])
    ips = [1.0 / s for s in lat.values()]
    peak = peak_power_w(cfg)
    return Point(cfg, memory, lat, ej, sum(chip_w) / len(chip_w), sum(dram_w) / len(dram_w), peak, area_mm2(cfg).total_mm2,
                 math.exp(sum(math.log(v) for v in ips) / len(ips)), sum(ips) / len(ips), peak <= budget_w)


def pareto_front(cost: Sequence[float], perf: Sequence[float]) -> list[int]:
    """Indices (ascending) of the points no other point dominates, lower ``cost`` and higher ``perf``
    being better. ``a`` dominates ``b`` when it is no worse in both and better in one; so identical
    points are all kept when one of them is."""
    if len(cost) != len(perf):
        raise ConfigError(f"pareto_front: {len(cost)} costs but {len(perf)} performances")
    for v in (*cost, *perf):
        if not math.isfinite(v):
            raise ConfigError(f"pareto_front: value {v!r} is not a finite number")
    order = sorted(range(len(cost)), key=lambda i: (cost[i], -perf[i]))
    front: list[int] = []
    best = -math.inf
    last: tuple[float, float] | None = None
    for i in order:
        if perf[i] > best:
            front.append(i)
            best, last = perf[i], (cost[i], perf[i])
        elif (cost[i], perf[i]) == last:
            front.append(i)
    return sorted(front)


@dataclass
class DseResult:
    points: list[Point]
    models: list[str]
    budget_w: float
    seconds: float
    paper: Point
    frontier_power: list[int] = field(default_factory=list)
    frontier_area: list[int] = field(default_factory=list)

    @property
    def feasible(self) -> list[Point]:
        return [p for p in self.points if p.feasible]

    @property
    def chosen(self) -> Point | None:
        """The best geometric-mean throughput under the budget (ties: lower power)."""
        f = self.feasible
        return max(f, key=lambda p: (p.geomean_ips, -p.avg_power_w)) if f else None

    @property
    def best_perf_per_w(self) -> Point | None:
        f = self.feasible
        return max(f, key=lambda p: p.perf_per_w) if f else None

    def paper_summary(self) -> dict[str, Any]:
        """Where the paper's point lies: its performance rank among the feasible points (1 = best),
        its performance over the chosen point's, whether it is on each frontier, and the best
        frontier performance at no more power (area) than it has."""
        p = self.paper
        chosen = self.chosen
        f = self.feasible
        pw = [self.points[i] for i in self.frontier_power]
        ar = [self.points[i] for i in self.frontier_area]
        at_power = max((q.geomean_ips for q in pw if q.avg_power_w <= p.avg_power_w), default=0.0)
        at_area = max((q.geomean_ips for q in ar if q.area_mm2 <= p.area_mm2), default=0.0)
        return {**p.to_dict(),
                "rank": 1 + sum(q.geomean_ips > p.geomean_ips for q in f) if p.feasible else None,
                "of": len(f),
                "perf_vs_chosen": p.geomean_ips / chosen.geomean_ips if chosen else None,
                "on_power_frontier": any(q.name == p.name for q in pw),
                "on_area_frontier": any(q.name == p.name for q in ar),
                "perf_vs_power_frontier": p.geomean_ips / at_power if at_power else None,
                "perf_vs_area_frontier": p.geomean_ips / at_area if at_area else None}

    def to_dict(self) -> dict[str, Any]:
        def brief(p: Point) -> dict[str, Any]:
            return {"name": p.name, "geomean_ips": p.geomean_ips, "avg_power_w": p.avg_power_w,
                    "peak_power_w": p.peak_power_w, "area_mm2": p.area_mm2}

        chosen, ppw = self.chosen, self.best_perf_per_w
        return {"points": len(self.points), "feasible_points": len(self.feasible), "models": self.models,
                "seconds": self.seconds, "budget_w": self.budget_w,
                "chosen": chosen.to_dict() if chosen else None,
                "best_perf_per_w": ppw.to_dict() if ppw else None,
                "paper_point": self.paper_summary(),
                "frontier_power": [brief(self.points[i]) for i in self.frontier_power],
                "frontier_area": [brief(self.points[i]) for i in self.frontier_area]}


def compile_models(models: Sequence[str], base: AccelConfig, scale: str = "full",
                   progress: Callable[[str], None] | None = None) -> dict[str, Layers]:
    """Each zoo model's layers at batch 1, compiled once with ``base`` (module docstring)."""
    from ..models import zoo

    out: dict[str, Layers] = {}
    for name in models:
        if name not in zoo.names():
            raise ConfigError(f"model {name!r} is not a zoo model ({', '.join(zoo.names())})")
        out[name] = compile_model(zoo.build(name, scale), base, batch=1).layers
        if progress:
            progress(f"compiled {name} ({len(out[name])} layers)")
    return out


def explore(models: Sequence[str], budget_w: float = DEFAULT_BUDGET_W, base: AccelConfig | None = None,
            sides: Sequence[int] = ARRAY_SIDES, memories: Sequence[str] = tuple(MEMORIES),
            steps_per_octave: int = STEPS_PER_OCTAVE, scale: str = "full",
            progress: Callable[[str], None] | None = None,
            programs: dict[str, Layers] | None = None) -> DseResult:
    """Compile ``models`` (unless ``programs`` gives their layers), evaluate the whole space, and
    find the frontiers. ``progress`` receives a line now and then (the CLI prints them)."""
    if isinstance(budget_w, bool) or not isinstance(budget_w, (int, float)) or not math.isfinite(budget_w) \
            or budget_w <= 0:
        raise ConfigError(f"budget {budget_w!r} W must be a number > 0 (the drive gives the accelerator 4.2 W)")
    if not models:
        raise ConfigError("no models to explore: name at least one zoo model")
    base = base or preset("dscs")
    t0 = time.perf_counter()
    space = design_space(base, sides, memories, steps_per_octave)
    if not space:
        raise ConfigError(f"no design point fits: arrays {list(sides)} need more than {MAX_SRAM // MiB} MiB")
    if programs is None:
        programs = compile_models(models, base, scale, progress)
    else:
        programs = {m: programs[m] for m in models}
    points = []
    for i, (cfg, mem) in enumerate(space):
        if cfg.element_bytes != base.element_bytes:  # pragma: no cover - the space keeps base's precision
            raise ConfigError("the layer shapes were compiled for another precision")
        points.append(evaluate(cfg, mem, programs, budget_w))
        if progress and (i + 1) % 100 == 0:
            progress(f"evaluated {i + 1}/{len(space)} points")
    side, sram, mem = PAPER_POINT
    paper = next((p for p in points if (p.config.rows, p.config.sram_bytes, p.memory) == (side, sram, mem)), None)
    if paper is None:  # not in a restricted space: evaluated on its own, for the comparison only
        paper = evaluate(_with_array(base, side, sram, mem), mem, programs, budget_w)
    feas = [i for i, p in enumerate(points) if p.feasible]
    fp = pareto_front([points[i].avg_power_w for i in feas], [points[i].geomean_ips for i in feas])
    fa = pareto_front([points[i].area_mm2 for i in feas], [points[i].geomean_ips for i in feas])
    res = DseResult(points, list(models), float(budget_w), 0.0, paper,
                    sorted((feas[j] for j in fp), key=lambda i: points[i].avg_power_w),
                    sorted((feas[j] for j in fa), key=lambda i: points[i].area_mm2))
    res.seconds = time.perf_counter() - t0
    log.info("DSE: %d points x %d models in %.1f s", len(points), len(models), res.seconds)
    return res


ROW_FIELDS = ("name", "rows", "cols", "sram_bytes", "memory", "dram_gbps", "geomean_ips", "mean_ips", "avg_power_w",
              "dram_power_w", "peak_power_w", "area_mm2", "perf_per_w", "feasible")


def write_rows(res: DseResult, path: str) -> None:
    """One CSV row per point: the fields of :data:`ROW_FIELDS`, frontier membership, then
    ``latency_s:MODEL`` and ``energy_j:MODEL`` per model."""
    import csv

    on_p, on_a = set(res.frontier_power), set(res.frontier_area)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*ROW_FIELDS, "on_power_frontier", "on_area_frontier", *(f"latency_s:{m}" for m in res.models),
                    *(f"energy_j:{m}" for m in res.models)])
        for i, p in enumerate(res.points):
            d = p.to_dict()
            w.writerow([*(d[k] for k in ROW_FIELDS), i in on_p, i in on_a, *(p.latency_s[m] for m in res.models),
                        *(p.energy_j[m] for m in res.models)])


def plot(res: DseResult, path: str) -> None:
    """Power-performance and area-performance scatter with both frontiers, the chosen point and the
    paper's (a PNG; matplotlib's Agg backend)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - matplotlib is a project dependency
        from ..errors import DependencyMissing

        raise DependencyMissing("the DSE figure needs matplotlib: pip install 'gfaas[plot]'") from exc
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = {"ddr4": "tab:blue", "ddr5": "tab:orange", "hbm2": "tab:green"}
    chosen = res.chosen
    for ax, attr, front, label in ((axes[0], "avg_power_w", res.frontier_power, "chip average power (W)"),
                                   (axes[1], "area_mm2", res.frontier_area, "area (mm$^2$)")):
        for mem, col in colours.items():
            ok = [p for p in res.points if p.memory == mem and p.feasible]
            ax.scatter([getattr(p, attr) for p in ok], [p.geomean_ips for p in ok], s=8, c=col, label=mem)
        bad = [p for p in res.points if not p.feasible]
        ax.scatter([getattr(p, attr) for p in bad], [p.geomean_ips for p in bad], s=8, c="0.75", marker="x",
                   label=f"peak > {res.budget_w:g} W")
        fr = [res.points[i] for i in front]
        ax.plot([getattr(p, attr) for p in fr], [p.geomean_ips for p in fr], "k-", lw=1, drawstyle="steps-post",
                label="frontier")
        ax.scatter([getattr(res.paper, attr)], [res.paper.geomean_ips], s=120, marker="*", c="red",
                   label="paper: 128x128, 4 MB, DDR5", zorder=5)
        if chosen:
            ax.scatter([getattr(chosen, attr)], [chosen.geomean_ips], s=80, facecolors="none", edgecolors="k",
                       label=f"chosen: {chosen.name}", zorder=5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("geomean throughput (inferences/s)")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"DSE: {len(res.points)} points x {len(res.models)} models, batch 1", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
