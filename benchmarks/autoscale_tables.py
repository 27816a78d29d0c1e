"""The generated block of docs/autoscaling.md, from a ``gfaas bench autoscale --out`` result.

    .venv/bin/python benchmarks/autoscale_tables.py benchmarks/results/autoscale.json                          # print
    .venv/bin/python benchmarks/autoscale_tables.py benchmarks/results/autoscale.json --write docs/autoscaling.md

``--write`` replaces the block ``<!-- autoscale-rows -->`` (``make autoscale-results`` runs the benchmark
and this), so the numbers on the page are the file's.
"""

from __future__ import annotations

from typing import Any

from doc_blocks import table_main


def rows(doc: dict[str, Any]) -> str:
    prov = doc.get("provenance", {})
    m = prov.get("machine") or {}
    warm = doc["policies"][0]
    c = doc["checks"]
    lines = [f"Measured at commit `{str(prov.get('commit', '?'))[:7]}` on {m.get('cpu_model', '?')} "
             f"({m.get('cores', '?')} CPUs), one `gfaas bench autoscale` run; a worker start took "
             f"{doc['sim']['start_s']:.2f} s on average there.", "",
             "| policy | requests | dropped | p50 ms | p99 ms | p99 / always-warm | cold starts | worker-s | "
             "worker-s / always-warm |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["policies"]:
        lines.append(f"| {r['policy']} | {r['requests']:,} | {r['dropped']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                     f"{r['p99_ms'] / warm['p99_ms']:.2f} | {r['cold_starts']} | {r['worker_seconds']:.0f} | "
                     f"{r['worker_seconds'] / warm['worker_seconds']:.2f} |")
    s = doc["sim"]
    err = c["sim_cold_starts_error"]
    lines += ["", f"The simulator's replay under `gfaas`: {s['cold_starts']} cold starts against "
                  f"{doc['real']['cold_starts']} measured"
                  + (f" ({err:+.0%})" if err is not None else "")
                  + f", {s['worker_seconds']:.0f} worker-seconds, p99 {s['p99_ms']:.0f} ms."]
    return "\n".join(lines)


def main() -> None:
    table_main(__doc__ or "", "autoscale-rows", rows)


if __name__ == "__main__":
    main()
