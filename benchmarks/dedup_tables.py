"""The generated tables of docs/dedup.md, from a ``gfaas bench dedup --out`` result.

    .venv/bin/python benchmarks/dedup_tables.py benchmarks/results/dedup.json                     # print
    .venv/bin/python benchmarks/dedup_tables.py benchmarks/results/dedup.json --write docs/dedup.md

``--write`` replaces the blocks ``<!-- dedup-targets -->`` and ``<!-- dedup-rows -->`` (``make
dedup-results`` runs the benchmark and this, as root), so the numbers on the page are the file's.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from doc_blocks import write_blocks


def _f(x: Any, fmt: str = ".2f", none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def targets(doc: dict[str, Any]) -> str:
    prov = doc.get("provenance", {})
    m = prov.get("machine") or {}
    lines = [f"Measured at commit `{str(prov.get('commit', '?'))[:7]}` on {m.get('cpu_model', '?')} "
             f"({m.get('cores', '?')} CPUs, kernel {m.get('kernel', '?')}), models at scale {doc['scale']}; one `gfaas bench dedup` run.", "",
             "| target | measured | met |", "|---|---|---|"]
    t = doc["targets"]
    for key in ("synthetic_gfaas-merge", "synthetic_gfaas-remap"):
        if key in t:
            v = t[key]
            how = "KSM burst" if key.endswith("merge") else "remap onto the store's copy"
            lines.append(f"| {v['processes']} x 100 MB identical bytes merged within 1 s, >= 85% reclaimed ({how}) | "
                         f"all {_f(v['merge_seconds'])} s (85%: {_f(v['merge_seconds_85'])} s), "
                         f"{_f(v['reclaimed_fraction'], '.0%')} reclaimed | {'yes' if v['met'] else '**no**'} |")
    d = t.get("alexnet_density_16")
    if d:
        best = max(d["by_system"].items(), key=lambda kv: kv[1] or 0)
        lines.append("| AlexNet density at 16 processes >= 2x (UPM 2.2x) | "
                     + ", ".join(f"{k} {_f(v)}x" for k, v in d["by_system"].items() if k != "none")
                     + f" (best: {best[0]}) | {'yes' if d['met'] else '**no**'} |")
    i = doc["idle"]
    lines.append(f"| no hint: zero ksmd activity, no added latency | pages scanned {i['ksm_pages_scanned_delta']}, "
                 f"settings unchanged {i['settings_unchanged']}, call latency {i['latency_ratio']:.2f}x | "
                 f"{'yes' if t['idle']['met'] else '**no**'} |")
    return "\n".join(lines)


def rows(doc: dict[str, Any]) -> str:
    lines = ["| workload | N | system | PSS MiB/process | N processes MiB | reclaimed | density | merge s (99%) | "
             "call ms |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {r['model']} | {r['processes']} | {r['system']} | {r['pss_mib_per_process']:.1f} | "
                     f"{r['system_used_mib']:.0f} | {_f(r['reclaimed_fraction'], '.0%')} | "
                     f"{_f(r['density_vs_none'])}x | {_f(r['merge_seconds'])} | {_f(r['call_ms'], '.1f')} |")
    u = doc["upm_published"]
    source = u["source"].replace(" (../shared/design/anchors.md)", "")  # results saved before it named no file
    lines += ["", f"UPM published ({source}): ResNet-50 PSS {u['resnet50']['pss_mib_none']} -> "
              f"{u['resnet50']['pss_mib_upm']} MiB, AlexNet {u['alexnet']['pss_mib_none']} -> "
              f"{u['alexnet']['pss_mib_upm']} MiB ({u['alexnet']['density']}x density), merging at "
              f"{u['merge_gb_per_s']} GB/s, madvise adding {u['resnet50']['madvise_s']} s / "
              f"{u['alexnet']['madvise_s']} s to a warm start."]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("result")
    p.add_argument("--write", metavar="PAGE", help="replace the generated blocks of this Markdown page")
    a = p.parse_args()
    with open(a.result) as f:
        doc = json.load(f)
    blocks = {"dedup-targets": targets(doc), "dedup-rows": rows(doc)}
    if a.write:
        write_blocks(a.write, blocks)
    else:
        print("\n\n".join(blocks.values()))


if __name__ == "__main__":
    main()
