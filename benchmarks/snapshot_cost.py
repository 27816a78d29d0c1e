"""What the stats stream costs a node daemon (issue 19: under 2% of its time at one update a second).

A node daemon runs in this process (a thread: the same ``Daemon`` class ``gfaas node start`` runs)
with its per-message entry point (``Daemon._handle``: decode, handler, reply) timed in-process. Another
process keeps a steady put/get load on it (producer ``f`` puts objects for consumer ``g``, which gets
each at once; small ones go through slabs, larger ones through segments of their own). This process
asks for one ``Snapshot`` a second for ``--seconds``, then, for comparison, one ``Stats`` a second for
as long. ``--resident N`` objects stay stored throughout (what a ``Stats`` sums over, and a snapshot
does not). Prints, per phase, the daemon's time handling those requests as a fraction of wall time and
of the daemon thread's CPU time, and the load's operations per second. Nothing is written to disk.

    PYTHONPATH=src .venv/bin/python benchmarks/snapshot_cost.py --seconds 10 --resident 20000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from gfaas.config import MiB, NodeConfig
from gfaas.dataplane import daemon as dmod
from gfaas.dataplane import protocol as P
from gfaas.dataplane.client import Admin
from gfaas.secfiles import private_dir

# The load: put an object for g, g reads it (and so frees it); sizes cycle through a slab's small
# objects and segments of their own. Reports operations done when told to stop (stdin closes).
LOAD = r"""
import os, sys, threading, time
import numpy as np
import gfaas
sock, tf, tg = sys.argv[1:4]
f = gfaas.connect(socket_path=sock, token=tf)
g = gfaas.connect(socket_path=sock, token=tg)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
arrays = [np.ones(n, np.uint8) for n in (1024, 16 * 1024, 512 * 1024)]
ops = 0
print("ready", flush=True)
while not stop.is_set():
    for a in arrays:
        ref = f.put(a, consumers=["g"])
        g.get(ref)
        ops += 2
print(ops, flush=True)
"""


def _cpu_clock(thread: threading.Thread) -> int:
    assert thread.ident is not None
    return time.pthread_getcpuclockid(thread.ident)


def measure(seconds: float, resident: int = 0, load_delay_s: float = 1.0) -> dict[str, Any]:
    run_dir = tempfile.mkdtemp(prefix="gfaas-snapcost-", dir="/tmp")
    cfg = NodeConfig(node_id="bench0", socket_path=os.path.join(run_dir, "node.sock"),
                     state_dir=os.path.join(run_dir, "state"), capacity_bytes=512 * MiB)
    private_dir(cfg.state_dir, "state directory")
    d = dmod.Daemon(cfg)
    d.bind()
    kinds = {P.encode(P.Snapshot()): "Snapshot", P.encode(P.Stats()): "Stats"}
    busy = {"Snapshot": 0.0, "Stats": 0.0, "other": 0.0}
    calls = {"Snapshot": [], "Stats": []}  # type: dict[str, list[float]]
    handle = d._handle

    def timed(conn: Any, data: bytes) -> None:  # the loop thread only: no lock needed for the sums
        t0 = time.perf_counter()
        try:
            handle(conn, data)
        finally:
            dt = time.perf_counter() - t0
            kind = kinds.get(data, "other")
            busy[kind] += dt
            if kind != "other":
                calls[kind].append(dt)

    d._handle = timed  # type: ignore[method-assign]
    t = threading.Thread(target=d.serve_forever, name="bench-daemon", daemon=True)
    t.start()
    admin = Admin(cfg.socket_path, state_dir=cfg.state_dir)
    inv = admin.open_invocation("bench", ["f", "g"])
    if resident:
        import numpy as np

        from gfaas.dataplane.client import connect

        with connect(inv.credentials("f")) as keeper:  # objects open to the invocation: they stay until its end
            one = np.ones(256, np.uint8)
            for _ in range(resident):
                keeper.put(one)
    load = subprocess.Popen([sys.executable, "-c", LOAD, cfg.socket_path, inv.tokens["f"], inv.tokens["g"]],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out: dict[str, Any] = {"seconds": seconds, "resident": resident, "phases": {}}
    try:
        assert load.stdout is not None and load.stdout.readline().strip() == "ready"
        time.sleep(load_delay_s)  # past the first leases and warm-up
        clock = _cpu_clock(t)
        for kind, call in (("Snapshot", admin.snapshot), ("Stats", admin.stats)):
            b0, w0, c0 = busy[kind], time.perf_counter(), time.clock_gettime(clock)
            other0 = busy["other"]
            n = 0
            while time.perf_counter() - w0 < seconds:
                call()
                n += 1
                time.sleep(max(0.0, w0 + n - time.perf_counter()))  # one a second, on the second
            wall = time.perf_counter() - w0
            cpu = time.clock_gettime(clock) - c0
            spent = busy[kind] - b0
            per = sorted(calls[kind][-n:])
            out["phases"][kind] = {
                "requests": n, "wall_s": wall, "daemon_cpu_s": cpu, "handling_s": spent,
                "fraction_of_wall": spent / wall, "fraction_of_daemon_cpu": spent / cpu if cpu > 0 else None,
                "per_request_ms": {"median": 1e3 * per[len(per) // 2], "max": 1e3 * per[-1]},
                "other_requests_handling_s": busy["other"] - other0,
            }
        out["snapshot_example"] = admin.snapshot()
    finally:
        if load.stdin is not None:
            load.stdin.close()
        ops = load.stdout.read().strip() if load.stdout is not None else ""
        load.wait(30)
        admin.close()
        d.stop()
        t.join(10)
        shutil.rmtree(run_dir, ignore_errors=True)
    out["load_ops"] = int(ops) if ops.isdigit() else None
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each phase (one request a second)")
    ap.add_argument("--resident", type=int, default=20000, help="objects kept stored throughout")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--out", metavar="FILE", help="also write the document, with its provenance, to FILE "
                    "(benchmarks/results/snapshot-cost-cpu.json is the committed one)")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    res = measure(args.seconds, args.resident)
    from gfaas.cli_bench import cli_settings
    from gfaas.provenance import provenance

    res["provenance"] = provenance(settings=cli_settings(args))
    res["target"] = {"what": "Snapshot handling under 2% of the daemon's wall time at one a second",
                     "value": res["phases"]["Snapshot"]["fraction_of_wall"],
                     "met": res["phases"]["Snapshot"]["fraction_of_wall"] < 0.02}
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(res, indent=2, default=str) + "\n")
    if args.json:
        print(json.dumps(res, indent=2, default=str))
        return
    for kind, p in res["phases"].items():
        cpu = p["fraction_of_daemon_cpu"]
        print(f"{kind:9s} {p['requests']:3d} requests in {p['wall_s']:.1f} s: daemon handling {p['handling_s'] * 1e3:.2f} ms"
              f" = {100 * p['fraction_of_wall']:.4f}% of wall time, "
              f"{'n/a' if cpu is None else f'{100 * cpu:.4f}%'} of the daemon thread's CPU"
              f" ({p['daemon_cpu_s']:.2f} s); per request median {p['per_request_ms']['median']:.3f} ms,"
              f" max {p['per_request_ms']['max']:.3f} ms")
    print(f"load: {res['load_ops']} puts and gets in all (both phases and the warm-up), {res['resident']} objects"
          " stored throughout")


if __name__ == "__main__":
    main()
