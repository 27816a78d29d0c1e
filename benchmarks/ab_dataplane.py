"""A change against its base, in the same minutes: the data-plane benchmark interleaved A/B.

On a shared 2-core VM, two runs of ``gfaas bench dataplane`` an hour apart differ by 10-30% for every
system, the pipe peer included, so a committed result of the base commit is no yardstick for a new
one. This script checks the base commit out into a temporary worktree and runs the benchmark
alternately on the base and on this checkout (``PYTHONPATH`` picks the tree; the daemon and its
clients are started from it too), ``--pairs`` times, base first in odd pairs and last in even ones. For each system and size it reports the median
over pairs of ``p50(new) / p50(base)``, raw and with each run's pipe as the yardstick
(``(new / new pipe) / (base / base pipe)``), so drift that hits both halves of a pair cancels.

Run: ``.venv/bin/python benchmarks/ab_dataplane.py --base COMMIT [--pairs 5] [--json FILE]``
(about 70 s per pair with the default systems).
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

SYSTEMS = "gfaas-zero-copy,gfaas-copy,pipe"


def bench(src: str, systems: str) -> dict[tuple[str, int], float]:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-m", "gfaas", "bench", "dataplane", "--systems", systems, "--json"],
                         env=env, capture_output=True, text=True, check=True, timeout=1200)
    doc = json.loads(out.stdout)
    return {(r["system"], r["size_bytes"]): r["p50_us"] for r in doc["results"]}


def run(base: str, pairs: int, systems: str) -> dict[str, Any]:
    with base_tree(base) as (sha, base_src):
        runs = interleaved(pairs, lambda src: bench(src, systems), base_src,
                           lambda k, b, n: print(f"pair {k + 1}/{pairs} done", file=sys.stderr, flush=True))
    rows = []
    for key in sorted(runs[0][0], key=lambda k: (k[0], k[1])):
        system, size = key
        raw = [n[key] / b[key] for b, n in runs]
        row: dict[str, Any] = {"system": system, "size_bytes": size,
                               "base_p50_us": round(statistics.median(b[key] for b, _ in runs), 2),
                               "new_p50_us": round(statistics.median(n[key] for _, n in runs), 2),
                               "ratio_new_to_base": round(statistics.median(raw), 3)}
        pk = ("pipe", size)
        if system != "pipe" and pk in runs[0][0]:
            row["ratio_vs_pipe_new_to_base"] = round(statistics.median(
                (n[key] / n[pk]) / (b[key] / b[pk]) for b, n in runs), 3)
        rows.append(row)
    return {"base_commit": sha, "pairs": pairs, "systems": systems.split(","), "rows": rows}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare against (e.g. the one before a change)")
    ap.add_argument("--pairs", type=int, default=5, help="base/new runs, interleaved (default 5)")
    ap.add_argument("--systems", default=SYSTEMS, help=f"systems of the benchmark (default {SYSTEMS})")
    ap.add_argument("--json", help="write the result (with provenance) to this file")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    doc = {"provenance": provenance(["benchmarks/ab_dataplane.py", *sys.argv[1:]], settings=cli_settings(a)),
           **run(a.base, a.pairs, a.systems)}
    print(f"{'system':16s} {'size':>10s} {'base p50 us':>12s} {'new p50 us':>11s} {'new/base':>9s} {'vs pipe':>8s}")
    for r in doc["rows"]:
        print(f"{r['system']:16s} {r['size_bytes']:>10d} {r['base_p50_us']:>12.1f} {r['new_p50_us']:>11.1f}"
              f" {r['ratio_new_to_base']:>9.3f} {r.get('ratio_vs_pipe_new_to_base', float('nan')):>8.3f}")
    write_json(a.json, doc)


if __name__ == "__main__":
    main()
