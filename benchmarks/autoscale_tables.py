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
    runs = doc.get("runs") or [doc]
    w = doc.get("workload", {})
    lines = [f"Measured at commit `{str(prov.get('commit', '?'))[:7]}` on {m.get('cpu_model', '?')} "
             f"({m.get('cores', '?')} CPUs): `gfaas bench autoscale --runs {w.get('runs', 1)}`. The table is "
             f"run 1; the checks below are the mean of the {len(runs)} run(s).", "",
             "| policy | requests | dropped | p50 ms | p99 ms | p99 / always-warm | cold starts | worker-s | "
             "worker-s / always-warm |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["policies"]:
        lines.append(f"| {r['policy']} | {r['requests']:,} | {r['dropped']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                     f"{r['p99_ms'] / warm['p99_ms']:.2f} | {r['cold_starts']} | {r['worker_seconds']:.0f} | "
                     f"{r['worker_seconds'] / warm['worker_seconds']:.2f} |")
    t = doc.get("targets") or {}

    def row(label: str, key: str, fmt: str, cmp: str = "<=", absolute: bool = False) -> str:
        v, bound = c.get(key), t.get(key)
        if v is None:
            return f"| {label} | - | {bound if bound is not None else '-'} | - |"
        met = "-" if bound is None else ("yes" if (abs(v) if absolute else v) <= bound else "**no**")
        per = ", ".join(format(r["checks"][key], fmt) for r in runs if r["checks"].get(key) is not None) \
            if len(runs) > 1 and key in runs[0].get("checks", {}) else ""
        return f"| {label} | {v:{fmt}}{f' ({per})' if per else ''} | {cmp} {bound:g} | {met} |" if bound is not None \
            else f"| {label} | {v:{fmt}} | - | - |"

    lines += ["", "| check | value (per run) | target | met |", "|---|---:|---:|---|",
              row("gfaas p99 / always-warm p99", "gfaas_p99_over_always_warm", ".2f"),
              row("gfaas worker-seconds / always-warm", "gfaas_worker_seconds_over_always_warm", ".2f"),
              row("simulated cold starts vs measured (relative error)", "sim_cold_starts_error", "+.2f", "+-",
                  absolute=True)]
    if "worker_start_no_model_p50_ms" in c:
        z = doc.get("burst_from_zero") or {}
        lines += [row("worker start, request to ready, p50 ms: no model", "worker_start_no_model_p50_ms", ".1f"),
                  row(f"the same with a zoo model in the shared store ({doc['worker_start_ms'].get('model')})",
                      "worker_start_zoo_model_p50_ms", ".1f"),
                  row(f"0-to-{z.get('requests', '?')} burst: first request's ms over its warm latency",
                      "burst_first_over_warm_ms", ".1f")]
        ws = doc["worker_start_ms"]
        phases = "; ".join(f"{k.replace('_phases_p50', '').replace('_', ' ')}: "
                           + ", ".join(f"{p} {v:g}" for p, v in ws[k].items())
                           for k in ("no_model_phases_p50", "zoo_model_phases_p50"))
        lines += ["", f"Worker starts by phase, median ms of {ws.get('starts')} starts one at a time ({phases}); "
                      f"the first start of a runtime also starts its template: {ws['no_model_first_ms']:g} ms. "
                      f"0-to-{z.get('requests')} burst: the first request {z.get('first_ms')} ms, warm "
                      f"{z.get('warm_first_ms')} ms."]
    s = doc["sim"]
    lines += ["", f"The simulator's replay of run 1 under `gfaas` (worker start {s['start_s'] * 1e3:.0f} ms, as "
                  f"measured in that run): {s['cold_starts']} cold starts against {doc['real']['cold_starts']} "
                  f"measured, {s['worker_seconds']:.0f} worker-seconds, p99 {s['p99_ms']:.0f} ms."]
    return "\n".join(lines)


def main() -> None:
    table_main(__doc__ or "", "autoscale-rows", rows)


if __name__ == "__main__":
    main()
