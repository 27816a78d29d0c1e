"""Machine probes behind the explanations in docs/benchmarks.md and docs/design/dataplane.md.

    .venv/bin/python benchmarks/machine_probes.py [--try-shmem-thp] [--json FILE]

Prints one JSON document:
* ``seqpacket_rtt_us``: p50 round trip of a 40-byte message between two Python processes over a
  ``SOCK_SEQPACKET`` socketpair, with 0.2 ms of think time between round trips (so both sleep, as
  in the benchmark's ping-pong) and without;
* ``fresh_shm_write_gbps`` vs ``warm_memcpy_gbps``: writing 64 MiB into a new memfd segment
  against memcpy between touched buffers;
* ``warm_segment_put_ms``: writing 11 MiB through a new mapping of a segment whose pages already
  exist (a warm segment reused by another connection), faulted in with ``madvise(POPULATE_WRITE)``
  or mapped with ``MAP_POPULATE``, against the same write into a fresh segment (what the client's
  ``attach(populate=True)`` and the warm pool are for);
* ``put_copy_gbps``: copying 64 and 256 MiB into a warm shared-memory segment (pages allocated
  and mapped, as a reused warm segment is) on one thread, against the split copy
  ``gfaas.dataplane.copy.copy_bytes`` that large puts use (what issue 12 chose over huge pages);
* ``copy_out_gbps``: copying a 256 MiB shared-memory object into ``np.empty`` versus into anonymous
  memory asked for in huge pages and faulted in with one call (what ``get(copy=True)`` does);
* with ``--try-shmem-thp`` (root only): the copy out of shared memory with
  ``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` set to ``advise`` and the segment
  ``madvise``d for huge pages; the previous setting is restored afterwards, even on failure.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import socket
import time
from typing import Any

import numpy as np

MADV_POPULATE_WRITE = 23
THP_SHMEM = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def _best(fn: Any, reps: int = 4) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def seqpacket_rtt(think_s: float, n: int = 3000) -> float:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        a.close()
        while (m := b.recv(256)):
            b.send(m)
        os._exit(0)
    b.close()
    ts = []
    for _ in range(n):
        if think_s:
            time.sleep(think_s)
        t = time.perf_counter()
        a.send(b"x" * 40)
        a.recv(256)
        ts.append(time.perf_counter() - t)
    a.close()
    os.waitpid(pid, 0)
    return float(np.median(ts)) * 1e6


def fresh_vs_warm(n: int = 64 << 20) -> dict[str, float]:
    src = np.ones(n, np.uint8)

    def fresh() -> None:
        fd = os.memfd_create("probe")
        os.ftruncate(fd, n)
        mm = mmap.mmap(fd, n)
        np.copyto(np.frombuffer(mm, np.uint8), src)
        mm.close()
        os.close(fd)

    dst = np.zeros(n, np.uint8)
    return {"fresh_shm_write_gbps": round(n / _best(fresh) / 1e9, 2),
            "warm_memcpy_gbps": round(n / _best(lambda: np.copyto(dst, src)) / 1e9, 2)}


def warm_segment_put(n: int = 11 << 20) -> dict[str, float]:
    src = np.ones(n, np.uint8)
    warm = os.memfd_create("probe")
    os.ftruncate(warm, n)
    keep = mmap.mmap(warm, n)
    keep.madvise(MADV_POPULATE_WRITE)  # the pages exist, as in a pooled segment

    def remap(flags: int, advise: bool, fd: int = warm) -> None:
        m = mmap.mmap(fd, n, flags)
        if advise:
            m.madvise(MADV_POPULATE_WRITE)
        np.copyto(np.frombuffer(m, np.uint8), src)
        m.close()

    def fresh() -> None:
        fd = os.memfd_create("probe")
        os.ftruncate(fd, n)
        remap(mmap.MAP_SHARED | mmap.MAP_POPULATE, False, fd)
        os.close(fd)

    out = {"warm_madvise_then_copy": round(_best(lambda: remap(mmap.MAP_SHARED, True)) * 1e3, 2),
           "warm_map_populate_then_copy": round(_best(lambda: remap(mmap.MAP_SHARED | mmap.MAP_POPULATE, False)) * 1e3, 2),
           "fresh_map_populate_then_copy": round(_best(fresh) * 1e3, 2)}
    keep.close()
    os.close(warm)
    return out


def copy_out(n: int = 256 << 20, huge_shmem: bool = False) -> dict[str, float]:
    fd = os.memfd_create("probe")
    os.ftruncate(fd, n)
    w = mmap.mmap(fd, n)
    if huge_shmem:
        w.madvise(mmap.MADV_HUGEPAGE)
    w.write(b"\1" * n)
    r = mmap.mmap(fd, n, prot=mmap.PROT_READ)
    if huge_shmem:
        r.madvise(mmap.MADV_HUGEPAGE)
    src = np.frombuffer(r, np.uint8)

    def into_empty() -> None:
        np.copyto(np.empty(n, np.uint8), src)

    def into_huge() -> None:
        m = mmap.mmap(-1, n, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(mmap.MADV_HUGEPAGE)
        m.madvise(MADV_POPULATE_WRITE)
        np.copyto(np.frombuffer(m, np.uint8), src)

    out = {"into_np_empty_gbps": round(n / _best(into_empty) / 1e9, 2),
           "into_huge_anon_gbps": round(n / _best(into_huge) / 1e9, 2)}
    src = np.empty(0, np.uint8)  # drop the view so the mapping can close
    r.close()
    w.close()
    os.close(fd)
    return out


def _copy_times(dst: np.ndarray, src: np.ndarray, split: Any) -> tuple[float, float]:
    return _best(lambda: np.copyto(dst, src), reps=7), _best(lambda: split(dst, src), reps=7)


def put_copy(huge_shmem: bool = False) -> dict[str, dict[str, float]]:
    from gfaas.dataplane.copy import copy_bytes, copy_threads

    out = {}
    for n in (64 << 20, 256 << 20):
        fd = os.memfd_create("probe")
        os.ftruncate(fd, n)
        m = mmap.mmap(fd, n)
        if huge_shmem:
            m.madvise(mmap.MADV_HUGEPAGE)
        m.madvise(MADV_POPULATE_WRITE)
        one, split = _copy_times(np.frombuffer(m, np.uint8), np.full(n, 7, np.uint8), copy_bytes)
        out[f"{n >> 20}MiB"] = {"one_thread_gbps": round(n / one / 1e9, 2),
                                f"split_{copy_threads()}_threads_gbps": round(n / split / 1e9, 2)}
        m.close()
        os.close(fd)
    return out


def pool_alloc_free_us(reps: int = 20000) -> dict[str, dict[str, float]]:
    """The device pool's own cost (pure Python; the same code runs on a GPU): one block alloc + free
    from a warm pool with 50 live blocks, over fake arenas (no driver call is on this path)."""
    from gfaas.policy.pool import MiB, SegmentPool

    nxt = [1 << 40]

    def raw(n: int) -> int:
        nxt[0] += n + (1 << 30)
        return nxt[0]

    p = SegmentPool(raw, lambda b: None, cap_bytes=4096 * MiB, target_bytes=1024 * MiB)
    p.prewarm()
    keep = [p.alloc(MiB) for _ in range(50)]
    out = {}
    for n in (MiB, 64 * MiB):
        xs = []
        for _ in range(reps):
            t = time.perf_counter()
            p.free(p.alloc(n))
            xs.append(time.perf_counter() - t)
        xs.sort()
        out[f"{n // MiB}MiB"] = {"p50": round(xs[len(xs) // 2] * 1e6, 2), "p99": round(xs[int(len(xs) * 0.99)] * 1e6, 2)}
    del keep
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="what this machine's IPC, memory and copies cost (docs/benchmarks.md)")
    ap.add_argument("--try-shmem-thp", action="store_true")
    ap.add_argument("--json", metavar="FILE", help="also write the result here, with its provenance")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    res: dict[str, Any] = {
        "seqpacket_rtt_us": {"with_think_time": round(seqpacket_rtt(2e-4), 1),
                             "back_to_back": round(seqpacket_rtt(0.0), 1)},
        **fresh_vs_warm(),
        "warm_segment_put_ms": warm_segment_put(),
        "put_copy_gbps": put_copy(),
        "copy_out_gbps": copy_out(),
        "pool_alloc_free_us": pool_alloc_free_us(),
    }
    if a.try_shmem_thp:
        with open(THP_SHMEM) as f:
            before = f.read().split("[")[1].split("]")[0]
        try:
            with open(THP_SHMEM, "w") as f:
                f.write("advise")
            res["copy_out_gbps_shmem_thp_advise"] = copy_out(huge_shmem=True)
            res["put_copy_gbps_shmem_thp_advise"] = put_copy(huge_shmem=True)
        finally:
            with open(THP_SHMEM, "w") as f:
                f.write(before)
        res["shmem_enabled_restored_to"] = before
    if a.json:
        from gfaas.cli_bench import cli_settings
        from gfaas.provenance import provenance

        with open(a.json, "w") as f:
            json.dump({**res, "provenance": provenance(settings=cli_settings(a))}, f, indent=1)
            f.write("\n")
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
