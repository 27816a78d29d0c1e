"""A simulator experiment: the video workflow on a DGX-V100, gfaas against two host-centric or
GPU-store baselines, same arrivals, same seed.

    .venv/bin/python examples/sim_experiment.py

The simulator runs the runtime's own spec of the workflow (its DAG, measured edge sizes, conditions)
with the same policy code the node runs (placement, SLO deadlines, transfer planning), over a model
of the machine's links. Everything is seeded, so the printed output is always the same
(tests/integration/test_examples.py checks it against sim_experiment.out).
"""

from __future__ import annotations

import numpy as np

from gfaas.sim.cluster import Cluster
from gfaas.sim.systems import system
from gfaas.sim.workflows import workflow
from gfaas.topology import preset


def main() -> None:
    topo = preset("dgx-v100")
    arrivals = np.arange(40) * 0.05  # 40 requests, one every 50 ms
    print(f"video on {topo.name}: {len(topo.gpus)} GPUs, {len(arrivals)} requests, 20 per second")
    for name in ("gfaas", "nvshmem+", "infless+"):
        c = Cluster(topo, system(name), seed=7)
        c.deploy(workflow("video"))
        c.submit_many("video", arrivals)
        lat = np.array(sorted(r.latency for r in c.run())) * 1e3
        print(f"  {name:9s} mean {lat.mean():7.2f} ms  p99 {np.percentile(lat, 99):7.2f} ms")


if __name__ == "__main__":
    main()
