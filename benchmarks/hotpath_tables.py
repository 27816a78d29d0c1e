"""The generated blocks of docs/performance.md that are not the overload rows: the embedded invocation's
profile after issue 23's work (``make profile-results``) and the pipeline against Ray Serve
(``make ray-serve-results``).

    .venv/bin/python benchmarks/hotpath_tables.py benchmarks/results/profile-after-cpu.json --block profile-after
    .venv/bin/python benchmarks/hotpath_tables.py benchmarks/results/ray-serve.json --block ray-serve --write docs/performance.md
"""

from __future__ import annotations

from typing import Any

from doc_blocks import table_main


def _origin(doc: dict[str, Any]) -> str:
    p = doc.get("provenance", {})
    m = p.get("machine") or {}
    return (f"`{p.get('command', '?')}` at commit `{str(p.get('commit', '?'))[:7]}` on {m.get('cpu_model', '?')} "
            f"({m.get('cores', '?')} CPUs, load average {(m.get('loadavg') or ['?'])[0]} at the start)")


def profile_after(doc: dict[str, Any]) -> str:
    cpu = doc["cpu_ms_per_invocation"]
    lines = [f"{_origin(doc)}: {doc['invocations']:,} invocations one after another, p50 {doc['p50_ms']:.2f} ms, "
             f"p99 {doc['p99_ms']:.2f} ms, wall {doc['wall_ms_per_invocation']:.2f} ms per invocation.", "",
             "| process | CPU ms per invocation |", "|---|---:|"]
    lines += [f"| {name} | {ms:.2f} |" for name, ms in sorted(cpu.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def ray_serve(doc: dict[str, Any]) -> str:
    t = doc["target"]
    lines = [f"{_origin(doc)}, Ray {doc['ray_version']}, {doc['samples']} requests per size after "
             f"{doc['warmup']} warm-up ones, one at a time:", "",
             "| array | gfaas p50 ms | of it: compute / function passing / host passing | Ray Serve p50 ms | "
             "Ray Serve / gfaas |", "|---:|---:|---|---:|---:|"]
    for r in doc["rows"]:
        size = r["size_bytes"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        b = r.get("gfaas_breakdown_p50_ms") or {}
        parts = " / ".join("-" if b.get(k) is None else f"{b[k]:.2f}" for k in ("compute", "fn_pass", "host_pass"))
        lines.append(f"| {label} | {r['gfaas_p50_ms']:.2f} | {parts} | {r['ray_serve_p50_ms']:.2f} | "
                     f"{r['ray_serve_over_gfaas']:.1f}x |")
    lines += ["", f"Target: {t['what']}: {t['value']}x, {'met' if t['met'] else '**not met**'}."]
    return "\n".join(lines)


def main() -> None:
    import sys

    block = sys.argv[sys.argv.index("--block") + 1] if "--block" in sys.argv else "profile-after"
    table_main(__doc__ or "", block, profile_after if block == "profile-after" else ray_serve)


if __name__ == "__main__":
    main()
