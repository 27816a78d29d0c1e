"""A change against its base, in the same minutes: embedded invocations that queue behind their worker
(``benchmarks/queued_load.py``), interleaved A/B.

Like ``ab_pool_alloc.py``, the base commit is checked out into a temporary worktree and the driver runs
alternately on the base and on this checkout (``PYTHONPATH`` picks the tree), ``--pairs`` times, ABBA.
Per concurrency it reports the medians over pairs of throughput and CPU per invocation and of their
ratios new/base within each pair.

Run: ``.venv/bin/python benchmarks/ab_queued.py --base COMMIT [--pairs 4] [--concurrency 16,256] [--json FILE]``
(about 30 s per pair and concurrency).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its sibling ab_common, however it is loaded
from ab_common import ROOT, base_tree, interleaved, write_json  # noqa: E402

from gfaas.cli_bench import cli_settings  # noqa: E402
from gfaas.provenance import provenance  # noqa: E402

SCRIPT = os.path.join(ROOT, "benchmarks", "queued_load.py")  # this checkout's driver for both halves


def bench(src: str, concurrency: int, n: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": src}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, SCRIPT, "--concurrency", str(concurrency), "--n", str(n), "--json", out.name],
                       env=env, capture_output=True, text=True, check=True, timeout=600)
        with open(out.name) as f:
            doc: dict[str, Any] = json.load(f)
    return doc


def run(base: str, pairs: int, concurrencies: list[int], n: int) -> dict[str, Any]:
    rows = []
    with base_tree(base) as (sha, base_src):
        for c in concurrencies:
            def done(k: int, b: dict[str, Any], new: dict[str, Any], c: int = c) -> None:
                print(f"concurrency {c}, pair {k + 1}/{pairs}: {b['invocations_per_s']:.0f} -> "
                      f"{new['invocations_per_s']:.0f} invocations/s, {b['cpu_ms_per_invocation']:.3f} -> "
                      f"{new['cpu_ms_per_invocation']:.3f} CPU ms each", file=sys.stderr, flush=True)

            runs = interleaved(pairs, lambda src, c=c: bench(src, c, n), base_src, done)
            rows.append({
                "concurrency": c,
                "base_invocations_per_s": statistics.median(b["invocations_per_s"] for b, _ in runs),
                "new_invocations_per_s": statistics.median(x["invocations_per_s"] for _, x in runs),
                "ratio_throughput_new_to_base": round(statistics.median(
                    x["invocations_per_s"] / b["invocations_per_s"] for b, x in runs), 3),
                "base_cpu_ms_per_invocation": statistics.median(b["cpu_ms_per_invocation"] for b, _ in runs),
                "new_cpu_ms_per_invocation": statistics.median(x["cpu_ms_per_invocation"] for _, x in runs),
                "ratio_cpu_new_to_base": round(statistics.median(
                    x["cpu_ms_per_invocation"] / b["cpu_ms_per_invocation"] for b, x in runs), 3),
                "pairs_new_faster": sum(x["invocations_per_s"] > b["invocations_per_s"] for b, x in runs),
                "runs": [{"base": b, "new": x} for b, x in runs]})
    return {"base_commit": sha, "pairs": pairs, "n": n, "rows": rows}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare against (e.g. the one before a change)")
    ap.add_argument("--pairs", type=int, default=4, help="base/new runs, interleaved (default 4)")
    ap.add_argument("--concurrency", default="16,256", help="invocations in flight, comma-separated (default 16,256)")
    ap.add_argument("--n", type=int, default=5000, help="invocations per closed loop (default 5000)")
    ap.add_argument("--json", help="write the result (with provenance) to this file")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    conc = [int(c) for c in a.concurrency.split(",")]
    doc = {"provenance": provenance(["benchmarks/ab_queued.py", *sys.argv[1:]], settings=cli_settings(a)),
           **run(a.base, a.pairs, conc, a.n)}
    print(f"{'in flight':>9s} {'base inv/s':>11s} {'new inv/s':>10s} {'new/base':>9s} {'base CPU ms':>12s}"
          f" {'new CPU ms':>11s} {'new/base':>9s}")
    for r in doc["rows"]:
        print(f"{r['concurrency']:>9d} {r['base_invocations_per_s']:>11.0f} {r['new_invocations_per_s']:>10.0f}"
              f" {r['ratio_throughput_new_to_base']:>9.3f} {r['base_cpu_ms_per_invocation']:>12.3f}"
              f" {r['new_cpu_ms_per_invocation']:>11.3f} {r['ratio_cpu_new_to_base']:>9.3f}")
    write_json(a.json, doc)


if __name__ == "__main__":
    main()
