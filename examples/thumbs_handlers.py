"""Handlers of examples/embedded_runtime.py: plain functions a worker process imports by name."""

from __future__ import annotations

from typing import Any

import numpy as np


def shrink(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """Average 4x4 pixel blocks: (H, W, 3) uint8 -> (H/4, W/4, 3) float32 in [0, 1]."""
    img = ctx.get(inputs["image"])  # a read-only view of shared memory: no copy
    h, w = img.shape[0] // 4 * 4, img.shape[1] // 4 * 4
    blocks = img[:h, :w].reshape(h // 4, 4, w // 4, 4, 3).astype(np.float32)
    small = blocks.mean(axis=(1, 3)) / 255.0
    # A scalar output: conditions in the spec read it (``when``).
    return {"small": small, "brightness": float(small.mean())}


def histogram(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    small = ctx.get(inputs["small"])
    counts, _ = np.histogram(small, bins=int(ctx.params.get("bins", 4)), range=(0.0, 1.0))
    return {"counts": counts.astype(np.int64)}


def brighten(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    small = ctx.get(inputs["small"])
    return {"fixed": np.clip(small * 1.5, 0.0, 1.0)}
