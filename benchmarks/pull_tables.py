"""The generated block of docs/deploy.md on pulls between machines, from a ``gfaas bench pull --out`` result.

    .venv/bin/python benchmarks/pull_tables.py benchmarks/results/pull-cpu.json                       # print
    .venv/bin/python benchmarks/pull_tables.py benchmarks/results/pull-cpu.json --write docs/deploy.md

``--write`` replaces the block ``<!-- pull -->`` (``make pull-results`` runs the benchmark and this).
"""

from __future__ import annotations

from typing import Any

from doc_blocks import table_main


def block(doc: dict[str, Any]) -> str:
    prov = doc.get("provenance", {})
    m = prov.get("machine") or {}
    cfg = doc["config"]
    eng = "engine_gbps" in doc["rows"][0]
    lines = [f"One `{prov.get('command', 'gfaas bench pull --json')}` run at commit "
             f"`{str(prov.get('commit', '?'))[:7]}` on {m.get('cpu_model', '?')} ({m.get('cores', '?')} CPUs shared "
             f"by all {cfg['machines']} machines), links at {cfg['rate_mbit']:g} Mbit/s each way, median of "
             f"{cfg['repeats']} rounds (GB/s)" + (f"; engine: {cfg['engine']}" if eng else "") + ".", "",
             "| size | one TCP stream | gfaas pull (warm) | gfaas pull (cold) |" + (" Mooncake TE read |" if eng else "")
             + " warm / TCP | warm / cold |" + (" warm / TE |" if eng else ""),
             "|---:|---:|---:|---:|" + ("---:|" if eng else "") + "---:|---:|" + ("---:|" if eng else "")]
    for r in doc["rows"]:
        lines.append(f"| {r['bytes'] / 2**20:g} MiB | {r['tcp_gbps']:.2f} | {r['warm_gbps']:.2f} | {r['cold_gbps']:.2f} |"
                     + (f" {r['engine_gbps']:.2f} |" if eng else "")
                     + f" {r['warm_over_tcp']:.2f}x | {r['warm_over_cold']:.2f}x |"
                     + (f" {r['warm_over_engine']:.2f}x |" if eng else ""))
    lines.append("")
    for t in doc["targets"]:
        state = {"pass": "met", "fail": "not met"}.get(t["status"], "not judged")
        lines.append(f"- {t['target']} >= {t['bound']:g}: {t['value']} (**{state}**)")
    return "\n".join(lines)


if __name__ == "__main__":
    table_main(__doc__, "pull", block)
