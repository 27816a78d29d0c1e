"""Handlers for the runtime's GPU tests: they report where they ran and pass data on device when asked."""

from __future__ import annotations

from typing import Any

import numpy as np


def where(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """y = x + 1, and where this function ran: its GPU's ordinal (-1: none) and whether it computes on CUDA."""
    x = ctx.get(inputs["x"])
    return {"y": x + 1, "gpu": np.int64(int(ctx.gpu[3:]) if ctx.gpu else -1),
            "cuda": np.int64(ctx.device.startswith("cuda"))}


def on_device(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The input as the function's GPU sees it, passed on unchanged (a device tensor on a GPU)."""
    return {"y": ctx.get(inputs["x"], device=True)}
