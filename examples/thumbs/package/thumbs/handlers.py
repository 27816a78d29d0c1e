"""Handlers of the thumbs workflow: each takes the call's context and its input references, reads the
inputs through the data plane (read-only views of shared memory, no copy) and returns arrays, which its
worker stores for the functions that read them next."""

from __future__ import annotations

from typing import Any

import numpy as np

SIZE = 32  # the classifier's input is 32 x 32 (models/classifier.onnx, made by make_model.py)


def resize(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """An RGB image (H, W, 3) uint8 of any size -> (1, 3, 32, 32) float32 in [0, 1], by block means."""
    img = ctx.get(inputs["image"])
    h, w = img.shape[0] // SIZE * SIZE, img.shape[1] // SIZE * SIZE
    if h == 0 or w == 0:
        raise ValueError(f"the image is {img.shape[0]}x{img.shape[1]}; give at least {SIZE}x{SIZE} pixels")
    blocks = img[:h, :w].reshape(SIZE, h // SIZE, SIZE, w // SIZE, 3).astype(np.float32)
    small = blocks.mean(axis=(1, 3)) / 255.0  # (32, 32, 3)
    print(f"resized {img.shape[1]}x{img.shape[0]} to {SIZE}x{SIZE}")  # kept in the function's log
    return {"small": np.ascontiguousarray(small.transpose(2, 0, 1)[None])}


def classify(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """The package's own ONNX model on the thumbnail: the most likely class, its name's index and score."""
    x = ctx.get(inputs["x"])
    logits = ctx.model(x=x)["logits"][0].astype(np.float64)  # loaded once per warm worker
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    label = int(probs.argmax())
    names = ctx.params.get("labels") or []  # the spec's params: {labels: [...]}, if it gives them
    print(f"class {label} ({names[label] if label < len(names) else 'unnamed'}) with p={probs[label]:.3f}")
    return {"label": np.int64(label), "probs": probs.astype(np.float32)}
