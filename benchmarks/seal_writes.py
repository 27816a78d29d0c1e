"""What sealing large objects' writes costs the runtime's path (issue 14: ``NodeConfig.seal_writes``).

The runtime gives each task a new daemon connection and each request a new invocation. A segment
whose writes are sealed (``F_SEAL_FUTURE_WRITE``) can be written again only through a mapping made
before the seal, so with ``seal_writes`` a new connection never reuses a warm segment and its large
put faults in fresh pages; without it, the workflow's freed segment is reused warm (issue 12).

Each round is one request as the runtime runs it: open an invocation, connect the producer, put an
object of the size, connect the consumer, read it, close both, end the invocation. Both settings run
in the same minutes on two daemons, rounds interleaved; the put's median is reported with the ratio
sealed / not sealed per size.

Run: ``.venv/bin/python benchmarks/seal_writes.py [--rounds 15] [--json benchmarks/results/seal-writes-cpu.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

import gfaas
from gfaas.cli_bench import cli_settings
from gfaas.config import GiB, MiB
from gfaas.dataplane.local import LocalNode
from gfaas.provenance import provenance

SIZES = (16 * MiB, 256 * MiB)


def one_request(admin: gfaas.Admin, data: np.ndarray) -> float:
    """A request's put, timed: new invocation, new connections (what a runtime task does)."""
    inv = admin.open_invocation("wf", ["f", "g"])
    prod = gfaas.connect(inv.credentials("f"))
    t0 = time.perf_counter()
    ref = prod.put(data, consumers=["g"])
    put_s = time.perf_counter() - t0
    cons = gfaas.connect(inv.credentials("g"))
    view = cons.get(ref)
    assert view.nbytes == data.nbytes
    del view
    cons.close()
    prod.close()
    admin.end_invocation(inv)
    return put_s


def run(rounds: int) -> dict[str, Any]:
    root = tempfile.mkdtemp(prefix="gfb-seal-", dir="/tmp")
    nodes: dict[bool, tuple[LocalNode, gfaas.Admin]] = {}
    try:
        for sealed in (False, True):
            d = os.path.join(root, "sealed" if sealed else "open")
            os.makedirs(d, mode=0o700)
            cfg = gfaas.NodeConfig(node_id="b0", socket_path=os.path.join(d, "n.sock"),
                                   state_dir=os.path.join(d, "state"), capacity_bytes=2 * GiB,
                                   seal_writes=sealed, spill_capacity_bytes=0)
            node = LocalNode(cfg).__enter__()
            nodes[sealed] = (node, gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir))
        rows = []
        for size in SIZES:
            data = np.full(size, 7, np.uint8)
            times: dict[bool, list[float]] = {False: [], True: []}
            for sealed in (False, True):  # one warm-up request each: the first put faults pages anyway
                one_request(nodes[sealed][1], data)
            for _ in range(rounds):
                for sealed in (False, True):
                    times[sealed].append(one_request(nodes[sealed][1], data))
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            rows.append({"size_bytes": size, "put_ms_default": round(med[False], 3),
                         "put_ms_seal_writes": round(med[True], 3),
                         "ratio_seal_writes_to_default": round(med[True] / med[False], 2)})
            print(f"{size // MiB:4d} MiB  put p50: default {med[False]:8.2f} ms   seal_writes {med[True]:8.2f} ms"
                  f"   ratio {med[True] / med[False]:5.2f}", flush=True)
        return {"rounds": rounds, "rows": rows}
    finally:
        for node, admin in nodes.values():
            admin.close()
            node.__exit__(None, None, None)
        shutil.rmtree(root, ignore_errors=True)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15, help="requests per size and setting (default 15)")
    ap.add_argument("--json", help="write the result (with provenance) to this file")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    doc = {"provenance": provenance(["benchmarks/seal_writes.py", *sys.argv[1:]], settings=cli_settings(a)),
           **run(a.rounds)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
