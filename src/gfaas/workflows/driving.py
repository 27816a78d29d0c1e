"""Autonomous driving (sequence): denoise -> segment (FCN-ResNet50) -> colour.

The camera frames carry salt-and-pepper noise, removed by a 3x3 median filter; the segmenter's
per-pixel class scores become a class map (argmax) that is painted with the PASCAL VOC palette and
blended over the frames.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dataplane.device_array import DeviceArray
from ..runtime.context import Context
from ._util import run_model
from .imaging import colourise, gaussian3x3, median3x3, model_image_hw, resize, to_model_input
from .scenes import FULL_HW, SMALL_HW, check_scale, road_frames

SPEC = "driving"
FRAMES = 4


def denoise(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """3x3 median filter (``params.filter: median``, the default) or 3x3 Gaussian blur, per channel."""
    frames = ctx.get(inputs["frames"])
    kind = ctx.params.get("filter", "median")
    if kind == "median":
        out = median3x3(frames)
    elif kind == "gaussian":
        out = np.clip(np.rint(gaussian3x3(frames)), 0, 255).astype(np.uint8)
    else:
        raise ValueError(f"filter {kind!r} is not median or gaussian")
    return {"frames": out}


def segment(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """FCN over the frames resized to the model's input size (``info.inputs``; 224x224 at full scale):
    per-class logits ``[T, 21, h, w]``."""
    frames = ctx.get(inputs["frames"])
    hw = model_image_hw(ctx.model)
    if len(frames) == 0:
        return {"logits": np.zeros((0, 21, *hw), dtype=np.float32)}
    # On a GPU the logits stay there: colour reads them through the node (docs/gpu.md).
    logits = run_model(ctx.model, image=to_model_input(frames, *hw), keep_on_device=True)["logits"]
    return {"logits": logits if isinstance(logits, DeviceArray) else np.ascontiguousarray(logits, dtype=np.float32)}


def colour(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """Class map = argmax over the logits, scaled to the frames (nearest), painted and blended
    (``params.alpha``, default 0.5) over the denoised frames."""
    logits = ctx.get(inputs["logits"])
    frames = ctx.get(inputs["frames"])
    classes = logits.argmax(axis=1).astype(np.uint8)
    classes = resize(classes, frames.shape[1], frames.shape[2], method="nearest", channels_last=False)
    alpha = float(ctx.params.get("alpha", 0.5))
    return {"overlay": colourise(classes, frames, alpha), "classes": np.ascontiguousarray(classes)}


def make_inputs(seed: int = 0, scale: str = "small") -> dict[str, np.ndarray]:
    """4 road frames with moving vehicles and pedestrians plus 2% salt-and-pepper noise: uint8
    ``[4, H, W, 3]``, 1080p at full scale, 96x128 at small."""
    hw = FULL_HW if check_scale(scale) == "full" else SMALL_HW
    rng = np.random.default_rng([seed, 2])
    return {"frames": road_frames(seed, FRAMES, hw, vehicles=int(rng.integers(1, 4)), persons=int(rng.integers(0, 3)),
                                  salt_pepper=0.02)}
