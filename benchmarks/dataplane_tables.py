"""Print the Markdown tables of docs/benchmarks.md from a ``gfaas bench dataplane --json`` result.

    .venv/bin/python benchmarks/dataplane_tables.py benchmarks/results/dataplane-cpu.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gfaas.bench.dataplane import SYSTEMS, human_size


def _cell(r: dict[str, Any] | None, key: str, fmt: str) -> str:
    return "-" if r is None or r.get(key) is None else format(r[key], fmt)


def tables(doc: dict[str, Any]) -> str:
    sizes = [p["size_bytes"] for p in doc["config"]["plan"]]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in doc["results"])]
    by = {(r["system"], r["size_bytes"]): r for r in doc["results"]}
    mc = {m["size_bytes"]: m for m in doc["memcpy"]}
    out = []

    out.append("| size | " + " | ".join(f"{s} p50 / p99 (us)" for s in systems) + " |")
    out.append("|---:|" + "---:|" * len(systems))
    for n in sizes:
        cells = [f"{_cell(by.get((s, n)), 'p50_us', ',.1f')} / {_cell(by.get((s, n)), 'p99_us', ',.1f')}"
                 for s in systems]
        out.append(f"| {human_size(n)} | " + " | ".join(cells) + " |")
    out.append("")

    out.append("| size | " + " | ".join(f"{s} GB/s" for s in systems) + " | memcpy GB/s (p50 us) |")
    out.append("|---:|" + "---:|" * (len(systems) + 1))
    for n in sizes:
        cells = [_cell(by.get((s, n)), "gbps", ".3f") for s in systems]
        m = mc.get(n)
        cells.append("-" if m is None else f"{m['gbps']:.2f} ({m['p50_us']:,.1f})")
        out.append(f"| {human_size(n)} | " + " | ".join(cells) + " |")
    out.append("")

    split = [s for s in systems if s != "pipe"]
    out.append("| size | " + " | ".join(f"{s} publish / retrieve p50 (us)" for s in split) + " |")
    out.append("|---:|" + "---:|" * len(split))
    for n in sizes:
        cells = [f"{_cell(by.get((s, n)), 'publish_p50_us', ',.1f')} / {_cell(by.get((s, n)), 'retrieve_p50_us', ',.1f')}"
                 for s in split]
        out.append(f"| {human_size(n)} | " + " | ".join(cells) + " |")
    out.append("")

    for t in doc["targets"]:
        out.append(f"- **({t['id']}) {t['target']}: {t['status']}** - {t['detail']}")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(tables(json.load(f)))
