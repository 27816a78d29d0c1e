"""Small helpers the workflow handlers share: per-scale parameters, batched model calls, and joining
arrays that may live on a GPU (:class:`~gfaas.dataplane.device_array.DeviceArray`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dataplane.device_array import DeviceArray
from ..runtime.context import Context


def scaled(ctx: Context, key: str, default: Any = None) -> Any:
    """``ctx.params[key]``, where a mapping ``{small: .., full: ..}`` is resolved for ``ctx.scale``."""
    v = ctx.params.get(key, default)
    if isinstance(v, dict):
        if ctx.scale not in v:
            raise KeyError(f"param {key!r} of function {ctx.function!r} has no value for scale {ctx.scale!r}: {v}")
        return v[ctx.scale]
    return v


def concat(parts: list[Any]) -> Any:
    """``np.concatenate`` along the first axis, on the GPU when any part is a DeviceArray there."""
    if any(isinstance(p, DeviceArray) for p in parts):
        import torch

        dev = next(p for p in parts if isinstance(p, DeviceArray)).tensor.device
        tensors = [p.tensor if isinstance(p, DeviceArray) else torch.from_numpy(np.array(p)) for p in parts]
        return DeviceArray(torch.cat([t.to(dev) for t in tensors]))
    return np.concatenate(parts, axis=0)


def run_model(model: Any, *, keep_on_device: bool = False, **feeds: Any) -> dict[str, Any]:
    """Call ``model(**feeds)``; when its inputs declare a fixed batch size (``model.info.dynamic_inputs``,
    else ``model.info.inputs``), feed
    the rows in chunks of that size (the last chunk padded by repeating its last row) and stitch the
    outputs back together.

    ``keep_on_device``: a model on a GPU leaves its outputs there (``Model.run_device``), so a handler
    that returns them passes them on device to device; elsewhere the outputs are host arrays."""
    call = model.run_device if keep_on_device and getattr(model, "engine", "") == "torch" else model
    n = len(next(iter(feeds.values())))
    first = next(iter(feeds))
    # the zoo's ``info.inputs`` holds example shapes (batch 1); ``dynamic_inputs`` says what is fixed
    declared = getattr(model.info, "dynamic_inputs", None) or model.info.inputs
    b = declared[first][0][0]
    if not isinstance(b, int) or b <= 0 or b == n:
        return {k: v if isinstance(v, DeviceArray) else np.asarray(v) for k, v in call(**feeds).items()}
    parts: dict[str, list[Any]] = {}
    for start in range(0, n, b):
        take = np.minimum(np.arange(start, start + b), n - 1)
        out = call(**{k: v[take] for k, v in feeds.items()})
        for k, v in out.items():
            parts.setdefault(k, []).append((v if isinstance(v, DeviceArray) else np.asarray(v))[: min(b, n - start)])
    return {k: concat(v) for k, v in parts.items()}
