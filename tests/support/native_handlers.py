"""Handlers the worker's native path is cross-checked on (tests/unit/test_worker_native.py): each output
shape the Python path handles, the common case and every way out of it."""

from __future__ import annotations

from typing import Any

import numpy as np

# What `anyout` returns next (a test sets it): any value a handler could return for output y.
NEXT: dict[str, Any] = {}


def gen(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    n = int(ctx.get(inputs["n"]))
    return {"x": np.arange(n, dtype=np.float32)}


def scale(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    x = ctx.get(inputs["x"])
    return {"x": x * np.float32(ctx.params.get("k", 2)), "big": np.bool_(x.sum() > 100)}


def red(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    x = ctx.get(inputs["x"])
    return {"total": np.float32(x[::4].sum(dtype=np.float64)), "count": len(x)}


def boom(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    ctx.get(inputs["n"])
    raise ValueError("boom: the handler failed")


def anyout(ctx: Any, inputs: dict[str, Any]) -> Any:
    ctx.get(inputs["n"])
    return NEXT["out"]


def which(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """1 when this task runs on the worker's native path (its getter is the native one), else 0: the
    switch reaching a worker, sandboxed or not, is seen from inside it."""
    ctx.get(inputs["x"])
    return {"native": np.int64(type(ctx._getter).__name__ == "CarriedGetter")}


def tamper(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Function code that breaks what the framework reads back from its context."""
    ctx.get(inputs["n"])
    ctx.get_s = "not a number"
    return {"y": np.zeros(2)}
