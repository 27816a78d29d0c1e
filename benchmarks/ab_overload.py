"""A change against its base, in the same minutes: ``gfaas bench overload`` interleaved A/B.

Goodput over HTTP moves with whatever else runs on a shared 2-core VM, so a committed result of the
base commit is no yardstick for a new one. This script checks the base commit out into a temporary
worktree and runs the benchmark alternately on the base and on this checkout (``PYTHONPATH`` picks
the tree; ``gfaas serve`` and its workers start from it too), ``--pairs`` times, base first in odd
pairs and last in even ones (ABBA). It reports, per connection count, the median over pairs of
``goodput(new) / goodput(base)``, and the same for the embedded invocation's p50 and CPU per
invocation where both commits measure them.

Run: ``.venv/bin/python benchmarks/ab_overload.py --base COMMIT [--pairs 3] [--json FILE]``
(about 80 s per pair with the defaults: 16 connections for 10 s). With several ``--connections`` it
also reports each count's goodput over the first one's, per commit, and the refusals; with
``--retry-after-cap`` the load generator's clients wait up to that long when refused (the
benchmark's own flag).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its sibling ab_common, however it is loaded
from ab_common import base_tree, interleaved, write_json  # noqa: E402

from gfaas.cli_bench import cli_settings  # noqa: E402
from gfaas.provenance import provenance  # noqa: E402


def bench(src: str, connections: str, duration: float, retry_after_cap: float | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": src}
    cap = [] if retry_after_cap is None else ["--retry-after-cap", f"{retry_after_cap:g}"]
    out = subprocess.run([sys.executable, "-m", "gfaas", "bench", "overload", "--json", "--connections",
                          connections, "--duration", f"{duration:g}", *cap],
                         env=env, capture_output=True, text=True, check=True, timeout=1800)
    return json.loads(out.stdout)


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    return {"goodput": {r["connections"]: r["goodput_rps"] for r in doc["rows"]},
            "rejected": {r["connections"]: r["rejected"] for r in doc["rows"]},
            "lost": sum(r["lost"] + r["duplicated"] for r in doc["rows"]),
            "invoke_p50_us": doc.get("invoke_p50_us"), "cpu_ms": doc.get("cpu_ms_per_invocation"),
            "floor_us": doc.get("floor_us")}


def run(base: str, pairs: int, connections: str, duration: float,
        retry_after_cap: float | None = None) -> dict[str, Any]:
    def done(k: int, b: dict[str, Any], n: dict[str, Any]) -> None:
        g = ", ".join(f"{c}: {n['goodput'][c] / max(b['goodput'][c], 1e-9):.2f}x" for c in n["goodput"])
        print(f"pair {k + 1}/{pairs}: goodput new/base {g}", file=sys.stderr, flush=True)

    with base_tree(base) as (sha, base_src):
        runs = interleaved(pairs, lambda src: _summary(bench(src, connections, duration, retry_after_cap)),
                           base_src, done)

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    rows = []
    for n in runs[0][0]["goodput"]:
        rows.append({"connections": n, "base_goodput_rps": med([b["goodput"][n] for b, _ in runs]),
                     "new_goodput_rps": med([x["goodput"][n] for _, x in runs]),
                     "ratio_new_to_base": med([x["goodput"][n] / max(b["goodput"][n], 1e-9) for b, x in runs]),
                     "base_rejected": med([b["rejected"][n] for b, _ in runs]),
                     "new_rejected": med([x["rejected"][n] for _, x in runs])})
    first = rows[0]["connections"]
    for row in rows[1:]:  # this count's goodput over the first count's, within each run
        n = row["connections"]
        row["base_over_first"] = med([b["goodput"][n] / max(b["goodput"][first], 1e-9) for b, _ in runs])
        row["new_over_first"] = med([x["goodput"][n] / max(x["goodput"][first], 1e-9) for _, x in runs])
    doc: dict[str, Any] = {"base_commit": sha, "pairs": pairs, "connections": connections, "duration_s": duration,
                           "retry_after_cap_s": retry_after_cap,
                           "rows": rows, "lost_or_duplicated": sum(b["lost"] + x["lost"] for b, x in runs)}
    for key in ("invoke_p50_us", "cpu_ms", "floor_us"):
        if all(b[key] is not None and x[key] is not None for b, x in runs):
            doc[key] = {"base": med([b[key] for b, _ in runs]), "new": med([x[key] for _, x in runs]),
                        "ratio_new_to_base": med([x[key] / b[key] for b, x in runs])}
    return doc


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare against (e.g. the one before a change)")
    ap.add_argument("--pairs", type=int, default=3, help="base/new runs, interleaved (default 3)")
    ap.add_argument("--connections", default="16", help="connection counts, comma-separated (default 16)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per connection count (default 10)")
    ap.add_argument("--retry-after-cap", type=float, default=None,
                    help="passed to gfaas bench overload: the longest Retry-After a refused client waits (default: its own)")
    ap.add_argument("--json", help="write the result (with provenance) to this file")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    if a.pairs < 1 or a.duration <= 0:
        sys.exit(f"ab_overload: --pairs {a.pairs} and --duration {a.duration} must be >= 1 and > 0")
    doc = {"provenance": provenance(["benchmarks/ab_overload.py", *sys.argv[1:]], settings=cli_settings(a)),
           **run(a.base, a.pairs, a.connections, a.duration, a.retry_after_cap)}
    print(f"{'connections':>11s} {'base goodput/s':>15s} {'new goodput/s':>14s} {'new/base':>9s}"
          f" {'base refused':>13s} {'new refused':>12s} {'base/first':>11s} {'new/first':>10s}")
    for r in doc["rows"]:
        over = (f" {r['base_over_first']:>11.3f} {r['new_over_first']:>10.3f}" if "base_over_first" in r else "")
        print(f"{r['connections']:>11d} {r['base_goodput_rps']:>15.1f} {r['new_goodput_rps']:>14.1f}"
              f" {r['ratio_new_to_base']:>9.2f} {r['base_rejected']:>13g} {r['new_rejected']:>12g}{over}")
    for key, label in (("invoke_p50_us", "embedded invocation p50 us"), ("cpu_ms", "CPU ms per invocation")):
        if key in doc:
            d = doc[key]
            print(f"{label}: base {d['base']:g}, new {d['new']:g} (new/base {d['ratio_new_to_base']:.3f})")
    write_json(a.json, doc)


if __name__ == "__main__":
    main()
