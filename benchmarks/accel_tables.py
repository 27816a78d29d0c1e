"""The generated blocks of docs/accel.md, from ``gfaas bench accel --out`` and ``gfaas accel dse --json``.

    .venv/bin/python benchmarks/accel_tables.py benchmarks/results/accel-scalesim.json benchmarks/results/accel-dse.json \
        benchmarks/results/accel-emulation.json
    .venv/bin/python benchmarks/accel_tables.py ... --write docs/accel.md

``--write`` replaces the blocks ``<!-- accel-scalesim -->`` (the validation table against SCALE-Sim v3),
``<!-- accel-dse -->`` (the design-space exploration's outcome) and ``<!-- accel-emulation -->``
(outputs against onnxruntime, from ``benchmarks/accel_emulation.py``), so the page's numbers are those of
the committed result files (``make accel-results`` runs everything).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from doc_blocks import write_blocks

TARGET_ERR, TARGET_SPEEDUP, TARGET_DSE_S = 0.05, 1000.0, 60.0


def _run(doc: dict[str, Any]) -> str:
    p = doc.get("provenance", {})
    m = p.get("machine") or {}
    return (f"commit `{str(p.get('commit'))[:10]}` (clean: {p.get('dirty') is False}, {p.get('utc', '?')}), "
            f"{m.get('cpu_model', '?')}, {m.get('cores_usable', '?')} cores")


def scalesim(doc: dict[str, Any]) -> str:
    lines = [f"Run of {_run(doc)}: `{doc['scalesim']}` in its own virtual environment, compute cycles.", "",
             "| workload | array | dataflow | layers | max relative error | cycles SCALE-Sim / ours | "
             "wall SCALE-Sim / ours |", "|---|---|---|---:|---:|---:|---:|"]
    for what, blocks in (("GEMM and conv layers", doc["layers"]), ("SCALE-Sim's ResNet-50", doc["resnet50"])):
        for b in blocks:
            lines.append(f"| {what} | {b['array']} | {b['dataflow']} | {len(b['layers'])} | {b['max_rel_err']:.2%} | "
                         f"{b['scalesim_total']:,} / {b['ours_total']:,} | {b['scalesim_wall_s']:.1f} s / "
                         f"{b['ours_wall_s'] * 1e3:.2f} ms |")
    ok_err = doc["max_rel_err"] <= TARGET_ERR
    ok_sp = doc["speedup_vs_scalesim"] >= TARGET_SPEEDUP
    lines += ["", f"Largest error {doc['max_rel_err']:.2%} (target <= {TARGET_ERR:.0%}: "
              f"{'met' if ok_err else 'missed'}); on ResNet-50 ours is {doc['speedup_vs_scalesim']:,.0f}x faster than "
              f"SCALE-Sim in the same run (target >= {TARGET_SPEEDUP:,.0f}x: {'met' if ok_sp else 'missed'})."]
    return "\n".join(lines)


def dse(doc: dict[str, Any]) -> str:
    ch, pp, ppw = doc["chosen"], doc["paper_point"], doc["best_perf_per_w"]
    lines = [f"Run of {_run(doc)}: {doc['points']} points x {len(doc['models'])} models in {doc['seconds']:.1f} s "
             f"(target <= {TARGET_DSE_S:.0f} s: {'met' if doc['seconds'] <= TARGET_DSE_S else 'missed'}); "
             f"{doc['feasible_points']} points within {doc['budget_w']:g} W peak.", "",
             "| point | inferences/s (geomean of 8 models) | chip power, average (W) | peak (W) | area (mm2) |",
             "|---|---:|---:|---:|---:|"]
    for label, p in (("chosen: best under the budget", ch), ("best per watt", ppw), ("the paper's (128x128, 4 MiB, DDR5)", pp)):
        if p:
            lines.append(f"| {label}: `{p['name']}` | {p['geomean_ips']:.4g} | {p['avg_power_w']:.3g} | "
                         f"{p['peak_power_w']:.3g} | {p['area_mm2']:.3g} |")
    if pp.get("rank"):
        lines += ["", f"The paper's point ranks {pp['rank']} of {pp['of']} feasible points, at "
                  f"{pp['perf_vs_chosen']:.2f}x the chosen point's performance; on the power frontier: "
                  f"{pp['on_power_frontier']}, on the area frontier: {pp['on_area_frontier']}."]
    return "\n".join(lines)


def emulation(doc: dict[str, Any]) -> str:
    lines = [f"Run of {_run(doc)}: zoo models at scale `{doc['scale']}` on the `{doc['config']}` preset, "
             "largest relative error against onnxruntime (bound: fp32 1e-4, int8 0.3).", "",
             "| model | fp32 | int8 |", "|---|---:|---:|"]
    by = {(r["model"], r["precision"]): r for r in doc["rows"]}
    for m in dict.fromkeys(r["model"] for r in doc["rows"]):
        cells = [f"{by[(m, p)]['max_rel_err']:.3g}" + ("" if by[(m, p)]["outputs_match"] else " **over**")
                 for p in ("fp32", "int8")]
        lines.append(f"| {m} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scalesim")
    ap.add_argument("dse")
    ap.add_argument("emulation")
    ap.add_argument("--write", metavar="PAGE")
    a = ap.parse_args()
    with open(a.scalesim) as f:
        s = json.load(f)
    with open(a.dse) as f:
        d = json.load(f)
    with open(a.emulation) as f:
        e = json.load(f)
    blocks = {"accel-scalesim": scalesim(s), "accel-dse": dse(d), "accel-emulation": emulation(e)}
    if a.write:
        write_blocks(a.write, blocks)
    else:
        print("\n\n".join(blocks.values()))


if __name__ == "__main__":
    main()
