"""Per-function passing times of reference workflows, one request at a time (no load).

    .venv/bin/python benchmarks/workflow_breakdown.py video driving [--runs 3] [--scale full]

For each workflow and transport it runs ``--runs`` sequential invocations on one warm runtime (the
first of each is a warm-up and is not reported) and prints, as JSON, the median over the rest of
every function's get and put time and of the invocation's host and function-to-function passing.
This is where the numbers for single functions in the closing notes come from (for example
video's ``split`` put, which stores its four chunks by reference to the clip).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from gfaas import workflows
from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.workflows.measured import edges


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="+", choices=workflows.names())
    ap.add_argument("--runs", type=int, default=4, help="invocations per transport, the first a warm-up")
    ap.add_argument("--scale", choices=["small", "full"], default="full")
    a = ap.parse_args()
    out: dict[str, Any] = {}
    cfg = RuntimeConfig(scale=a.scale, threads_per_worker=1, node_capacity_bytes=4 << 30)
    with LocalRuntime(cfg, input_generator=workflows.make_inputs, edge_sizes=edges) as rt:
        for name in a.names:
            rt.deploy(workflows.spec_text(name))
            for transport in ("gfaas", "redis"):
                runs = [rt.invoke(name, seed=i, timeout=600, transport=transport) for i in range(a.runs)][1:]
                bad = [r.error for r in runs if not r.ok]
                if bad:
                    raise SystemExit(f"{name} via {transport} failed: {bad[0]}")

                def ms(values: list[float]) -> float:
                    return round(float(np.median(values)) * 1e3, 2)

                fns = [f.function for f in runs[0].functions]
                out[f"{name}/{transport}"] = {
                    "host_pass_ms": ms([r.breakdown.host_pass_s for r in runs]),
                    "fn_pass_ms": ms([r.breakdown.fn_pass_s for r in runs]),
                    "functions": {fn: {"get_ms": ms([r.functions[k].get_s for r in runs]),
                                       "put_ms": ms([r.functions[k].put_s for r in runs])}
                                  for k, fn in enumerate(fns)},
                }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
