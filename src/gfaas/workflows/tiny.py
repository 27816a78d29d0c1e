"""A two-function workflow of tiny data: ``gen`` makes a float32 array of ``n`` elements, ``red`` sums a
strided slice of it. Cpu functions, no model: it measures the platform's own cost per invocation
(``gfaas bench overload``, ``gfaas bench ray-serve``) and is the dashboard's deploy example. Its
handlers are in ``gfaas.workflows``, the package a gateway allows by default.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

SPEC = """
name: tiny
description: gen makes a float32 array from a size, red sums a strided slice
inputs: {n: {dtype: int64, shape: []}}
outputs: {total: red.total}
functions:
  - {name: gen, kind: cpu, handler: "gfaas.workflows.tiny:gen", inputs: {n: input.n},
     outputs: {x: {dtype: float32, shape: [-1]}}}
  - {name: red, kind: cpu, handler: "gfaas.workflows.tiny:red", params: {stride: 4},
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
    """What ``red`` answers for ``gen``'s array of ``n`` elements (the benchmarks check every answer)."""
    return float(np.float32(np.arange(n, dtype=np.float64)[::stride].sum()))


def timed_invokes(runtime: Any, n: int, elements: int = 256) -> list[float]:
    """Seconds each of ``n`` invocations of ``tiny`` (deployed on ``runtime``) takes, one after another,
    through the synchronous ``invoke``; every answer is checked (:class:`AssertionError` if wrong)."""
    inputs = {"n": np.asarray(elements, dtype=np.int64)}
    expect = expected_total(elements)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        res = runtime.invoke("tiny", inputs, timeout=60)
        ts.append(time.perf_counter() - t0)
        assert res.status == "done" and float(res.outputs["total"]) == expect, (res.status, res.error)
    return ts
