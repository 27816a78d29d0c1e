"""The `gfaas bench sim` table of docs/benchmarks.md, from a committed result file.

Run: ``.venv/bin/python benchmarks/simbench_table.py benchmarks/results/sim-cpu.json --write docs/benchmarks.md``
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from doc_blocks import write_blocks


def table(doc: dict[str, Any]) -> str:
    pd = doc["policy_decision"]
    v100, a100 = pd["dgx-v100"], pd["dgx-a100"]
    ratio = doc["ratio"]
    prov = doc.get("provenance", {})
    return "\n".join([
        f"Run of commit `{str(prov.get('commit'))[:10]}` ({doc['machine']}, {doc['python']},"
        f" SimPy {doc['simpy_version']}):",
        "",
        "| measure | result | target |",
        "|---|---|---|",
        f"| event kernel, gfaas / SimPy jobs per second | {ratio:.2f}x | >= 3x: {'met' if ratio >= 3 else 'missed'} |",
        f"| decision time dgx-v100 gpu->gpu, median | {v100['gpu->gpu']['median_us']:.1f} us |"
        f" <= 10 us: {'met' if v100['gpu->gpu']['median_us'] <= 10 else 'missed'} |",
        f"| decision time dgx-a100 gpu->gpu, median | {a100['gpu->gpu']['median_us']:.1f} us |"
        f" {'met' if a100['gpu->gpu']['median_us'] <= 10 else 'missed'} |",
        f"| host->gpu / cross-node, dgx-v100, median | {v100['host->gpu']['median_us']:.1f} /"
        f" {v100['cross-node']['median_us']:.1f} us | (no target) |",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result")
    ap.add_argument("--write", help="the page whose <!-- sim-bench --> block to replace")
    a = ap.parse_args()
    with open(a.result) as f:
        text = table(json.load(f))
    if a.write:
        write_blocks(a.write, {"sim-bench": text})
    else:
        print(text)


if __name__ == "__main__":
    main()
