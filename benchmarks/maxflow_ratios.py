"""Idle plan total / maximum flow, per preset, over every same-node pair of endpoints (issue 12).

The maximum flow is the brute-force minimum cut over the links a route of that kind may use
(GPU pair: NVLink; host to GPU: PCIe host -> switch -> GPU, then NVLink; GPU to host: the mirror
image), independent of the planner's own max-flow code. Pairs with no such route (GPU pairs
without NVLink: PCIe peer-to-peer) are left out. Prints one line per preset and planner:

    .venv/bin/python benchmarks/maxflow_ratios.py
"""

from __future__ import annotations

import itertools

from gfaas.policy import Router, RoutingOptions
from gfaas.topology import Topology, preset


def allowed(t: Topology, src: str, dst: str) -> dict[tuple[str, str], float]:
    kind = {d.name: d.kind for d in t.devices}
    out = {}
    for e in t.edges():
        a, b = kind[e.src], kind[e.dst]
        ok = (e.kind == "nvlink" or (kind[src] == "host" and (a, b) in (("host", "pcie"), ("pcie", "gpu")))
              or (kind[dst] == "host" and (a, b) in (("gpu", "pcie"), ("pcie", "host"))))
        if ok:
            out[(e.src, e.dst)] = e.gbps
    return out


def min_cut(edges: dict[tuple[str, str], float], src: str, dst: str) -> float:
    others = sorted({v for e in edges for v in e} - {src, dst})
    best = float("inf")
    for k in range(len(others) + 1):
        for extra in itertools.combinations(others, k):
            side = {src, *extra}
            best = min(best, sum(c for (a, b), c in edges.items() if a in side and b not in side))
    return 0.0 if best == float("inf") else best


def main() -> None:
    for label, opts in (("max-flow", RoutingOptions()), ("greedy (max_flow=False)", RoutingOptions(max_flow=False))):
        for name in ("dgx-v100", "dgx-a100", "4xa10", "h100-x1"):
            t = preset(name)
            ends = t.gpus + ["host"]
            ratios = []
            for s, d in itertools.permutations(ends, 2):
                cut = min_cut(allowed(t, s, d), s, d)
                if cut > 0:
                    ratios.append(Router(t, opts).plan("x", s, d).total_gbps / cut)
            print(f"{label:24} {name:9} pairs {len(ratios):3}  min {min(ratios):.3f}  mean {sum(ratios) / len(ratios):.3f}")


if __name__ == "__main__":
    main()
