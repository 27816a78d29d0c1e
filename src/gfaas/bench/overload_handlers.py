"""The two functions of ``gfaas bench overload``'s workflow (issue 23): cpu, no model, tiny compute.

``gen`` makes a float32 array of ``n`` elements from its size input; ``red`` sums a strided slice of
it. They live inside gfaas because ``gfaas serve`` loads handlers from allowed packages only
(``--allow-handlers``), and the benchmark serves them with ``--allow-handlers gfaas.bench``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The workflow both the HTTP rows and the embedded ``invoke_p50_us`` run (``n`` float32 elements).
SPEC = """
name: overload
description: gen makes a float32 array from a size, red sums a strided slice (gfaas bench overload)
inputs: {n: {dtype: int64, shape: []}}
outputs: {total: red.total}
functions:
  - {name: gen, kind: cpu, handler: "gfaas.bench.overload_handlers:gen", inputs: {n: input.n},
     outputs: {x: {dtype: float32, shape: [-1]}}}
  - {name: red, kind: cpu, handler: "gfaas.bench.overload_handlers:red", params: {stride: 4},
     inputs: {x: gen.x}, outputs: {total: {dtype: float32, shape: []}}}
"""


def gen(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    n = int(ctx.get(inputs["n"]))
    return {"x": np.arange(n, dtype=np.float32)}


def red(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    x = ctx.get(inputs["x"])
    stride = int(ctx.params.get("stride", 4))
    return {"total": np.float32(x[::stride].sum(dtype=np.float64))}


def expected_total(n: int, stride: int = 4) -> float:
    """What ``red`` answers for ``gen``'s array of ``n`` elements (the benchmark checks every answer)."""
    return float(np.float32(np.arange(n, dtype=np.float64)[::stride].sum()))
