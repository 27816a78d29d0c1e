"""Embedded invocations with many in flight: throughput and CPU per invocation of the ``tiny`` workflow
when its calls queue behind its worker (the driver of ``ab_queued.py``; public API only, so it runs on
an older checkout too).

``LocalRuntime(RuntimeConfig())`` with ``tiny`` deployed (one worker per function at most), a warm-up,
then ``--reps`` closed loops of ``--n`` invocations with ``--concurrency`` submitted and not yet
fetched: the caller's thread submits, the runtime's loop thread handles the replies. CPU is user+sys
of this process and its children (the workers) from /proc.

Run: ``.venv/bin/python benchmarks/queued_load.py [--concurrency 256] [--n 5000] [--reps 3] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import deque
from typing import Any

import numpy as np

from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.workflows.tiny import SPEC, expected_total

ELEMENTS = 256


def _tree_cpu_s() -> float:
    """user+sys seconds of this process and its direct children (the workers), from /proc."""
    tick, me, total = os.sysconf("SC_CLK_TCK"), os.getpid(), 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(pid) == me or int(fields[1]) == me:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def closed_loop(rt: LocalRuntime, n: int, concurrency: int) -> None:
    """``n`` invocations, ``concurrency`` in flight; each answer checked."""
    inputs = {"n": np.asarray(ELEMENTS, dtype=np.int64)}
    expect = expected_total(ELEMENTS)
    outstanding: deque[str] = deque()
    submitted = 0
    while submitted < n or outstanding:
        while submitted < n and len(outstanding) < concurrency:
            outstanding.append(rt.submit("tiny", inputs))
            submitted += 1
        res = rt.result(outstanding.popleft(), timeout=120)
        assert res.status == "done" and float(res.outputs["total"]) == expect, (res.status, res.error)


def measure(n: int, concurrency: int, reps: int) -> dict[str, Any]:
    runs = []
    with LocalRuntime(RuntimeConfig()) as rt:
        rt.deploy(SPEC)
        closed_loop(rt, min(n, 1000), concurrency)  # warm-up
        for _ in range(reps):
            c0, t0 = _tree_cpu_s(), time.perf_counter()
            closed_loop(rt, n, concurrency)
            wall, cpu = time.perf_counter() - t0, _tree_cpu_s() - c0
            runs.append({"invocations_per_s": round(n / wall, 1), "cpu_ms_per_invocation": round(cpu / n * 1e3, 4)})
    return {"concurrency": concurrency, "n": n, "runs": runs,
            "invocations_per_s": statistics.median(r["invocations_per_s"] for r in runs),
            "cpu_ms_per_invocation": statistics.median(r["cpu_ms_per_invocation"] for r in runs)}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=256, help="invocations in flight (default 256)")
    ap.add_argument("--n", type=int, default=5000, help="invocations per closed loop (default 5000)")
    ap.add_argument("--reps", type=int, default=3, help="closed loops measured (default 3)")
    ap.add_argument("--json", help="write the result to this file")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    doc = measure(a.n, a.concurrency, a.reps)
    print(json.dumps(doc))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f)


if __name__ == "__main__":
    main()
