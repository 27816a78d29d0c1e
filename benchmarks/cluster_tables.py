"""The generated block of docs/deploy.md, from a ``gfaas bench cluster --out`` result.

    .venv/bin/python benchmarks/cluster_tables.py benchmarks/results/cluster-cpu.json                       # print
    .venv/bin/python benchmarks/cluster_tables.py benchmarks/results/cluster-cpu.json --write docs/deploy.md

``--write`` replaces the block ``<!-- cluster -->`` (``make cluster-results`` runs the benchmark and
this), so the numbers on the page are the file's.
"""

from __future__ import annotations

from typing import Any

from doc_blocks import table_main


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def block(doc: dict[str, Any]) -> str:
    prov = doc.get("provenance", {})
    m = prov.get("machine") or {}
    cfg = doc["config"]
    lines = [f"One `{prov.get('command', 'gfaas bench cluster --json')}` run at commit "
             f"`{str(prov.get('commit', '?'))[:7]}` on {m.get('cpu_model', '?')} ({m.get('cores', '?')} CPUs shared "
             f"by all {cfg['machines']} machines), links at {cfg['rate_mbit']:g} Mbit/s each way, median of "
             f"{cfg['repeats']} (ms). One tensor from a function on m1 to one on m2: the producer's put plus the "
             "consumer's get until it holds the array; `link` is one crossing at the link rate.", "",
             "| size | link | gfaas | Redis | Ray object store | Redis / gfaas | Ray / gfaas | puts: gfaas, Redis, Ray |",
             "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in doc["passing"]:
        p = r.get("put_ms", {})
        lines.append(f"| {_mib(r['bytes'])} | {r.get('link_ms', 0):.1f} | {r['gfaas_ms']:.1f} | {r['redis_ms']:.1f} | "
                     f"{r['ray_ms']:.1f} | {r['redis_over_gfaas']:.2f}x | {r['ray_over_gfaas']:.2f}x | "
                     f"{p.get('gfaas', 0):.1f}, {p.get('redis', 0):.1f}, {p.get('ray', 0):.1f} |")
    t = doc.get("targets", {})
    lines += ["", f"Targets (>= 1 MiB): 3x cheaper than Redis: **{'met' if t.get('gfaas_3x_cheaper_than_redis_at_1MiB_up') else 'not met'}**; "
              f"no slower than Ray's object store: **{'met' if t.get('gfaas_no_slower_than_ray_at_1MiB_up') else 'not met'}**."]
    if doc.get("workflows"):
        lines += ["", "End to end, the reference workflows (small) on the same warm actors, p50 ms:", "",
                  "| workflow | gfaas | Redis | Redis / gfaas | machines used |", "|---|---:|---:|---:|---|"]
        for w in doc["workflows"]:
            lines.append(f"| {w['workflow']} | {w['gfaas_p50_ms']:.1f} | {w['redis_p50_ms']:.1f} | "
                         f"{w['redis_over_gfaas']:.2f}x | {', '.join(w.get('nodes', []))} |")
    return "\n".join(lines)


if __name__ == "__main__":
    table_main(__doc__, "cluster", block)
