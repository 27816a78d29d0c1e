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

import msgspec
import numpy as np

from ..native import choose, native_class
from .context import Context
from .spec import TypeDecl

log = logging.getLogger("gfaas.runtime")

def chosen_core() -> str:
    """``native`` or ``python``: what ``GFAAS_WORKER_CORE`` asks for, native by default where built."""
    return choose("GFAAS_WORKER_CORE", native_class("WorkerCore") is not None, "WorkerCore")


def core_for(host: Any, value: type, done: type, carried_array: Any, scalars: tuple[type, ...],
             dtypes: dict[str, Any], need_data: Any) -> Any:
    """A native core running ``host``'s common tasks, or None where its function is not a plain CPU one
    (a CUDA device, page merging, no attached connection for NeedData): the Python path runs all.
    ``dtypes``: the value dtypes the Python path has checked (worker._DTYPES), which the core reads;
    ``need_data``: worker._need_data, for the chains it runs (WorkerCore.follow)."""
    cls = native_class("WorkerCore")
    if cls is None or host.cuda is not None or host.dedup != "off" or host.link is None:
        return None
    fn = host.fn
    if any(type(decl) is not TypeDecl for decl in fn.outputs.values()):
        return None
    # What Context.__init__ sets that is the same for every task of this function: the core sets these
    # slots itself, then invocation, params (a dict of its own) and _getter (tests/unit/test_worker_native.py
    # compares its contexts with Context's own, slot by slot).
    ctx_slots = {"workflow": host.workflow, "function": fn.name, "device": host.device, "gpu": host.gpu,
                 "scale": host.scale, "log": host._fn_log, "get_s": 0.0, "_model": host.model, "_merger": None,
                 "_device_getter": None}
    return cls(host, {
        "handler": host.handler, "new": object.__new__, "context": Context, "ctx_slots": ctx_slots,
        "params": dict(fn.params), "decls": {name: (decl.np_dtype, decl.shape) for name, decl in fn.outputs.items()},
        "dtypes": dtypes, "frombuffer": np.frombuffer,
        "ndarray": np.ndarray, "scalars": scalars, "asarray": np.asarray, "value": value, "done": done,
        "carried_array": carried_array, "monotonic": time.monotonic, "need_data": need_data,
        "replace": msgspec.structs.replace,
    })
