"""The generated block of docs/performance.md, from a ``gfaas bench overload --out`` result.

    .venv/bin/python benchmarks/overload_tables.py benchmarks/results/overload.json                            # print
    .venv/bin/python benchmarks/overload_tables.py benchmarks/results/overload.json --write docs/performance.md

``--write`` replaces the block ``<!-- overload-after -->`` (or the one ``--block`` names:
``overload-honoured``, ``overload-at-once``; ``make overload-results`` runs the benchmark and this), so
the numbers on the page are the file's.
"""

from __future__ import annotations

from typing import Any

from doc_blocks import table_main

from gfaas.bench.rounds import summarize


def _ms(x: Any) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _floor(doc: dict[str, Any], when: str) -> str:
    run = (doc.get("floor_runs") or {}).get(when) or {}
    return "?" if run.get("p50_us") is None else f"{run['p50_us']:.1f}"


def block(doc: dict[str, Any]) -> str:
    prov = doc.get("provenance", {})
    m = prov.get("machine") or {}
    rows = summarize(doc["rows"])  # one line per count: medians over its rounds
    base = rows[0]["goodput_rps"] or 1.0
    cfg = doc.get("config", {})
    rounds = cfg.get("rounds", 1)
    lines = [f"One `{prov.get('command', 'gfaas bench overload --json')}` run at commit "
             f"`{str(prov.get('commit', '?'))[:7]}` on {m.get('cpu_model', '?')} ({m.get('cores', '?')} CPUs): "
             f"pipe floor {doc['floor_us']:.1f} us (p50 {_floor(doc, 'start')} us at the start, {_floor(doc, 'end')} us "
             f"at the end"
             + (f"; polling relays {_floor(doc, 'start, polling')} and {_floor(doc, 'end, polling')} us"
                if "start, polling" in (doc.get("floor_runs") or {}) else "")
             + f"), embedded tiny invocation p50 {doc['invoke_p50_us'] / 1e3:.2f} ms "
             f"({doc['invoke_p50_us'] / doc['floor_us']:.0f}x the floor"
             + (f"; the median of {len(doc['invoke_bursts_us'])} bursts spread over the run: "
                f"{', '.join(f'{x:.0f}' for x in doc['invoke_bursts_us'])} us" if doc.get("invoke_bursts_us") else "")
             + ")"
             + (f", {doc['cpu_ms_per_invocation']:.3f} ms of CPU per invocation in all its processes"
                if doc.get("cpu_ms_per_invocation") is not None else "") + ". "
             + (f"The machine lost {doc['steal_s']:g} s of CPU to other guests during the run (steal). "
                if doc.get("steal_s") else "")
             + ("A refused client retries at once." if cfg.get("retry_after_cap_s", 1.0) == 0 else
                f"A refused client waits Retry-After, at most {cfg.get('retry_after_cap_s', 1.0):g} s, times "
                f"1 + {cfg.get('retry_jitter', 0.0):g} u.")
             + (f" Each count ran {rounds} times, forward then backward (16, 256, 2,000, 2,000, 256, 16, ...): "
                "goodput, latencies and load generator CPU are the median of its rounds (each round's goodput "
                "in brackets), refusal p99s the worst round's, counts the sum of all rounds." if rounds > 1 else ""),
             "",
             "| connections | goodput /s | vs the first row | p50 ms | p99 ms | refused | refusal p99 ms | "
             "after the first s | failed | lost / dup | load generator CPU |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        runs = f" ({', '.join(f'{g:,.0f}' for g in r['goodput_runs'])})" if r["rounds"] > 1 else ""
        lines.append(f"| {r['connections']:,} | {r['goodput_rps']:.1f}{runs} | {r['goodput_rps'] / base:.2f} | "
                     f"{_ms(r['p50_ms'])} | {_ms(r['p99_ms'])} | {r['rejected']:,} | {_ms(r['reject_p99_ms'])} | "
                     f"{_ms(r.get('reject_p99_after_1s_ms'))} | "
                     f"{r['failed']} | {r['lost']} / {r['duplicated']} | {r['loadgen_cpu_frac']:.2f} core |")
    cost = doc.get("refusal_cost")
    if cost:
        lines += ["", f"CPU of the gateway per refusal, all requests refused from {cost['connections']} connections "
                  f"that retry at once (median of {cost['pairs']} interleaved runs each): "
                  f"{cost['early']['cpu_us_per_refusal']:.0f} us answered by the server's protocol "
                  f"({cost['early']['refusals_per_s']:,.0f}/s), {cost['guard']['cpu_us_per_refusal']:.0f} us "
                  f"through the guard ({cost['guard']['refusals_per_s']:,.0f}/s): "
                  f"{cost['ratio_guard_to_early']:.2f}x."]
    lines += ["", "| target | value | bound | met |", "|---|---:|---:|---|"]
    for t in doc.get("targets", []):
        v = t["value"]
        lines.append(f"| {t['target']} | {'-' if v is None else format(v, '.3g')} | {t['bound']:g} | "
                     f"{'yes' if t['status'] == 'pass' else '**no**'} |")
    return "\n".join(lines)


def ab_block(doc: dict[str, Any]) -> str:
    """``benchmarks/ab_overload.py``'s result: goodput of this commit against its base, same minutes."""
    prov = doc.get("provenance", {})
    m = prov.get("machine") or {}
    lines = [f"`{prov.get('command', '?')}` at commit `{str(prov.get('commit', '?'))[:7]}` against "
             f"`{doc['base_commit'][:7]}` on {m.get('cpu_model', '?')} ({m.get('cores', '?')} CPUs): {doc['pairs']} "
             f"pairs, base and new alternately, {doc['duration_s']:g} s per row; invocations lost or duplicated "
             f"in all runs: {doc['lost_or_duplicated']}.", "",
             "| connections | base goodput /s | new goodput /s | new / base (median of pairs) |", "|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {r['connections']:,} | {r['base_goodput_rps']:.1f} | {r['new_goodput_rps']:.1f} | "
                     f"{r['ratio_new_to_base']:.2f}x |")
    for key, label in (("invoke_p50_us", "embedded tiny invocation p50, us"),
                       ("cpu_ms", "CPU ms per embedded invocation")):
        d = doc.get(key)
        if d:
            lines.append(f"\n{label}: base {d['base']:g}, new {d['new']:g} (new / base {d['ratio_new_to_base']:.3f}).")
    return "\n".join(lines)


def main() -> None:
    import sys

    if "--block" in sys.argv and sys.argv[sys.argv.index("--block") + 1] == "overload-ab":
        table_main(__doc__ or "", "overload-ab", ab_block)
        return
    table_main(__doc__ or "", "overload-after", block)


if __name__ == "__main__":
    main()
