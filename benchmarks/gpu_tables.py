"""The generated GPU blocks of docs/benchmarks.md and docs/gpu.md, from the committed GPU result files.

    .venv/bin/python benchmarks/gpu_tables.py            # print both blocks
    .venv/bin/python benchmarks/gpu_tables.py --write    # replace <!-- gpu-rows --> in docs/benchmarks.md
                                                         # and <!-- demo-gpu --> in docs/gpu.md

The results come from the GPU machine (`make bench-gpu`, `make demo-gpu`); this script only renders
them, so it runs anywhere.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from doc_blocks import write_blocks

from gfaas.demo_gpu import table as demo_table

MiB = 1 << 20
GPU_TARGET_REDIS = ("video", "driving", "image", "traffic")  # the GPU-speed targets' data passing, beyond the demo's own


def _origin(doc: dict[str, Any], what: str) -> str:
    p = doc.get("provenance", {})
    m = p.get("machine") or {}
    declared = " (declared by the sender: see the file's provenance note)" if p.get("commit_declared") else ""
    return (f"{what} at commit `{str(p.get('commit', '?'))[:7]}`{declared}, {p.get('utc', '?')}, on "
            f"{m.get('cpu_model', '?')} ({m.get('cores', '?')} CPUs) with one {doc['device']}.")


def gpu_rows(doc: dict[str, Any]) -> str:
    g = doc["gpu"]
    rows = {(r["kind"], r["system"], r.get("size_bytes")): r for r in g["rows"]}
    sizes = sorted({r["size_bytes"] for r in g["rows"] if r["kind"] in ("h2d", "d2h")})
    systems = ["gfaas-ring", "gfaas-ring-8MiB", "cuda-pinned", "cuda-pageable"]
    if any(r["system"] == "gfaas-registered" for r in g["rows"]):  # runs from the registered path on
        systems.insert(2, "gfaas-registered")
    out = [_origin({**doc, "device": g["device"]}, "One `make bench-gpu` run"), "",
           "| direction | size | " + " | ".join(f"{s} GB/s" for s in systems) + " |",
           "|---|---:|" + "---:|" * len(systems)]
    for kind in ("h2d", "d2h"):
        for n in sizes:
            cells = [f"{rows[(kind, s, n)]['gbps']:.1f}" if (kind, s, n) in rows else "-" for s in systems]
            out.append(f"| {kind} | {n // MiB} MiB | " + " | ".join(cells) + " |")
    out += ["", "| other rows | system | size | p50 us | GB/s |", "|---|---|---:|---:|---:|"]
    for r in g["rows"]:
        if r["kind"] in ("alloc", "same-gpu-get", "register"):
            pays = f" (pays at copy {r['copies_to_pay']})" if r.get("copies_to_pay") else ""
            out.append(f"| {r['kind']} | {r['system']}{pays} | {r['size_bytes'] // MiB} MiB | {r['p50_us']:.1f} | "
                       f"{r['gbps']:.1f} |")
    out += ["", "| target | value | met |", "|---|---:|---|"]
    out += [f"| {t['target']} | {t['value']:g} | {'yes' if t['met'] else '**no**'} |" for t in g["targets"]]
    return "\n".join(out)


def demo_gpu(doc: dict[str, Any]) -> str:
    t = doc.get("target") or {}
    lines = [_origin(doc, f"One `make demo-gpu` run (`--requests {doc['requests_per_workflow']}`)"), "", "```",
             demo_table(doc), "```"]
    if t:
        got = "; ".join(f"{wf} {doc['ratios'][wf]['redis_over_device']:.1f}x ({'met' if t['met'][wf] else '**not met**'})"
                        for wf in t["workflows"])
        lines += ["", f"Target: data passing through Redis at least {t['redis_over_device_min']:g}x "
                      f"the device path's for {', '.join(t['workflows'])}: {got}."]
    r = doc["ratios"]
    redis = "; ".join(f"{wf} {r[wf]['redis_over_device']:.1f}x{'' if r[wf]['redis_over_device'] >= 10 else ' (**not met**)'}"
                      for wf in GPU_TARGET_REDIS if wf in r)
    slower = [f"{wf} {r[wf]['host_over_device']:.2f}" for wf in sorted(r) if r[wf]["host_over_device"] < 1.0]
    lines += ["", f"GPU-speed targets: Redis / device at least 10x for {', '.join(GPU_TARGET_REDIS)}: {redis}. "
                  "Device passing never slower than host-only passing (host / device >= 1): "
                  + ("met for every workflow." if not slower else f"**not met** for {', '.join(slower)}.")]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--results", default="benchmarks/results")
    ap.add_argument("--write", action="store_true", help="replace the blocks in docs/benchmarks.md and docs/gpu.md")
    a = ap.parse_args()
    with open(f"{a.results}/dataplane-gpu.json") as f:
        rows = gpu_rows(json.load(f))
    with open(f"{a.results}/demo-gpu.json") as f:
        demo = demo_gpu(json.load(f))
    if a.write:
        write_blocks("docs/benchmarks.md", {"gpu-rows": rows})
        write_blocks("docs/gpu.md", {"demo-gpu": demo})
    else:
        print(rows, demo, sep="\n\n")


if __name__ == "__main__":
    main()
