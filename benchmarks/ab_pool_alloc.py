"""A change against its base, in the same minutes: the device pool's allocation benchmark interleaved A/B.

``benchmarks/pool_alloc.py`` times :meth:`~gfaas.policy.pool.SegmentPool.alloc` on fake addresses: the
pool's own Python, which is what a put pays on a GPU too (no driver call is on that path). Like
``ab_dataplane.py``, this checks the base commit out into a temporary worktree and runs the benchmark
alternately on the base and on this checkout (``PYTHONPATH`` picks the tree), ``--pairs`` times, base
first in odd pairs and last in even ones, and reports per size the median over pairs of
``p50(new) / p50(base)`` and ``p99(new) / p99(base)``.

Run: ``.venv/bin/python benchmarks/ab_pool_alloc.py --base COMMIT [--pairs 7] [--json FILE]`` (a few
seconds per pair).
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

SCRIPT = os.path.join(ROOT, "benchmarks", "pool_alloc.py")  # this checkout's driver for both halves


def bench(src: str) -> dict[int, tuple[float, float]]:
    env = {**os.environ, "PYTHONPATH": src}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, SCRIPT, "--json", out.name], env=env, capture_output=True, text=True,
                       check=True, timeout=600)
        with open(out.name) as f:
            doc = json.load(f)
    return {r["size_mib"]: (r["pool_p50_us"], r["pool_p99_us"]) for r in doc["rows"]}


def run(base: str, pairs: int) -> dict[str, Any]:
    with base_tree(base) as (sha, base_src):
        runs = interleaved(pairs, bench, base_src)
    rows = []
    for size in sorted(runs[0][0]):
        rows.append({"size_mib": size,
                     "base_p50_us": round(statistics.median(b[size][0] for b, _ in runs), 2),
                     "new_p50_us": round(statistics.median(n[size][0] for _, n in runs), 2),
                     "ratio_p50_new_to_base": round(statistics.median(n[size][0] / b[size][0] for b, n in runs), 3),
                     "ratio_p99_new_to_base": round(statistics.median(n[size][1] / b[size][1] for b, n in runs), 3)})
    return {"base_commit": sha, "pairs": pairs, "rows": rows}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare against (e.g. the one before a change)")
    ap.add_argument("--pairs", type=int, default=7, help="base/new runs, interleaved (default 7)")
    ap.add_argument("--json", help="write the result (with provenance) to this file")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    doc = {"provenance": provenance(["benchmarks/ab_pool_alloc.py", *sys.argv[1:]], settings=cli_settings(a)),
           **run(a.base, a.pairs)}
    print(f"{'size':>6s} {'base p50 us':>12s} {'new p50 us':>11s} {'p50 new/base':>13s} {'p99 new/base':>13s}")
    for r in doc["rows"]:
        print(f"{r['size_mib']:>4d}Mi {r['base_p50_us']:>12.2f} {r['new_p50_us']:>11.2f}"
              f" {r['ratio_p50_new_to_base']:>13.3f} {r['ratio_p99_new_to_base']:>13.3f}")
    write_json(a.json, doc)


if __name__ == "__main__":
    main()
