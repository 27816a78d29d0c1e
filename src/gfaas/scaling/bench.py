"""``gfaas bench scale`` / ``gfaas scale demo``: one testbed run measuring real multicast and
serving during scale-out against the baselines (see docs/scaling.md, "Real scaling on one machine").

One run, on one :class:`~gfaas.scaling.netns.Testbed`:

1. multicast of the model's blocks from one source to all nodes, binomial pipeline and binary tree,
   each against its schedule's bound (:func:`~gfaas.scaling.manager.step_bound_seconds`), then the
   binomial pipeline with k-way transmission from the ``sources`` loaded nodes;
2. the same burst of requests (cut from the Azure LLM trace) served during a scale-out from
   ``sources`` loaded nodes by each system: ``gfaas`` (binomial multicast, execution pipelines,
   local execution), ``tree`` (tree multicast, then serve) and ``load-then-serve`` (each new node
   loads the whole model from a source, one after another, then serves);
3. the warm tier: every destination restores the model from its host-memory cache; then the same
   burst served during a warm scale-out (the destinations copy the model from their caches at
   ``warm_rate_mbit``, the emulated host-to-device link): ``gfaas`` lets them join execution
   pipelines while they load, ``warm-then-serve`` serves from a node once it holds the whole model;
4. every system's tokens against a one-process run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..policy.multicast import plan
from . import SCALE_CONFIG
from .manager import Manager
from .netns import Testbed
from .reference import reference_tokens
from .serving import SYSTEMS, Server, ServeResult
from .workload import Request, burst, percentile

log = logging.getLogger("gfaas.scaling")


@dataclass(frozen=True)
class ScaleBench:
    """Settings of one run. ``rate_mbit``: each node's send and receive port; ``floor_s``: the
    emulated accelerator's time for one pass over the whole model (a stage of ``s`` of ``B`` blocks
    takes ``floor_s * s / B``; the CPU does the real math meanwhile); ``span_s``: the burst's
    ``requests`` arrive within this many seconds of the scale-out's start; ``warm_rate_mbit``: a
    node's emulated host-to-device rate in a warm start (4x the link rate by default, as a PCIe 4
    x16 link is to a 50 Gb/s NIC)."""

    nodes: int = 8
    blocks: int = 8
    rate_mbit: float = 40.0
    sources: int = 2
    requests: int = 40
    span_s: float = 2.0
    floor_s: float = 0.05
    local_capacity: int = 2
    trace: str | None = None
    trace_start: int = 0
    seed: int = 0
    warm_rate_mbit: float = 160.0

    def __post_init__(self) -> None:
        if not 2 <= self.nodes <= 64:
            raise ConfigError(f"nodes={self.nodes}: the testbed runs 2..64 node processes")
        if not 1 <= self.sources < self.nodes:
            raise ConfigError(f"sources={self.sources}: pass 1 <= sources < nodes ({self.nodes})")


def _requests(b: ScaleBench) -> list[Request]:
    from ..sim.arrivals import load_azure_llm_trace
    from ..sim.bundled import trace_path

    trace = load_azure_llm_trace(b.trace or trace_path("azure-llm-code"))
    return burst(trace, b.requests, b.span_s, SCALE_CONFIG.vocab, start=b.trace_start, seed=b.seed)


def run_bench(b: ScaleBench, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run everything once; the JSON-ready result (see the module docstring)."""
    reqs = _requests(b)
    served: list[ServeResult] = []
    multicast: list[dict[str, Any]] = []
    progress(f"testbed: {b.nodes} namespaces, {b.rate_mbit:g} Mbit/s per port; model {b.blocks} blocks")
    with Testbed(b.nodes, b.rate_mbit) as bed, Manager(bed, SCALE_CONFIG, b.blocks, sources=b.sources,
                                                       seed=b.seed, floor_s=b.floor_s) as mgr:
        progress(f"model: {sum(mgr.sizes) / 1e6:.1f} MB in {b.blocks} blocks of "
                 f"{min(mgr.sizes) / 1e6:.1f}-{max(mgr.sizes) / 1e6:.1f} MB")
        # One source first (the targets compare these two), then k-way transmission from the serving sources.
        runs = [("binomial", 1), ("tree", 1)] + ([("binomial", b.sources)] if b.sources > 1 else [])
        for scheme, k in runs:
            progress(f"multicast {scheme} from {k} source(s) to {b.nodes} nodes ...")
            sched = plan(b.nodes, b.blocks, k, scheme)
            res = mgr.multicast(sched)
            multicast.append({"scheme": scheme, "nodes": b.nodes, "blocks": b.blocks, "sources": k,
                              "seconds": res.seconds, "bound_seconds": res.bound_seconds,
                              "ratio_to_bound": res.seconds / res.bound_seconds, "steps": sched.num_steps,
                              "node_cpu_seconds": res.cpu_s,
                              "node_cpu_share_of_host": res.cpu_s / (res.seconds * (os.cpu_count() or 1))})
            progress(f"  {res.seconds:.2f} s (bound {res.bound_seconds:.2f} s, x{res.seconds / res.bound_seconds:.3f});"
                     f" node CPU {res.cpu_s:.2f} s")
        for system, scheme in SYSTEMS.items():
            progress(f"serve {len(reqs)} requests during a {scheme} scale-out ({system}) ...")
            out = Server(mgr, system, reqs, b.local_capacity).run(plan(b.nodes, b.blocks, b.sources, scheme))
            served.append(out)
            tt = list(out.ttft_s.values())
            progress(f"  TTFT p50 {percentile(tt, 50):.2f} s, p90 {percentile(tt, 90):.2f} s; "
                     f"all nodes loaded after {out.multicast_s:.2f} s")
        progress("warm start: every destination restores the model from its host-memory cache ...")
        warm_s, hits = mgr.warm_start(range(b.sources, b.nodes))
        progress(f"  {warm_s:.3f} s, {sum(hits.values())} of {len(hits)} hits")
        warm_served: list[tuple[str, ServeResult]] = []
        for system, label in (("gfaas", "gfaas"), ("load-then-serve", "warm-then-serve")):
            progress(f"serve {len(reqs)} requests during a warm scale-out at {b.warm_rate_mbit:g} Mbit/s ({label}) ...")
            out = Server(mgr, system, reqs, b.local_capacity).run_warm(
                range(b.sources, b.nodes), b.sources, b.warm_rate_mbit * 1e6 / 8)
            warm_served.append((label, out))
            tt = list(out.ttft_s.values())
            progress(f"  TTFT p50 {percentile(tt, 50):.2f} s, p90 {percentile(tt, 90):.2f} s; "
                     f"all nodes loaded after {out.multicast_s:.2f} s")
    progress("one-process reference run ...")
    ref = reference_tokens(SCALE_CONFIG, b.seed, reqs)
    identical = all(s.tokens == ref for s in served) and all(s.tokens == ref for _, s in warm_served)
    speedup = multicast[1]["seconds"] / multicast[0]["seconds"]
    ttft = [{"system": s.system, "p50_s": percentile(list(s.ttft_s.values()), 50),
             "p90_s": percentile(list(s.ttft_s.values()), 90), "requests": len(s.ttft_s),
             "all_loaded_s": s.multicast_s, "migrations": s.migrations,
             "hidden_hops": s.hidden_hops, "tokens_identical": s.tokens == ref} for s in served]
    p90 = {s.system: percentile(list(s.ttft_s.values()), 90) for s in served}
    warm_p90 = [percentile(list(s.ttft_s.values()), 90) for _, s in warm_served]
    warm_ttft = [{"system": label, "p50_s": percentile(list(s.ttft_s.values()), 50),
                  "p90_s": percentile(list(s.ttft_s.values()), 90), "requests": len(s.ttft_s),
                  "all_loaded_s": s.multicast_s, "migrations": s.migrations, "hidden_hops": s.hidden_hops,
                  "pipelines": sum(1 for _, kind, _ in s.instances if kind == "pipeline"),
                  "tokens_identical": s.tokens == ref} for label, s in warm_served]
    return {
        "settings": asdict(b),
        "model": {**asdict(SCALE_CONFIG), "bytes": sum(mgr.sizes)},
        "multicast": multicast,
        "binomial_speedup_vs_tree": speedup,
        "ttft": ttft,
        "ttft_p90_gain_vs_load_then_serve": p90["load-then-serve"] / p90["gfaas"],
        "outputs_identical": identical,
        "warm_ttft": warm_ttft,
        "warm_ttft_p90_gain_vs_warm_then_serve": warm_p90[1] / warm_p90[0],
        "tiers": {"hot_s": 0.0, "warm_s": warm_s, "warm_hits": sum(hits.values()), "warm_nodes": len(hits),
                  "cold_binomial_s": served[0].multicast_s},
        "ramp": {s.system: s.token_times for s in served},
        "warm_ramp": {label: s.token_times for label, s in warm_served},
        "instances": {s.system: s.instances for s in served},
        "warm_instances": {label: s.instances for label, s in warm_served},
    }


def plot_ramp(result: dict[str, Any], path: str | Path, bin_s: float = 0.5) -> None:
    """Tokens per second over time during the scale-out, one line per system (needs the ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        from ..errors import DependencyMissing

        raise DependencyMissing("the throughput figure needs matplotlib: pip install 'gfaas[plot]'") from exc
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for system, times in result["ramp"].items():
        if not times:
            continue
        n = int(max(times) / bin_s) + 1
        counts = [0] * n
        for t in times:
            counts[int(t / bin_s)] += 1
        ax.step([i * bin_s for i in range(n)], [c / bin_s for c in counts], where="post", label=system)
    ax.set_xlabel("seconds since the scale-out started")
    ax.set_ylabel("tokens / s")
    s = result["settings"]
    ax.set_title(f"Throughput during scale-out: {s['nodes']} nodes, {s['rate_mbit']:g} Mbit/s, "
                 f"{s['requests']} requests")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
