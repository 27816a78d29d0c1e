"""The `gfaas bench sim` table of docs/benchmarks.md, and the native core's table of
docs/design/native-core.md (from ``sim-cpu.json`` and ``simscale-cpu.json``), from committed result files.

Run: ``.venv/bin/python benchmarks/simbench_table.py benchmarks/results/sim-cpu.json --write docs/benchmarks.md
--simscale benchmarks/results/simscale-cpu.json --native-page docs/design/native-core.md``
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
    router = pd.get("router", "Router")
    lines = [
        f"Run of commit `{str(prov.get('commit'))[:10]}` ({doc['machine']}, {doc['python']},"
        f" SimPy {doc['simpy_version']}):",
        "",
        "| measure | result | target |",
        "|---|---|---|",
        f"| event kernel ({doc.get('core', 'python')}), gfaas / SimPy jobs per second | {ratio:.2f}x |"
        f" >= 3x: {'met' if ratio >= 3 else 'missed'} |",
        f"| decision time dgx-v100 gpu->gpu, median ({router}) | {v100['gpu->gpu']['median_us']:.1f} us |"
        f" <= 10 us: {'met' if v100['gpu->gpu']['median_us'] <= 10 else 'missed'} |",
        f"| decision time dgx-a100 gpu->gpu, median ({router}) | {a100['gpu->gpu']['median_us']:.1f} us |"
        f" {'met' if a100['gpu->gpu']['median_us'] <= 10 else 'missed'} |",
        f"| host->gpu / cross-node, dgx-v100, median ({router}) | {v100['host->gpu']['median_us']:.1f} /"
        f" {v100['cross-node']['median_us']:.1f} us | (no target) |",
    ]
    ref = doc.get("policy_decision_python")
    if ref:  # the reference router on the same samples, same run
        rv = ref["dgx-v100"]
        lines.append(f"| the same three, the pure-Python Router | {rv['gpu->gpu']['median_us']:.1f} /"
                     f" {rv['host->gpu']['median_us']:.1f} / {rv['cross-node']['median_us']:.1f} us | (the reference) |")
    return "\n".join(lines)


def native_table(sim: dict[str, Any], scale: dict[str, Any]) -> str:
    """The native core against the pure-Python reference, both measured in the same runs."""
    if sim.get("core") != "native" or scale.get("core") != "native":
        raise SystemExit("these result files were not measured on the native core (their 'core' field)")
    sp, cp = sim.get("provenance", {}), scale.get("provenance", {})
    rows = scale["rows"]
    last = rows[-1]
    ref = sim.get("policy_decision_python", {}).get("dgx-v100", {})
    nat = sim.get("policy_decision", {}).get("dgx-v100", {})
    decisions = [f"| dgx-v100 {k} routing decision under load, median us | {ref[k]['median_us']:.1f} |"
                 f" {nat[k]['median_us']:.1f} | {ref[k]['median_us'] / nat[k]['median_us']:.2f}x |"
                 for k in ("gpu->gpu", "host->gpu", "cross-node") if k in ref and k in nat]
    return "\n".join([
        f"`gfaas bench sim` at commit `{str(sp.get('commit'))[:10]}` and `gfaas bench simscale` at"
        f" `{str(cp.get('commit'))[:10]}` ({sim['machine']}); each timed the pure-Python core in the same run:",
        "",
        "| measure | pure-Python core | native core | native / Python |",
        "|---|---:|---:|---:|",
        f"| M/M/1 kernel, jobs per second | {sim['python_kernel_jobs_per_s']:,.0f} | {sim['gfaas_jobs_per_s']:,.0f} |"
        f" {sim['core_over_python']:.2f}x |",
        *decisions,
        *[f"| `traffic` at {r['nodes']} x dgx-a100 ({r['gpus']:,} GPUs), us per simulated request |"
          f" {r['python_us_per_request']:,.1f} | {r['us_per_request']:,.1f} | {r['speedup']:.2f}x |" for r in rows],
        "",
        f"Target at 1,024 GPUs: <= 100 us per simulated request; the native core takes {last['us_per_request']:,.0f}"
        f" ({'met' if last['us_per_request'] <= 100 else 'missed'}). Both cores simulated the same requests with"
        " the same p50 in every row (the benchmark raises otherwise).",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result")
    ap.add_argument("--write", help="the page whose <!-- sim-bench --> block to replace")
    ap.add_argument("--simscale", help="simscale-cpu.json, for the native core's table")
    ap.add_argument("--native-page", help="the page whose <!-- native-core --> block to replace (needs --simscale)")
    a = ap.parse_args()
    with open(a.result) as f:
        sim = json.load(f)
    text = table(sim)
    if a.write:
        write_blocks(a.write, {"sim-bench": text})
    else:
        print(text)
    if a.simscale:
        with open(a.simscale) as f:
            native = native_table(sim, json.load(f))
        if a.native_page:
            write_blocks(a.native_page, {"native-core": native})
        else:
            print(native)


if __name__ == "__main__":
    main()
