"""Numpy-only handlers for runtime tests (imported by worker processes through PYTHONPATH)."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from gfaas.dataplane.store import DENIED_MESSAGE  # imported before a sandbox closes (denied, below)
from gfaas.errors import AccessDenied


def double(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    x = ctx.get(inputs["x"])
    return {"y": x * 2, "n_pos": int((x > 0).sum())}


def negate(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"y": -ctx.get(inputs["x"])}


def add(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"y": ctx.get(inputs["a"]) + ctx.get(inputs["b"])}


def split(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    x = ctx.get(inputs["x"])
    h = len(x) // 2
    return {"lo": np.ascontiguousarray(x[:h]), "hi": np.ascontiguousarray(x[h:])}


def concat(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"y": np.concatenate([ctx.get(inputs["a"]), ctx.get(inputs["b"])])}


def scale(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"y": ctx.get(inputs["x"]) * float(ctx.params.get("factor", 1.0))}


def fail_if_negative(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    x = ctx.get(inputs["x"])
    if (x < 0).any():
        raise ValueError(f"negative input at {int(np.argmax(x < 0))}")
    return {"y": x + 1}


def crash_if_negative(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    x = ctx.get(inputs["x"])
    if (x < 0).any():
        os._exit(3)  # a segfault or OOM kill looks the same to the runtime
    return {"y": x + 1}


def wrong_output(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"z": ctx.get(inputs["x"])}


def pid(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"y": ctx.get(inputs["x"]) + 0, "pid": os.getpid()}


def slow(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    import time

    time.sleep(float(ctx.params.get("seconds", 0.2)))
    return {"y": ctx.get(inputs["x"]) + 0}


def emit(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Reads every input, returns ``params.outputs`` (tiny arrays) with the scalars in ``params.scalars``
    (default 1): a stand-in for any spec's handler whose condition values a test chooses."""
    for ref in inputs.values():
        ctx.get(ref)
    scalars = ctx.params.get("scalars", {})
    return {o: (np.float64(scalars.get(o, 1.0)) if o in ctx.params.get("scalar_outputs", []) else np.zeros(2))
            for o in ctx.params["outputs"]}


def read_then_sleep(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Reads its input first, then computes (sleeps): a function whose inputs are fetched on time."""
    import time

    x = ctx.get(inputs["x"]) + 0
    time.sleep(float(ctx.params.get("seconds", 0.2)))
    return {"y": x}


def which_gpu(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Passes its input on and reports the GPU index it was placed on (-1: none)."""
    return {"y": ctx.get(inputs["x"]) + 0, "gpu": int(ctx.gpu[3:]) if ctx.gpu else -1}


GATE = threading.Semaphore(0)  # each release lets one call of ``gated`` through (in-process workers)


def gated(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Passes its input on once the test releases GATE (``executor="inproc"``: this very module)."""
    if not GATE.acquire(timeout=60):
        raise TimeoutError("gated: the test never released GATE")
    return {"y": ctx.get(inputs["x"]) + 0}


def sleep_for(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Sleeps the seconds its ``seconds`` input says (a function that hangs when asked to), then echoes ``x``."""
    import time

    time.sleep(float(ctx.get(inputs["seconds"])))
    return {"y": ctx.get(inputs["x"]) + 0}


def total_of(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The sum of ``x`` plus the sum of ``extra`` (float64)."""
    return {"total": np.float64(ctx.get(inputs["x"]).sum(dtype=np.float64) + ctx.get(inputs["extra"]).sum())}


def writable(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """1.0 if the input array it reads can be written, else 0.0 (inputs are read-only views)."""
    return {"writable": np.float64(ctx.get(inputs["x"]).flags.writeable)}


def draw(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """This worker's pid and a draw from numpy's global generator (forked workers must not share it)."""
    import time

    ctx.get(inputs["x"])
    time.sleep(0.2)  # concurrent calls spread over the workers
    return {"y": np.array([os.getpid(), np.random.randint(0, 2**31)], dtype=np.int64)}


def relay(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Passes its input on, with the process it ran in, and prints which function it ran as (a chain
    of them shows where each ran and whose log each line went to)."""
    print(f"relay ran as {ctx.function}")
    return {"y": np.array(ctx.get(inputs["x"]), copy=True), "pid": os.getpid()}


def denied(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Reads its input as a node that never heard of it would answer: access denied (an input whose
    node died before publishing it reads this way from another node)."""
    raise AccessDenied(DENIED_MESSAGE)
