"""Warm heaps (``RuntimeConfig.worker_heap``) both ways, alternating in one run: what docs/performance.md
("Warm heaps") quotes.

1. ``arange``: a child process makes and frees a 64 MiB float32 array (``np.arange`` of 16 Mi) again and
   again, with :func:`gfaas.runtime.heap.keep_freed` (``reuse``) or without (``release``): the median
   milliseconds per array and the minor page faults per array.
2. ``driving``: the ``driving`` workflow at scale full, one invocation at a time, on a
   ``LocalRuntime`` whose workers reuse or release their heaps: the medians of each invocation's
   total, compute and host passing, and how long this process (the runtime's) takes to fill a fresh
   array of the size of driving's largest result right after each invocation (the cost, on a VM, of
   memory the workers no longer give back).

Run: ``.venv/bin/python benchmarks/heap_ab.py [--pairs 2] [--invocations 6] [--json benchmarks/results/heap-cpu.json]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

import numpy as np

from gfaas import workflows
from gfaas.cli_bench import cli_settings
from gfaas.provenance import provenance
from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.workflows.measured import edges

MODES = ("release", "reuse")
FRESH_BYTES = 24_883_200  # the size of driving's largest result, which the runtime copies at scale full

_ARANGE = """
import json, resource, sys, time
import numpy as np
from gfaas.runtime.heap import keep_freed
if sys.argv[1] == "reuse":
    assert keep_freed()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    x = np.arange(16 * 2**20, dtype=np.float32); del x
ts, fs = [], []
for _ in range(int(sys.argv[2])):
    f0, t0 = faults(), time.perf_counter()
    x = np.arange(16 * 2**20, dtype=np.float32)
    ts.append(time.perf_counter() - t0); fs.append(faults() - f0)
    del x
print(json.dumps({"ms": float(np.median(ts)) * 1e3, "faults": float(np.median(fs))}))
"""


def arange(mode: str, n: int = 20) -> dict[str, float]:
    p = subprocess.run([sys.executable, "-c", _ARANGE, mode, str(n)], capture_output=True, text=True, check=True)
    return json.loads(p.stdout)


def fresh_fill_ms() -> float:
    t0 = time.perf_counter()
    a = np.empty(FRESH_BYTES, dtype=np.uint8)
    a[:] = 1
    return (time.perf_counter() - t0) * 1e3


def driving(mode: str, n: int) -> dict[str, float]:
    cfg = RuntimeConfig(scale="full", threads_per_worker=1, node_capacity_bytes=4 << 30, keep_alive_s=3600,
                        worker_heap=mode)  # type: ignore[arg-type]
    inputs = workflows.make_inputs("driving", 0, "full")
    parts: list[tuple[float, float, float, float]] = []
    with LocalRuntime(cfg, edge_sizes=edges) as rt:
        rt.deploy(workflows.spec_text("driving"))
        rt.invoke("driving", inputs, timeout=120)
        for _ in range(n):
            r = rt.invoke("driving", inputs, timeout=120)
            if r.status != "done":
                raise RuntimeError(f"driving answered {r.status}: {r.error}")
            b = r.breakdown
            parts.append((b.total_s * 1e3, b.compute_s * 1e3, b.host_pass_s * 1e3, fresh_fill_ms()))
    med = np.median(np.asarray(parts), axis=0)
    return {"total_ms": float(med[0]), "compute_ms": float(med[1]), "host_pass_ms": float(med[2]),
            "runtime_fresh_fill_ms": float(med[3])}


def run(pairs: int, invocations: int, say: Any = print) -> dict[str, Any]:
    out: dict[str, Any] = {"arange": {m: [] for m in MODES}, "driving": {m: [] for m in MODES}}
    for k in range(pairs):
        for mode in MODES:
            out["arange"][mode].append(arange(mode))
            out["driving"][mode].append(driving(mode, invocations))
            say(f"pair {k + 1}/{pairs} {mode}: arange {out['arange'][mode][-1]}, driving {out['driving'][mode][-1]}")
    out["pairs"], out["invocations"], out["fresh_bytes"] = pairs, invocations, FRESH_BYTES
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2, help="release/reuse runs, alternating (default 2)")
    ap.add_argument("--invocations", type=int, default=6, help="timed driving invocations per run (default 6)")
    ap.add_argument("--json", help="write the result (with provenance) to this file")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    doc = {"provenance": provenance(["benchmarks/heap_ab.py", *sys.argv[1:]], settings=cli_settings(a)),
           **run(a.pairs, a.invocations, lambda s: print(s, file=sys.stderr))}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    else:
        print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
