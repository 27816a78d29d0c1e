"""The worker's native per-task path (``gfaas_native.WorkerCore``, native/src/worker.rs), and its switch.

A warm worker spends most of a tiny task in the framework around the handler, not in it: the native
core runs the common case (a lazy task whose inputs all travel in the task, on a CPU function) from
the handler's ``Context`` to the ``Done``, and hands anything else to :class:`FunctionHost`'s Python
path, which stays the reference (tests/unit/test_worker_native.py replays the same tasks into both).

``GFAAS_WORKER_CORE``, read once when a worker starts: ``native`` (the default where the extension is
built), ``python`` (the reference alone).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from ..native import choose, native_class
from .context import Context

log = logging.getLogger("gfaas.runtime")

def chosen_core() -> str:
    """``native`` or ``python``: what ``GFAAS_WORKER_CORE`` asks for, native by default where built."""
    return choose("GFAAS_WORKER_CORE", native_class("WorkerCore") is not None, "WorkerCore")


def core_for(host: Any, value: type, done: type, carried_array: Any, scalars: tuple[type, ...]) -> Any:
    """A native core running ``host``'s common tasks, or None where its function is not a plain CPU one
    (a CUDA device, page merging, no attached connection for NeedData): the Python path runs all."""
    cls = native_class("WorkerCore")
    if cls is None or host.cuda is not None or host.dedup != "off" or host.link is None:
        return None
    fn = host.fn
    ctx_kwargs = {"workflow": host.workflow, "function": fn.name, "params": fn.params, "model": host.model,
                  "device": host.device, "scale": host.scale, "gpu": host.gpu, "merger": None,
                  "device_getter": None, "logger": host._fn_log}
    return cls(host, {
        "handler": host.handler, "context": Context, "ctx_kwargs": ctx_kwargs,
        "fits": {name: decl.fits for name, decl in fn.outputs.items()},
        "ndarray": np.ndarray, "scalars": scalars, "asarray": np.asarray, "value": value, "done": done,
        "carried_array": carried_array, "monotonic": time.monotonic,
    })
