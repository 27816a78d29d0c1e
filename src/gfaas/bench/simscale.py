"""Benchmark: the simulator at cluster scale, constant load per GPU (issue 24).

The ``traffic`` workflow on ``dgx-a100`` x N nodes (8 GPUs each), ``system("gfaas")``, replicas =
GPUs // GPU functions placed by :func:`gfaas.policy.place_replicas` (each replica on one node, the
least-loaded first), Poisson arrivals at ``RATE_PER_NODE`` requests/s per node for ``seconds``
simulated seconds (``gfaas.sim.arrivals.poisson``, seed 1). So the load per GPU is the same at every
N and the simulated p50 should not move; what grows is the simulator's work.

Per row: ``requests`` simulated, ``wall_s`` from building the cluster to the last event
(``time.perf_counter``; the simulator never reads the clock, only this benchmark does),
``us_per_request = wall_s / requests`` and the simulated ``p50_ms``; ``gc_us_per_request`` and
``gc_collected_per_request``: the cycle collector's time and the objects it freed while the row ran,
per request (a request should leave it nothing: docs/design/simulator.md). Wall times depend on the CPU
and what else runs on it; compare rows of one run, or runs on one machine.

Where the simulator's core is the native one (``gfaas.sim.kernel.CORE``), every size is run again in a
child process on the pure-Python core (``GFAAS_SIM_CORE=python``), the reference, in the same run:
``python_us_per_request`` and ``speedup`` (its wall time over the native one's); the two must simulate
the same requests with the same p50, or the benchmark raises.

Run ``gfaas bench simscale --json`` (``--quick``: 1 and 8 nodes, 1 simulated second) or
``python -m gfaas.bench.simscale [--nodes 1,8] [--seconds S]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

from ..sim.arrivals import poisson
from ..sim.cluster import Cluster
from ..sim.kernel import CORE
from ..sim.systems import system
from ..sim.workflows import workflow
from ..topology import preset

WORKFLOW = "traffic"
MACHINE = "dgx-a100"
RATE_PER_NODE = 20.0  # requests/s: 2.5 per GPU
NODES = (1, 8, 32, 128)
SECONDS = 5.0


def row(nodes: int, seconds: float = SECONDS, seed: int = 1) -> dict[str, object]:
    """One cluster size: build, deploy, run; the figures of the module docstring."""
    collector = _Collections()
    gc.callbacks.append(collector)
    try:
        t0 = time.perf_counter()
        topo = preset(MACHINE if nodes == 1 else f"{MACHINE}*{nodes}")
        c = Cluster(topo, system("gfaas"), seed=0)
        wf = workflow(WORKFLOW)
        c.deploy(wf, max(1, len(topo.gpus) // max(len(wf.gpu_functions), 1)))
        c.submit_many(WORKFLOW, poisson(RATE_PER_NODE * nodes, seconds, seed))
        recs = c.run()
        wall = time.perf_counter() - t0
    finally:
        gc.callbacks.remove(collector)
    lat = [r.latency for r in recs if r.finish >= 0]
    n = max(len(recs), 1)
    return {"nodes": nodes, "gpus": len(topo.gpus), "requests": len(recs), "wall_s": round(wall, 6),
            "us_per_request": round(wall / len(recs) * 1e6, 1) if recs else float("nan"),
            "p50_ms": round(float(np.median(lat)) * 1e3, 3) if lat else float("nan"),
            "gc_us_per_request": round(collector.seconds / n * 1e6, 1),
            "gc_collected_per_request": round(collector.collected / n, 2)}


class _Collections:
    """The cycle collector's time and what it freed while a row ran (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds, self.collected, self._t0 = 0.0, 0, 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.collected += info["collected"]


def python_row(nodes: int, seconds: float = SECONDS, seed: int = 1) -> dict[str, object]:
    """:func:`row` on the pure-Python core, in a child process (the core is chosen at import)."""
    env = {**os.environ, "GFAAS_SIM_CORE": "python"}
    code = f"import json; from gfaas.bench.simscale import row; print(json.dumps(row({nodes}, {seconds!r}, {seed})))"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"the pure-Python row at {nodes} nodes failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def run(nodes: Sequence[int] = NODES, seconds: float = SECONDS) -> dict[str, object]:
    rows = []
    for n in nodes:
        r = row(n, seconds)
        if CORE == "native":
            ref = python_row(n, seconds)
            if (ref["requests"], ref["p50_ms"]) != (r["requests"], r["p50_ms"]):
                raise RuntimeError(f"at {n} nodes the native core simulated {r['requests']} requests, p50 "
                                   f"{r['p50_ms']} ms, and the pure-Python one {ref['requests']}, {ref['p50_ms']} ms")
            r["python_us_per_request"] = ref["us_per_request"]
            r["speedup"] = round(float(ref["wall_s"]) / float(r["wall_s"]), 2)  # type: ignore[arg-type]
        rows.append(r)
    return {"workflow": WORKFLOW, "machine": MACHINE, "rate_per_node": RATE_PER_NODE, "seconds": seconds,
            "core": CORE, "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default=",".join(map(str, NODES)), help="comma-separated cluster sizes")
    p.add_argument("--seconds", type=float, default=SECONDS, help="simulated seconds per size")
    a = p.parse_args(argv)
    print(json.dumps(run([int(n) for n in a.nodes.split(",")], a.seconds), indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
