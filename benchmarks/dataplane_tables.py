"""Print the Markdown tables of docs/benchmarks.md from a ``gfaas bench dataplane --json`` result.

    .venv/bin/python benchmarks/dataplane_tables.py benchmarks/results/dataplane-cpu.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
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

    def table(heads: list[str], row: Callable[[int], list[str]]) -> None:
        out.append("| size | " + " | ".join(heads) + " |")
        out.append("|---:|" + "---:|" * len(heads))
        out.extend(f"| {human_size(n)} | " + " | ".join(row(n)) + " |" for n in sizes)
        out.append("")

    def pair(s: str, n: int, a: str, b: str) -> str:
        return f"{_cell(by.get((s, n)), a, ',.1f')} / {_cell(by.get((s, n)), b, ',.1f')}"

    def memcpy(n: int) -> str:
        m = mc.get(n)
        return "-" if m is None else f"{m['gbps']:.2f} ({m['p50_us']:,.1f})"

    table([f"{s} p50 / p99 (us)" for s in systems], lambda n: [pair(s, n, "p50_us", "p99_us") for s in systems])
    table([f"{s} GB/s" for s in systems] + ["memcpy GB/s (p50 us)"],
          lambda n: [_cell(by.get((s, n)), "gbps", ".3f") for s in systems] + [memcpy(n)])
    split = [s for s in systems if s != "pipe"]
    table([f"{s} publish / retrieve p50 (us)" for s in split],
          lambda n: [pair(s, n, "publish_p50_us", "retrieve_p50_us") for s in split])

    for t in doc["targets"]:
        out.append(f"- **({t['id']}) {t['target']}: {t['status']}** - {t['detail']}")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(tables(json.load(f)))
