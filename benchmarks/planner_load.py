"""The planner under load: simulator experiments with one RoutingOptions override per planner, in one run.

Every system of ``gfaas.sim.systems.SYSTEMS`` gets the planner's switches (``max_flow``,
``min_cost``, ``load_paths``) on top of its own routing options, the experiment runs, and the
systems are restored. Planners compared (issue 12 follow-up):

* ``greedy``: ``max_flow=False``, the enumerated short routes taken greedily (before issue 12);
* ``maxflow``: Edmonds-Karp max-flow paths whatever the load (``min_cost=False, load_paths="all"``),
  the planner of issue 12;
* ``mincost-all``: min-cost max-flow paths whatever the load;
* ``greedy-load``: min-cost max-flow when idle, the greedy planner's routes under load;
* ``short``: min-cost max-flow when idle, the greedy routes of at most 2 GPU hops under load (the
  default).

Prints the gfaas rows of each experiment as one line per planner::

    .venv/bin/python benchmarks/planner_load.py [--quick] [--planners greedy,maxflow,short]
        [--experiments throughput,storage-passing,passing-latency] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

from gfaas.sim import systems
from gfaas.sim.experiments.base import run_experiment

PLANNERS: dict[str, dict[str, Any]] = {
    "greedy": {"max_flow": False},
    "maxflow": {"max_flow": True, "min_cost": False, "load_paths": "all"},
    "mincost-all": {"max_flow": True, "min_cost": True, "load_paths": "all"},
    "greedy-load": {"max_flow": True, "min_cost": True, "load_paths": "greedy"},
    "short": {"max_flow": True, "min_cost": True, "load_paths": "short"},
}


def key_numbers(name: str, rows: list[dict[str, Any]]) -> dict[str, float]:
    """The gfaas numbers of one experiment, by a short label."""
    out: dict[str, float] = {}
    for r in rows:
        if name == "throughput" and r["system"] == "gfaas":
            out[f"{r['case']}/{r['workflow']} req/s"] = r["requests_per_s"]
        elif name == "storage-passing" and r["system"] in ("gfaas", "LRU"):
            out[f"{r['system']}@{r['storage_pct']:g}% mean ms"] = r["mean_ms"]
            out[f"{r['system']}@{r['storage_pct']:g}% p99 ms"] = r["p99_ms"]
        elif name == "passing-latency" and r["system"] == "gfaas":
            out[f"{r['case']}/{r['size_mb']}MB ms"] = r["latency_ms"]
    return out


def run(planner: str, experiment: str, quick: bool) -> dict[str, float]:
    saved = dict(systems.SYSTEMS)
    try:
        for k, cfg in saved.items():
            systems.SYSTEMS[k] = replace(cfg, routing=replace(cfg.routing, **PLANNERS[planner]))
        res = run_experiment(experiment, quick)
    finally:
        systems.SYSTEMS.clear()
        systems.SYSTEMS.update(saved)
    return key_numbers(experiment, res.rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--planners", default=",".join(PLANNERS))
    ap.add_argument("--experiments", default="throughput,storage-passing,passing-latency")
    ap.add_argument("--json", default=None, help="also write every number here")
    a = ap.parse_args()
    planners = a.planners.split(",")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for exp in a.experiments.split(","):
        out[exp] = {}
        for p in planners:
            t0 = time.perf_counter()
            out[exp][p] = run(p, exp, a.quick)
            print(f"# {exp} {p}: {time.perf_counter() - t0:.1f} s", flush=True)
        labels = list(next(iter(out[exp].values())))
        print(f"{exp}{' (quick)' if a.quick else ''}")
        print(f"  {'':34s}" + "".join(f"{p:>13s}" for p in planners))
        for lab in labels:
            print(f"  {lab:34s}" + "".join(f"{out[exp][p].get(lab, float('nan')):13.4g}" for p in planners))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
