"""What a function handler sees: :class:`Context`.

A handler is a plain function ``handler(ctx, inputs) -> outputs``:

* ``inputs`` maps each input name of the function's spec to a reference (a :class:`~gfaas.DataRef`
  on the gfaas data plane, an opaque key on the host-centric baseline); ``ctx.get(ref)`` returns the
  array, read-only (zero-copy on the same node with gfaas). A function running on a GPU may ask
  for it there instead, ``ctx.get(ref, device=True)`` (docs/gpu.md).
* it returns a dict from output name to a numpy array, or to a Python/numpy scalar. Scalars are also
  reported to the invoker, which is how ``when:`` conditions of downstream edges are evaluated.

The worker builds one context per invocation; ``ctx.model`` is loaded once per warm worker and
shared by the invocations it serves. Time spent inside ``ctx.get`` is accounted as data passing,
the rest of the handler as compute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError

Getter = Callable[[Any], np.ndarray]


class Context:
    """The per-invocation view a handler gets of the platform."""

    __slots__ = ("_device_getter", "_getter", "_merger", "_model", "device", "function", "get_s", "gpu", "invocation",
                 "log", "params", "scale", "workflow")

    def __init__(self, *, workflow: str, function: str, invocation: str, getter: Getter,
                 params: Mapping[str, Any] | None = None, model: Any = None, device: str = "cpu",
                 scale: str = "small", gpu: str = "", merger: Callable[[Any], int] | None = None,
                 device_getter: Callable[[Any], Any] | None = None, logger: logging.Logger | None = None) -> None:
        self.workflow = workflow
        self.function = function
        self.invocation = invocation
        self.params: Mapping[str, Any] = dict(params or {})
        self.device = device
        self.gpu = gpu  # the GPU the runtime placed this function on ("" on a CPU-only node)
        self.scale = scale
        self.log = logger or logging.getLogger(f"gfaas.fn.{workflow}.{function}")
        self.get_s = 0.0  # seconds spent fetching inputs (data passing, not compute)
        self._getter = getter
        self._model = model
        self._merger = merger
        self._device_getter = device_getter

    def get(self, ref: Any, device: bool = False) -> Any:
        """The array behind an input reference (read-only; copy it before writing).

        ``device=True``: on a function that runs on a GPU (``ctx.device`` is ``cuda:K``), the input
        on that GPU, as a :class:`~gfaas.dataplane.device_array.DeviceArray` (a torch tensor;
        ``np.asarray`` still reads it); the node delivers it there (from another function's GPU
        output by CUDA IPC, without a host trip). Elsewhere the host array, as without it."""
        t0 = time.perf_counter()
        try:
            if device and self._device_getter is not None:
                return self._device_getter(ref)
            return self._getter(ref)
        finally:
            self.get_s += time.perf_counter() - t0

    def merge(self, obj: Any) -> int:
        """Hint that ``obj`` (a numpy array, buffer or CPU tensor this worker keeps, such as weights it
        built) holds content other warm workers of its sharing domain hold too: its whole pages are
        marked mergeable and the node merges them with identical pages within about a second
        (:mod:`gfaas.dedup`, docs/dedup.md). A page written later is copied back, for this worker only.

        Returns the bytes marked (whole pages inside ``obj``; 0 when the runtime runs with page
        merging off, ``RuntimeConfig(dedup="off")``, since a hint is advice, never a requirement)."""
        if self._merger is None:
            self.log.debug("ctx.merge: page merging is off in this runtime (RuntimeConfig.dedup); nothing marked")
            return 0
        return self._merger(obj)

    @property
    def model(self) -> Any:
        """The function's model (``model:`` in the spec), loaded once per warm worker."""
        if self._model is None:
            raise ConfigError(
                f"function {self.function!r} of workflow {self.workflow!r} uses ctx.model but its spec names "
                "no model; add `model: NAME` (see `gfaas.models.names()`) to the function"
            )
        return self._model


def in_process_context(arrays: Mapping[str, np.ndarray], *, workflow: str = "test", function: str = "fn",
                       params: Mapping[str, Any] | None = None, model: Any = None,
                       scale: str = "small") -> tuple[Context, dict[str, str]]:
    """A context over in-memory arrays, for running a handler without any platform (tests, notebooks).

    Returns ``(ctx, inputs)`` where ``inputs[name]`` is the reference to pass for ``arrays[name]``.
    """
    store = {f"mem:{name}": np.asarray(a) for name, a in arrays.items()}

    def getter(ref: Any) -> np.ndarray:
        try:
            view = store[ref].view()
        except KeyError:
            raise ConfigError(f"unknown in-process reference {ref!r}; known: {sorted(store)}") from None
        view.flags.writeable = False
        return view

    ctx = Context(workflow=workflow, function=function, invocation="local", getter=getter, params=params,
                  model=model, scale=scale)
    return ctx, {name: f"mem:{name}" for name in arrays}
