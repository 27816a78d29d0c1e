"""The Markdown tables of docs/benchmarks.md, from a ``gfaas bench dataplane --json`` result.

    .venv/bin/python benchmarks/dataplane_tables.py benchmarks/results/dataplane-cpu.json            # print
    .venv/bin/python benchmarks/dataplane_tables.py benchmarks/results/dataplane-cpu.json --write docs/benchmarks.md

``--write`` replaces what lies between ``<!-- dataplane-tables -->`` and ``<!-- /dataplane-tables -->``
in the page, so the numbers there are always those of the committed result file.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from doc_blocks import write_blocks

from gfaas.bench.dataplane import SYSTEMS
from gfaas.units import format_bytes


def _cell(r: dict[str, Any] | None, key: str, fmt: str) -> str:
    return "-" if r is None or r.get(key) is None else format(r[key], fmt)


def tables(doc: dict[str, Any]) -> str:
    sizes = [p["size_bytes"] for p in doc["config"]["plan"]]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in doc["results"])]
    by = {(r["system"], r["size_bytes"]): r for r in doc["results"]}
    mc = {m["size_bytes"]: m for m in doc["memcpy"]}
    prov, m = doc.get("provenance", {}), doc["machine"]
    out = [f"Run of commit `{str(prov.get('commit'))[:10]}` on {m['cpu_model']}, {m['cores']} cores, "
           f"{(m['mem_bytes'] or 0) / 2**30:.1f} GiB, Linux {m['kernel']}, Python {m['python']}, numpy {m['numpy']}, "
           f"ray {m['ray'] or '-'}, {m['redis_server'] or 'no redis server'}; load average "
           f"{m['loadavg'][0]} at the start, {m['loadavg_end'][0]} at the end; {doc['duration_s']:.0f} s.", ""]

    def table(title: str, heads: list[str], row: Callable[[int], list[str]]) -> None:
        out.extend([title, "", "| size | " + " | ".join(heads) + " |", "|---:|" + "---:|" * len(heads)])
        out.extend(f"| {format_bytes(n)} | " + " | ".join(row(n)) + " |" for n in sizes)
        out.append("")

    def pair(s: str, n: int, a: str, b: str) -> str:
        return f"{_cell(by.get((s, n)), a, ',.1f')} / {_cell(by.get((s, n)), b, ',.1f')}"

    def memcpy(n: int) -> str:
        x = mc.get(n)
        return "-" if x is None else f"{x['gbps']:.2f} ({x['p50_us']:,.1f})"

    table("Latency of one pass, p50 / p99 in microseconds:", [f"{s}" for s in systems],
          lambda n: [pair(s, n, "p50_us", "p99_us") for s in systems])
    table("Bandwidth of a pass at p50 (GB/s), with the memcpy ceiling of each size (its p50 in us):",
          [f"{s}" for s in systems] + ["memcpy"],
          lambda n: [_cell(by.get((s, n)), "gbps", ".3f") for s in systems] + [memcpy(n)])
    split = [s for s in systems if s != "pipe"]
    table("The two halves of a pass, p50 in microseconds (publish / retrieve):", split,
          lambda n: [pair(s, n, "publish_p50_us", "retrieve_p50_us") for s in split])
    out.append("Targets, checked in the same run:")
    out.append("")
    for t in doc["targets"]:
        out.append(f"- **({t['id']}) {t['target']}: {t['status']}** - {t['detail']}")
    return "\n".join(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("--write", metavar="PAGE", help="replace the generated block of this Markdown page")
    a = ap.parse_args()
    with open(a.result) as f:
        text = tables(json.load(f))
    if a.write:
        write_blocks(a.write, {"dataplane-tables": text})
    else:
        print(text)
