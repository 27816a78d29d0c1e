"""Image classification ensemble (fan-out, then fan-in): denoise -> ResNet-50, EfficientNet-B0 and
ViT-B/16 in parallel -> aggregate (mean of the three softmax distributions, top 5)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dataplane.device_array import DeviceArray
from ..runtime.context import Context
from ._util import run_model
from .imaging import gaussian3x3, model_image_hw, softmax, to_model_input, top_k
from .scenes import FULL_HW, SMALL_HW, check_scale, photo

SPEC = "image"
MEMBERS = ("resnet", "effnet", "vit")


def denoise(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """3x3 Gaussian blur; float32 ``[H, W, 3]`` in [0, 1]."""
    img = ctx.get(inputs["image"])
    return {"image": gaussian3x3(img) / np.float32(255.0)}


def classify(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """One ensemble member: the image resized to this model's input, its 1000 class logits."""
    img = ctx.get(inputs["image"])
    x = to_model_input(img[None], *model_image_hw(ctx.model))
    logits = run_model(ctx.model, image=x, keep_on_device=True)["logits"][0]  # on a GPU, left there
    return {"logits": logits if isinstance(logits, DeviceArray) else np.asarray(logits, dtype=np.float32)}


def ensemble(logits: list[np.ndarray], weights: list[float] | None = None) -> np.ndarray:
    """Weighted mean (equal weights by default) of the members' softmax distributions; sums to 1."""
    w = np.ones(len(logits)) if weights is None else np.asarray(weights, dtype=np.float64)
    if len(w) != len(logits) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"ensemble weights {list(w)} must be {len(logits)} non-negative numbers, not all 0")
    probs = np.stack([softmax(np.asarray(lg, dtype=np.float64)) for lg in logits])
    return ((w / w.sum()) @ probs).astype(np.float32)


def aggregate(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """Ensemble the three members (``params.weights``, optional) and report the top 5 classes."""
    probs = ensemble([ctx.get(inputs[f"logits_{m}"]) for m in MEMBERS], ctx.params.get("weights"))
    top = top_k(probs, 5)
    return {"probs": probs, "top5": top, "top5_prob": probs[top]}


def make_inputs(seed: int = 0, scale: str = "small") -> dict[str, np.ndarray]:
    """One noisy photo-like image: uint8 ``[H, W, 3]``, 1080p at full scale, 96x128 at small."""
    return {"image": photo(seed, FULL_HW if check_scale(scale) == "full" else SMALL_HW)}
