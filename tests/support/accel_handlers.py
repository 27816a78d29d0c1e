"""Handlers that run a zoo model (``ctx.model``) for the in-storage accelerator tests (runtime.accel)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np


def score(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """logreg on the request's features: (N, 32) -> (N, 1)."""
    x = np.asarray(ctx.get(inputs["x"]), dtype=np.float32)
    return {"p": ctx.model(features=x)["prob"]}


def rescore(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """logreg again, on features made from the upstream scores (each row's score in all 32 columns)."""
    x = np.repeat(np.asarray(ctx.get(inputs["p"]), dtype=np.float32), 32, axis=1)
    return {"p": ctx.model(features=x)["prob"]}


def classify(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """resnet50 on the request's images: (N, 3, 64, 64) -> (N, 1000) logits."""
    return {"logits": ctx.model(image=np.asarray(ctx.get(inputs["img"]), dtype=np.float32))["logits"]}


# For the busy-drive test (in-process workers only): the first call holds its drive until GATE is set.
GATE = threading.Event()
CALLS: list[str] = []


def held_score(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    CALLS.append(ctx.invocation)
    if len(CALLS) == 1 and not GATE.wait(60):
        raise TimeoutError("the test never released the gate")
    return score(ctx, inputs)
