"""The generated "Measured" table of docs/scaling.md, from a ``gfaas bench scale --out`` result.

    .venv/bin/python benchmarks/scale_tables.py benchmarks/results/scale-netns.json                        # print
    .venv/bin/python benchmarks/scale_tables.py benchmarks/results/scale-netns.json --write docs/scaling.md

``--write`` replaces the block between ``<!-- scale-netns -->`` and ``<!-- /scale-netns -->``, so the
numbers on the page are those of the committed result file (``make scale-results`` runs both, as root).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from doc_blocks import write_blocks

TARGET_BOUND, TARGET_TREE, TARGET_P90 = 1.15, 1.5, 2.0


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def table(doc: dict[str, Any]) -> str:
    """The run's setup, one row per measured number, each with its target and whether it is met."""
    s, prov = doc["settings"], doc.get("provenance", {})
    m = prov.get("machine") or {}
    mc = {(r["scheme"], r["sources"]): r for r in doc["multicast"]}
    bino, tree = mc[("binomial", 1)], mc[("tree", 1)]
    k = max((src for scheme, src in mc if scheme == "binomial"), default=1)
    bino_k = mc[("binomial", k)]
    tt = {r["system"]: r for r in doc["ttft"]}
    g, tr, lts = tt["gfaas"], tt["tree"], tt["load-then-serve"]
    systems = (g, tr, lts)
    ratio = bino["seconds"] / bino["bound_seconds"]
    speedup, gain = doc["binomial_speedup_vs_tree"], doc["ttft_p90_gain_vs_load_then_serve"]
    tiers = doc["tiers"]
    n = s["nodes"]
    lines = [
        f"Run of commit `{str(prov.get('commit'))[:10]}` ({prov.get('utc', '?')}; tree clean: "
        f"{prov.get('dirty') is False}): N = {n}, B = {s['blocks']}, {s['rate_mbit']:g} Mbit/s per port, "
        f"{s['requests']} requests within {s['span_s']:g} s from "
        f"{'the bundled Azure code trace' if not s.get('trace') else s['trace']}, {s['sources']} loaded sources "
        f"for serving, `floor_s` {s['floor_s']:g}; {m.get('cpu_model', '?')}, {m.get('cores_usable', '?')} "
        f"cores usable, load average {m.get('loadavg', '?')} at the end. Every number is from this one run.",
        "",
        "| | measured | target | met |",
        "|---|---:|---|---|",
        f"| binomial multicast, 1 source to {n} nodes ({bino['steps']} steps) | {bino['seconds']:.2f} s | | |",
        f"| its schedule bound | {bino['bound_seconds']:.2f} s | | |",
        f"| measured / bound | {ratio:.3f} | <= {TARGET_BOUND} | {_yes(ratio <= TARGET_BOUND)} |",
        f"| tree multicast ({tree['steps']} steps; bound {tree['bound_seconds']:.2f} s) | {tree['seconds']:.2f} s | | |",
        f"| tree / binomial | {speedup:.2f}x | >= {TARGET_TREE}x | {_yes(speedup >= TARGET_TREE)} |",
        f"| binomial, k = {k} sources (bound {bino_k['bound_seconds']:.2f} s) | {bino_k['seconds']:.2f} s | | |",
        f"| node CPU during the binomial run (share of the host) | {bino['node_cpu_seconds']:.2f} s "
        f"({100 * bino['node_cpu_share_of_host']:.0f}%) | | |",
        "| TTFT P90 gfaas / tree / load-then-serve | " + " / ".join(f"{r['p90_s']:.2f}" for r in systems) + " s | | |",
        f"| TTFT P90 gain over load-then-serve | {gain:.2f}x | >= {TARGET_P90:g}x | {_yes(gain >= TARGET_P90)} |",
        "| TTFT P50 gfaas / tree / load-then-serve | " + " / ".join(f"{r['p50_s']:.2f}" for r in systems) + " s | | |",
        f"| all {n} nodes loaded (gfaas / tree / load-then-serve, {s['sources']} sources) | "
        + " / ".join(f"{r['all_loaded_s']:.2f}" for r in systems) + " s | | |",
        f"| passes whose hidden states crossed a link between stages (gfaas) | {g.get('hidden_hops', '?')} | | |",
        f"| requests moved from a pipeline to a local node (KV carried) | {g['migrations']} | | |",
        f"| warm start of the {tiers['warm_nodes']} destinations (host-memory cache, {tiers['warm_hits']} hits) | "
        f"{tiers['warm_s']:.3f} s | | |",
    ]
    if "warm_ttft" in doc:  # results made before the warm scale-out existed lack these rows
        wt = {r["system"]: r for r in doc["warm_ttft"]}
        wg, ww = wt["gfaas"], wt["warm-then-serve"]
        lines += [
            f"| warm scale-out at {s.get('warm_rate_mbit', 0):g} Mbit/s host-to-device: TTFT P90 gfaas / "
            f"warm-then-serve | {wg['p90_s']:.2f} / {ww['p90_s']:.2f} s | | |",
            f"| its P90 gain (pipelines of partly loaded warm nodes) | "
            f"{doc['warm_ttft_p90_gain_vs_warm_then_serve']:.2f}x | | |",
            f"| warm: TTFT P50 gfaas / warm-then-serve | {wg['p50_s']:.2f} / {ww['p50_s']:.2f} s | | |",
            f"| warm: all destinations loaded (gfaas / warm-then-serve) | {wg['all_loaded_s']:.2f} / "
            f"{ww['all_loaded_s']:.2f} s | | |",
            f"| warm: pipelines formed while loading, passes over a link, requests moved | {wg['pipelines']}, "
            f"{wg['hidden_hops']}, {wg['migrations']} | | |",
        ]
    lines += [
        f"| tokens of every system equal to the one-process run | {'yes' if doc['outputs_identical'] else 'no'} | "
        f"identical | {_yes(bool(doc['outputs_identical']))} |",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("--write", metavar="PAGE", help="replace the <!-- scale-netns --> block of this Markdown page")
    a = ap.parse_args()
    with open(a.result) as f:
        doc = json.load(f)
    if a.write:
        write_blocks(a.write, {"scale-netns": table(doc)})
    else:
        print(table(doc))
