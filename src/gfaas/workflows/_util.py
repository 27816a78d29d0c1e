"""Small helpers the workflow handlers share: per-scale parameters and batched model calls."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.context import Context


def scaled(ctx: Context, key: str, default: Any = None) -> Any:
    """``ctx.params[key]``, where a mapping ``{small: .., full: ..}`` is resolved for ``ctx.scale``."""
    v = ctx.params.get(key, default)
    if isinstance(v, dict):
        if ctx.scale not in v:
            raise KeyError(f"param {key!r} of function {ctx.function!r} has no value for scale {ctx.scale!r}: {v}")
        return v[ctx.scale]
    return v


def run_model(model: Any, **feeds: np.ndarray) -> dict[str, np.ndarray]:
    """Call ``model(**feeds)``; when its inputs declare a fixed batch size (``model.info.dynamic_inputs``,
    else ``model.info.inputs``), feed
    the rows in chunks of that size (the last chunk padded by repeating its last row) and stitch the
    outputs back together."""
    n = len(next(iter(feeds.values())))
    first = next(iter(feeds))
    # the zoo's ``info.inputs`` holds example shapes (batch 1); ``dynamic_inputs`` says what is fixed
    declared = getattr(model.info, "dynamic_inputs", None) or model.info.inputs
    b = declared[first][0][0]
    if not isinstance(b, int) or b <= 0 or b == n:
        return {k: np.asarray(v) for k, v in model(**feeds).items()}
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, n, b):
        take = np.minimum(np.arange(start, start + b), n - 1)
        out = model(**{k: v[take] for k, v in feeds.items()})
        for k, v in out.items():
            parts.setdefault(k, []).append(np.asarray(v)[: min(b, n - start)])
    return {k: np.concatenate(v) for k, v in parts.items()}
