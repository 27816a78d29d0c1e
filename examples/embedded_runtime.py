"""Run a custom workflow on the embedded runtime: deploy a spec, invoke it, read the results.

    .venv/bin/python examples/embedded_runtime.py

A two-way workflow: ``shrink`` makes a thumbnail and its brightness; ``histogram`` always runs;
``brighten`` runs only for dark images (a condition on a scalar output). Each function runs in its
own warm worker process; intermediates pass through the node's shared memory, not through this
process. The input images are seeded, so the printed output is always the same
(tests/integration/test_examples.py checks it against embedded_runtime.out).
"""

from __future__ import annotations

import os
import sys

import numpy as np

import gfaas

HERE = os.path.dirname(os.path.abspath(__file__))
# Worker processes import the handlers by name, so the module must be on their path too.
sys.path.insert(0, HERE)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)

SPEC = """
name: thumbs
inputs: {image: {dtype: uint8, shape: [-1, -1, 3]}}
outputs: {counts: histogram.counts, fixed: brighten.fixed}
functions:
  - {name: shrink, kind: cpu, handler: "thumbs_handlers:shrink", inputs: {image: input.image},
     outputs: {small: {dtype: float32, shape: [-1, -1, 3]}, brightness: {shape: []}}}
  - {name: histogram, kind: cpu, handler: "thumbs_handlers:histogram", params: {bins: 4},
     inputs: {small: shrink.small}, outputs: {counts: {dtype: int64, shape: [4]}}}
  - {name: brighten, kind: cpu, handler: "thumbs_handlers:brighten",
     inputs: {small: {from: shrink.small, when: "shrink.brightness < 0.4"}},
     outputs: {fixed: {dtype: float32, shape: [-1, -1, 3]}}}
"""


def main() -> None:
    rng = np.random.default_rng(7)
    images = {"dark": rng.integers(0, 90, (480, 640, 3), dtype=np.uint8),
              "bright": rng.integers(120, 256, (480, 640, 3), dtype=np.uint8)}
    with gfaas.LocalRuntime(gfaas.RuntimeConfig(executor="process")) as rt:
        print("deployed", rt.deploy(SPEC))
        for name, img in images.items():
            res = rt.invoke("thumbs", {"image": img})
            ran = [f.function for f in res.functions if not f.skipped]
            skipped = [f.function for f in res.functions if f.skipped]
            print(f"{name}: status {res.status}, ran {sorted(ran)}, skipped {sorted(skipped)}")
            print(f"  brightness {res.scalars['shrink.brightness']:.4f}, histogram {res.outputs['counts'].tolist()}")
            if "fixed" in res.outputs:
                fixed = res.outputs["fixed"]
                print(f"  brightened thumbnail {fixed.shape} {fixed.dtype}, mean {fixed.mean():.4f}")


if __name__ == "__main__":
    main()
