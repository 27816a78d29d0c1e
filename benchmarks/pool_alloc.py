"""Allocation from the elastic pool vs a raw allocation per object (issue 6: pool alloc <= 10 us p99).

Times what a put pays for memory on the daemon's path, one call at a time:

- ``pool``: :class:`~gfaas.policy.pool.SegmentPool.alloc` from a pool pre-warmed by the elastic
  policy (target from a :class:`~gfaas.policy.DemandTracker` fed with the same sizes), plus the
  tracker's ``stored`` bookkeeping, with 50 other objects live. The arenas are fake addresses, so
  this is the pool's own cost; on a GPU the same Python runs and no driver call is on this path.
- ``fresh``: the peer without a pool on this machine: a new POSIX shared-memory segment of the same
  size, mapped and its first page touched (what a store without a pool pays per object on CPU;
  a ``cudaMalloc`` on a GPU is slower still, milliseconds per seed 001 §4.4.1).

Run: ``.venv/bin/python benchmarks/pool_alloc.py [--json benchmarks/results/pool-alloc-cpu.json]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import time
from multiprocessing import shared_memory
from typing import Any

from gfaas.cli_bench import cli_settings
from gfaas.policy import DemandTracker, StorageOptions
from gfaas.policy.pool import MiB, SegmentPool
from gfaas.provenance import provenance


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def pool_alloc_us(nbytes: int, reps: int) -> list[float]:
    nxt = [1 << 40]

    def raw(n: int) -> int:
        nxt[0] += n + (1 << 30)
        return nxt[0]

    tracker = DemandTracker(StorageOptions())
    for k in range(200):  # a function seen every 10 ms, storing nbytes, ten executions deep
        tracker.request("f", k * 0.01)
        tracker.stored("f", nbytes, k * 0.01)
        if k >= 10:
            tracker.released("f", k * 0.01)
    now = 2.0
    pool = SegmentPool(raw, lambda b: None, cap_bytes=64 * 1024 * MiB)
    pool.set_target(tracker.target(now) + 64 * MiB)
    pool.prewarm(tracker.largest_object(now))
    keep = [pool.alloc(MiB) for _ in range(50)]
    out = []
    gc.disable()
    try:
        for i in range(reps):
            t = time.perf_counter_ns()
            b = pool.alloc(nbytes)
            tracker.stored("f", nbytes, now + i * 1e-3)
            out.append((time.perf_counter_ns() - t) / 1e3)
            pool.free(b)
            tracker.released("f", now + i * 1e-3)
    finally:
        gc.enable()
    del keep
    return out


def fresh_segment_us(nbytes: int, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter_ns()
        seg = shared_memory.SharedMemory(create=True, size=nbytes)
        seg.buf[0] = 1  # the first page really exists
        out.append((time.perf_counter_ns() - t) / 1e3)
        seg.close()
        seg.unlink()
    return out


def run(reps: int = 20000) -> dict[str, Any]:
    rows = []
    for size in (MiB, 16 * MiB, 64 * MiB):
        p = pool_alloc_us(size, reps)
        f = fresh_segment_us(size, max(200, reps // 50))
        rows.append({"size_mib": size // MiB, "pool_p50_us": round(_pct(p, 0.5), 2),
                     "pool_p99_us": round(_pct(p, 0.99), 2), "fresh_p50_us": round(_pct(f, 0.5), 1),
                     "fresh_p99_us": round(_pct(f, 0.99), 1),
                     "speedup_p99": round(_pct(f, 0.99) / _pct(p, 0.99), 1)})
    return {"provenance": provenance(),
            "page_bytes": mmap.PAGESIZE, "reps": reps, "target_p99_us": 10.0, "rows": rows}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20000)
    ap.add_argument("--json", help="also write the result here")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    res = run(a.reps)
    res["provenance"]["settings"] = cli_settings(a)
    print(f"{'size':>8} {'pool p50':>9} {'pool p99':>9} {'fresh p50':>10} {'fresh p99':>10} {'p99 ratio':>9}")
    for r in res["rows"]:
        print(f"{r['size_mib']:>5}MiB {r['pool_p50_us']:>7.2f}us {r['pool_p99_us']:>7.2f}us "
              f"{r['fresh_p50_us']:>8.1f}us {r['fresh_p99_us']:>8.1f}us {r['speedup_p99']:>8.1f}x")
    worst = max(r["pool_p99_us"] for r in res["rows"])
    print(f"pool alloc p99 (worst size) {worst:.2f} us: target <= 10 us {'met' if worst <= 10 else 'MISSED'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
