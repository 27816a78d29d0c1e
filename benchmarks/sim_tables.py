"""The generated parts of docs/results/README.md, from ``gfaas sim run all --save`` output.

    .venv/bin/python benchmarks/sim_tables.py benchmarks/results/sim-experiments.json                # print
    .venv/bin/python benchmarks/sim_tables.py benchmarks/results/sim-experiments.json --write docs/results/README.md

``--write`` replaces the blocks between ``<!-- sim-summary -->`` / ``<!-- /sim-summary -->`` (counts
of headline comparisons within their tolerance and in the paper's direction, per experiment) and
``<!-- sim-tables -->`` / ``<!-- /sim-tables -->`` (every experiment's table), so the numbers on
the page are always those of the committed result file.
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


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("--write", metavar="PAGE", help="replace the generated blocks of this Markdown page")
    a = ap.parse_args()
    with open(a.result) as f:
        doc = json.load(f)
    blocks = {"sim-summary": summary(doc), "sim-tables": tables(doc)}
    if a.write:
        write_blocks(a.write, blocks)
    else:
        print(blocks["sim-summary"] + "\n\n" + blocks["sim-tables"])
