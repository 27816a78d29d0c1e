"""The generated block of docs/performance.md, from a ``gfaas bench overload --out`` result.

    .venv/bin/python benchmarks/overload_tables.py benchmarks/results/overload.json                            # print
    .venv/bin/python benchmarks/overload_tables.py benchmarks/results/overload.json --write docs/performance.md

``--write`` replaces the block ``<!-- overload-after -->`` (``make overload-results`` runs the benchmark
and this), so the numbers on the page are the file's.
"""

from __future__ import annotations

from typing import Any

from doc_blocks import table_main


def _ms(x: Any) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _floor(doc: dict[str, Any], when: str) -> str:
    run = (doc.get("floor_runs") or {}).get(when) or {}
    return "?" if run.get("p50_us") is None else f"{run['p50_us']:.1f}"


def block(doc: dict[str, Any]) -> str:
    prov = doc.get("provenance", {})
    m = prov.get("machine") or {}
    rows = doc["rows"]
    base = rows[0]["goodput_rps"] or 1.0
    cfg = doc.get("config", {})
    lines = [f"One `{prov.get('command', 'gfaas bench overload --json')}` run at commit "
             f"`{str(prov.get('commit', '?'))[:7]}` on {m.get('cpu_model', '?')} ({m.get('cores', '?')} CPUs): "
             f"pipe floor {doc['floor_us']:.1f} us (p50 {_floor(doc, 'start')} us at the start, {_floor(doc, 'end')} us "
             f"at the end), embedded tiny invocation p50 {doc['invoke_p50_us'] / 1e3:.2f} ms "
             f"({doc['invoke_p50_us'] / doc['floor_us']:.0f}x the floor). A refused client waits Retry-After, "
             f"at most {cfg.get('retry_after_cap_s', 1.0):g} s, times 1 + {cfg.get('retry_jitter', 0.0):g} u.", "",
             "| connections | goodput /s | vs the first row | p50 ms | p99 ms | refused | refusal p99 ms | "
             "after the first s | failed | lost / dup | load generator CPU |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['connections']:,} | {r['goodput_rps']:.1f} | {r['goodput_rps'] / base:.2f} | "
                     f"{_ms(r['p50_ms'])} | {_ms(r['p99_ms'])} | {r['rejected']:,} | {_ms(r['reject_p99_ms'])} | "
                     f"{_ms(r.get('reject_p99_after_1s_ms'))} | "
                     f"{r['failed']} | {r['lost']} / {r['duplicated']} | {r['loadgen_cpu_frac']:.2f} core |")
    lines += ["", "| target | value | bound | met |", "|---|---:|---:|---|"]
    for t in doc.get("targets", []):
        v = t["value"]
        lines.append(f"| {t['target']} | {'-' if v is None else format(v, '.3g')} | {t['bound']:g} | "
                     f"{'yes' if t['status'] == 'pass' else '**no**'} |")
    return "\n".join(lines)


def main() -> None:
    table_main(__doc__ or "", "overload-after", block)


if __name__ == "__main__":
    main()
