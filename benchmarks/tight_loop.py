"""4 KiB put and get latency with nobody sleeping between requests (one process drives both
clients), to separate Python and socket cost from process wake-ups.

    .venv/bin/python benchmarks/tight_loop.py [--n 5000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np

import gfaas
from gfaas.dataplane.local import LocalNode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    n = ap.parse_args().n
    d = tempfile.mkdtemp(prefix="gfb-", dir="/tmp")
    cfg = gfaas.NodeConfig(socket_path=d + "/n.sock", state_dir=d + "/st")
    with LocalNode(cfg), gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as adm:
        inv = adm.open_invocation("bench", ["p", "c"])
        p, c = gfaas.connect(inv.credentials("p")), gfaas.connect(inv.credentials("c"))
        x = np.zeros(4096, np.uint8)
        puts, gets = [], []
        for i in range(n + 500):
            t0 = time.perf_counter()
            ref = p.put(x, consumers=["c"])
            t1 = time.perf_counter()
            c.get(ref)
            t2 = time.perf_counter()
            if i >= 500:
                puts.append(t1 - t0)
                gets.append(t2 - t1)
    print(json.dumps({"n": n, "put_p50_us": round(float(np.median(puts)) * 1e6, 1),
                      "get_p50_us": round(float(np.median(gets)) * 1e6, 1),
                      "put_get_p50_us": round(float(np.median(np.add(puts, gets))) * 1e6, 1)}))


if __name__ == "__main__":
    main()
