"""Fit the simulator's h100-x1 preset to a measured GPU run and record the calibration.

Usage: .venv/bin/python benchmarks/calibrate_h100.py [benchmarks/results/dataplane-gpu.json]
Writes benchmarks/results/h100-calibration.json next to its input.
"""

from __future__ import annotations

import json
import os
import sys

from gfaas.provenance import provenance
from gfaas.topology.calibrate import calibrate_h100


def main() -> int:
    src = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/dataplane-gpu.json"
    if not os.path.exists(src):
        print(f"{src} not found: run `make bench-gpu` on a machine with a CUDA GPU first", file=sys.stderr)
        return 2
    with open(src) as f:
        doc = json.load(f)
    _, record = calibrate_h100(doc.get("gpu", doc))
    # Drawn from the run it fits: that run's commit and machine, with this script's command.
    record["provenance"] = {**doc.get("provenance", provenance()), "command": " ".join(sys.argv)}
    out = os.path.join(os.path.dirname(src), "h100-calibration.json")
    with open(out, "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
