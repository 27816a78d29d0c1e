"""The generated parts of docs/results/README.md, from ``gfaas sim run all --save`` output.

    .venv/bin/python benchmarks/sim_tables.py benchmarks/results/sim-experiments.json                # print
    .venv/bin/python benchmarks/sim_tables.py benchmarks/results/sim-experiments.json --write docs/results/README.md

``--write`` replaces the blocks between ``<!-- sim-summary -->`` / ``<!-- /sim-summary -->`` (counts
of headline comparisons within their tolerance and in the paper's direction, per experiment) and
``<!-- sim-tables -->`` / ``<!-- /sim-tables -->`` (every experiment's table), so the numbers on
the page are always those of the committed result file.

The cluster-scale experiment is run and saved on its own (``make cluster-day``); given its file,
``--write docs/results/cluster-day.md`` replaces that page's ``<!-- cluster-day -->`` block (the
run's setup, headline numbers, wall time and table) instead.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from doc_blocks import write_blocks

from gfaas.sim.experiments.base import Comparison, Result


def _results(doc: dict[str, Any]) -> list[Result]:
    out = []
    for e in doc["experiments"]:
        comps = [Comparison(c["metric"], c["paper"], c["ours"], c["unit"], c["tolerance"]["relative"],
                            c["tolerance"]["absolute"], c.get("bound", "")) for c in e["paper"]]
        out.append(Result(e["experiment"], e["title"], e["rows"], comps, notes=e.get("notes", "")))
    return out


def summary(doc: dict[str, Any]) -> str:
    res = _results(doc)
    prov = doc.get("provenance", {})
    lines = [f"Run of commit `{str(prov.get('commit'))[:10]}` ({prov.get('utc', '?')}); every comparison is judged "
             "by its own tolerance, relative to the paper's value unless the table says otherwise.", "",
             "| experiment | headline numbers | within tolerance | in the paper's direction |", "|---|---:|---:|---:|"]
    tot = [0, 0, 0]
    for r in res:
        n, w, d = len(r.paper), sum(c.within for c in r.paper), sum(c.same_direction for c in r.paper)
        tot = [tot[0] + n, tot[1] + w, tot[2] + d]
        lines.append(f"| `{r.experiment}` | {n} | {w} | {d} |")
    lines.append(f"| **all** | **{tot[0]}** | **{tot[1]}** | **{tot[2]}** |")
    return "\n".join(lines)


def tables(doc: dict[str, Any]) -> str:
    return "\n".join(r.markdown() for r in _results(doc)).rstrip()


def cluster_day(doc: dict[str, Any]) -> str:
    """The cluster-day page's block: what ran, the headline numbers of the 'all' rows, the table."""
    (e,) = doc["experiments"]
    res = _results(doc)[0]
    prov = doc.get("provenance", {})
    d = e["data"]
    setup = d["setup"]
    rows = {r["system"]: r for r in e["rows"] if r["workflow"] == "all"}
    g, b = rows["gfaas"], rows["infless+"]
    wall = d["wall_s"]
    m = prov.get("machine") or {}
    lines = [
        f"Run of commit `{str(prov.get('commit'))[:10]}` ({prov.get('utc', '?')}): {setup['nodes']} x "
        f"{setup['machine']} ({setup['gpus']} GPUs), {setup['minutes']} minutes, {d['requests_per_system']:,} "
        f"requests per system, trace: {setup['trace']}, seed {setup['seed']}"
        + (f", util {setup['util']}" if setup.get("util") else "") + ".",
        "",
        "| all requests | gfaas | infless+ |",
        "|---|---:|---:|",
        f"| P50 / P99 end-to-end (ms) | {g['p50_ms']:.1f} / {g['p99_ms']:.1f} | {b['p50_ms']:.1f} / {b['p99_ms']:.1f} |",
        f"| data-passing share of GPU busy time | {g['passing_pct']:.1f}% | {b['passing_pct']:.1f}% |",
        f"| busy GPU-hours (of {g['gpu_alloc_h']:.4g} allocated) | {g['gpu_busy_h']:.3g} | {b['gpu_busy_h']:.3g} |",
        f"| wall time of the run (us per simulated request) | {wall['gfaas']:.0f} s ({d['us_per_request']['gfaas']:.0f})"
        f" | {wall['infless+']:.0f} s ({d['us_per_request']['infless+']:.0f}) |",
        f"| of which building the cluster and deploying | {d['build_s']['gfaas']:.1f} s | {d['build_s']['infless+']:.1f} s |",
        "",
        f"Machine: {m.get('cpu_model', '?')}, {m.get('cores_usable', '?')} cores usable, load average "
        f"{m.get('loadavg', '?')} at the end. Per workflow:",
        "",
    ]
    table = res.markdown().split("\n", 2)[2]  # without the title line
    return "\n".join(lines) + "\n" + table.rstrip()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("--write", metavar="PAGE", help="replace the generated blocks of this Markdown page")
    a = ap.parse_args()
    with open(a.result) as f:
        doc = json.load(f)
    if [e["experiment"] for e in doc["experiments"]] == ["cluster-day"]:
        blocks = {"cluster-day": cluster_day(doc)}
    else:
        blocks = {"sim-summary": summary(doc), "sim-tables": tables(doc)}
    if a.write:
        write_blocks(a.write, blocks)
    else:
        print("\n\n".join(blocks.values()))
