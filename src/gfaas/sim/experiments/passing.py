"""Data-passing latency between two functions (seed 001 Fig. 13 and Fig. 20a).

The latency of one object is measured from the moment the producer starts its put to the moment
the consumer holds the data, as the paper defines it: under ``gpu-local`` that is an allocation
plus one transfer; under ``gpu-random`` a copy to a random GPU and a copy from it; under ``host``
a copy down to host memory and one back up. The machine is otherwise idle. Every case is averaged
over a fixed set of GPU pairs so that all systems see the same placements.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from ...topology import Topology, preset
from ..cluster import Cluster
from ..systems import SystemConfig, system
from .base import Comparison, Progress, Result, mean, reduction, register

MB = 10**6
BASELINES = ("infless+", "nvshmem+", "deepplan+")


def passing_seconds(topo: Topology, cfg: SystemConfig, src: str, dst: str, nbytes: int, seed: int = 0) -> float:
    """One object from device ``src`` (a GPU, or a host for host-to-gFn) to GPU ``dst``."""
    return passing_parts(topo, cfg, src, dst, nbytes, seed)["total_s"]


def passing_parts(topo: Topology, cfg: SystemConfig, src: str, dst: str, nbytes: int,
                  seed: int = 0) -> dict[str, float]:
    """:func:`passing_seconds` split in two, to show where a system's time goes: ``put_s`` until the
    data sits in the system's store (an allocation, or a copy to the store's device), ``get_s`` from
    there until the consumer holds it; ``copies`` is how many copies crossed a link (0, 1 or 2) and
    ``host_copies`` how many of them went to or from host memory."""
    c = Cluster(topo, cfg, seed=seed)
    out = {"total_s": -1.0, "put_s": 0.0, "get_s": 0.0, "copies": 0.0, "host_copies": 0.0}
    src_kind = topo.device(src).kind

    def copied(a: str, b: str) -> None:
        if a != b:
            out["copies"] += 1
            out["host_copies"] += topo.device(a).kind == "host" or topo.device(b).kind == "host"

    def get(where: str) -> None:
        out["put_s"] = c.sim.now
        copied(where, dst)
        c.plane.move(where, dst, nbytes, lambda: out.__setitem__("total_s", c.sim.now))

    def put() -> None:
        if src_kind == "host":
            # Data a CPU function produced: a GPU store first pulls it onto its (random) GPU.
            where = src if cfg.store in ("host", "gpu-local") else c.store_device(dst)
        else:
            where = c.store_device(src)
        if where == src:
            c.sim.schedule(c.alloc_s() if src_kind == "gpu" else 0.0, get, where)
        else:
            copied(src, where)
            c.plane.move(src, where, nbytes, lambda: get(where))

    c.sim.schedule(0.0, put)
    c.sim.run()
    out["get_s"] = out["total_s"] - out["put_s"]
    return out


def _pairs(topo: Topology, kind: str) -> list[tuple[str, str]]:
    if kind == "host":
        return [(topo.host_of(topo.device(g).node), g) for g in topo.of_kind("gpu", 0)]
    if kind == "inter":
        a, b = topo.of_kind("gpu", 0), topo.of_kind("gpu", 1)
        return list(zip(a, b, strict=False)) + list(zip(a, reversed(b), strict=False))
    gpus = topo.of_kind("gpu", 0)
    return list(itertools.permutations(gpus, 2))


def _sweep(cases: list[tuple[str, Topology, str]], systems: list[str], sizes: list[int], seeds: int,
           progress: Progress) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    total = len(cases) * len(systems) * len(sizes)
    k = 0
    for label, topo, kind in cases:
        pairs = _pairs(topo, kind)
        for name in systems:
            cfg = system(name)
            for size in sizes:
                parts = [passing_parts(topo, cfg, s, d, size, seed) for s, d in pairs for seed in range(seeds)]
                rows.append({"case": label, "system": name, "size_mb": size // MB,
                             "latency_ms": mean([p["total_s"] for p in parts]) * 1e3,
                             "put_ms": mean([p["put_s"] for p in parts]) * 1e3,
                             "get_ms": mean([p["get_s"] for p in parts]) * 1e3,
                             "copies": mean([p["copies"] for p in parts]),
                             "host_copies": mean([p["host_copies"] for p in parts])})
                k += 1
                progress(k, total, f"{label} {name} {size // MB} MB")
    return rows


def infless_pinned() -> SystemConfig:
    """INFless+ with its host legs through a pre-pinned staging ring instead of pageable memory: a
    second reading of the baseline (seed 001 does not say which INFless+ it measured)."""
    return replace(system("infless+"), name="infless+pinned", pinned="ring")


def _pinned_reading(rows: list[dict[str, object]], case: str, topo: Topology, kind: str,
                    sizes: list[int]) -> float:
    """gfaas's reduction (averaged over sizes, as the comparisons are) against :func:`infless_pinned`
    on the same pairs: printed in the notes to show how much of a miss against INFless+ is the
    reading of its host legs. (No random placement in either system: one seed.)"""
    pairs = _pairs(topo, kind)
    cfg = infless_pinned()
    theirs = {s // MB: mean([passing_seconds(topo, cfg, a, b, s) for a, b in pairs]) * 1e3 for s in sizes}
    ours = _latencies(rows, case, "gfaas")
    return mean([reduction(ours[k], theirs[k]) for k in ours])


def _latencies(rows: list[dict[str, object]], case: str, system_name: str) -> dict[int, float]:
    """Mean latency (ms) by size (MB) of one system's rows of one case."""
    return {int(r["size_mb"]): float(r["latency_ms"])  # type: ignore[call-overload, arg-type]
            for r in rows if r["case"] == case and r["system"] == system_name}


def _reductions(rows: list[dict[str, object]], case: str, base: str) -> float:
    ours, theirs = _latencies(rows, case, "gfaas"), _latencies(rows, case, base)
    return mean([reduction(ours[s], theirs[s]) for s in ours])


@register("passing-latency", "Data-passing latency vs size: gFn-gFn, host-gFn, inter-node (GROUTER Fig. 13)",
          "GROUTER §6.1, Fig. 13")
def passing_latency(quick: bool, progress: Progress) -> Result:
    sizes = [4 * MB, 64 * MB] if quick else [1 * MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB]
    v100 = preset("dgx-v100")
    cases = [("gFn-gFn intra-node", v100, "gpu"), ("host-gFn", v100, "host"),
             ("gFn-gFn inter-node", preset("dgx-v100*2"), "inter")]
    systems = ["gfaas", *BASELINES]
    rows = _sweep(cases, systems, sizes, 1 if quick else 3, progress)
    paper = {"gFn-gFn intra-node": (95, 75, 75), "host-gFn": (63, 63, 75), "gFn-gFn inter-node": (91, 87, 87)}
    comps = [Comparison(f"{case}: reduction vs {b}", p, _reductions(rows, case, b))
             for case, ps in paper.items() for b, p in zip(BASELINES, ps, strict=True)]
    pinned = "; ".join(f"{case} {_pinned_reading(rows, case, topo, kind, sizes):.1f}% (paper {paper[case][0]}%)"
                       for case, topo, kind in cases)
    return Result("passing-latency", "Data-passing latency between two functions on dgx-v100", rows, comps,
                  {"x": "size_mb", "y": "latency_ms", "series": "system", "panel": "case", "logx": True, "logy": True},
                  "Reductions are averaged over sizes; each point averages every ordered GPU pair (intra-node), "
                  "every GPU (host-gFn) or 16 cross-node pairs, with 3 seeds for the random store placement. "
                  "put_ms: until the data sits in the system's store; get_ms: from there to the consumer; copies: "
                  "copies over a link (host_copies: to or from host memory). INFless+ moves through pageable host "
                  f"memory; through a pinned staging ring instead, gfaas's reduction would be: {pinned}.")


@register("a10", "Data passing without NVLink on 4xA10 (GROUTER Fig. 20a)", "GROUTER §6.5, Fig. 20a")
def a10(quick: bool, progress: Progress) -> Result:
    sizes = [4 * MB, 64 * MB] if quick else [1 * MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB]
    topo = preset("4xa10")
    rows = _sweep([("gFn-gFn 4xA10", topo, "gpu")], ["gfaas", *BASELINES], sizes, 1 if quick else 3, progress)
    comps = [Comparison(f"reduction vs {b}", 51, _reductions(rows, "gFn-gFn 4xA10", b)) for b in BASELINES]
    pinned = _pinned_reading(rows, "gFn-gFn 4xA10", topo, "gpu", sizes)
    return Result("a10", "gFn-gFn data passing on a 4xA10 server without NVLink", rows, comps,
                  {"x": "size_mb", "y": "latency_ms", "series": "system", "logx": True, "logy": True},
                  "Reductions are averaged over sizes, over every ordered GPU pair, with 3 seeds for the random store "
                  "placement. copies: copies over a link (host_copies: to or from host memory). INFless+ moves "
                  f"through pageable host memory (3 GB/s); through a pinned staging ring instead, gfaas's reduction "
                  f"would be {pinned:.1f}% (paper 51%): its two host legs then run at the PCIe rate, faster than "
                  "the peer copy rate assumed here (half of it; the paper states neither).")

