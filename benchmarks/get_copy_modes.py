"""How fast a consumer gets a private copy of a large object, three ways, against memcpy.

    .venv/bin/python benchmarks/get_copy_modes.py [--sizes 16,64,256] [--reps 7]

get(copy=True) (fresh destination), get(out=buf) (a reused, already-touched destination) and the
zero-copy get, in a second process, each against np.copyto between two touched buffers of the
same size in the same run. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time

import numpy as np

import gfaas
from gfaas.dataplane.local import LocalNode


def _consumer(cred: gfaas.Credentials, conn, sizes: list[int], reps: int) -> None:  # type: ignore[no-untyped-def]
    c = gfaas.connect(cred)
    out: dict[str, dict[int, float]] = {"copy": {}, "out": {}, "view": {}}
    for n in sizes:
        buf = np.ones(n, np.uint8)
        for mode in ("copy", "out", "view"):
            ts = []
            for _ in range(reps):
                ref = conn.recv()
                t = time.perf_counter()
                v = c.get(ref, copy=True) if mode == "copy" else c.get(ref, out=buf) if mode == "out" else c.get(ref)
                ts.append(time.perf_counter() - t)
                assert int(v[n // 2]) == 7
                del v
                conn.send(True)
            out[mode][n] = float(np.median(ts))
    conn.send(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="16,64,256", help="MiB")
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    sizes = [int(s) << 20 for s in a.sizes.split(",")]
    d = tempfile.mkdtemp(prefix="gfb-", dir="/tmp")
    cfg = gfaas.NodeConfig(socket_path=d + "/n.sock", state_dir=d + "/st", capacity_bytes=4 << 30,
                           warm_pool_bytes=1 << 30)
    with LocalNode(cfg), gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as adm:
        inv = adm.open_invocation("bench", ["p", "c"])
        ctx = mp.get_context("spawn")
        a_end, b_end = ctx.Pipe()
        proc = ctx.Process(target=_consumer, args=(inv.credentials("c"), b_end, sizes, a.reps))
        proc.start()
        p = gfaas.connect(inv.credentials("p"))
        memcpy = {}
        for n in sizes:
            x = np.full(n, 7, np.uint8)
            for _ in range(3 * a.reps):
                a_end.send(p.put(x, consumers=["c"]))
                a_end.recv()
            dst = np.zeros(n, np.uint8)
            ts = []
            for _ in range(a.reps):
                t = time.perf_counter()
                np.copyto(dst, x)
                ts.append(time.perf_counter() - t)
            memcpy[n] = float(np.median(ts))
        res = a_end.recv()
        proc.join()
    rows = []
    for n in sizes:
        row = {"size_mib": n >> 20, "memcpy_gbps": round(n / memcpy[n] / 1e9, 2)}
        for mode in ("copy", "out", "view"):
            row[f"get_{mode}_gbps"] = round(n / res[mode][n] / 1e9, 2)
            row[f"get_{mode}_vs_memcpy"] = round(memcpy[n] / res[mode][n], 2)
        rows.append(row)
    print(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
