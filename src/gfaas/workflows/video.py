"""Video processing (fan-in): split a clip into four chunks, detect faces in each chunk in parallel
(four YOLO functions), recognise all faces together (one ResNet-50 reading the four crop sets)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.context import Context
from ._util import concat, scaled
from .detection import DetectParams, crops, detect_in_frames
from .scenes import HD_HW, SMALL_HW, check_scale, face_frames
from .traffic import classify_crops

SPEC = "video"
CHUNKS = 4
FRAMES = 8
FACE_CLASS = 0  # the detector has no face class; this COCO index (person) stands in for it


def split(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """Four contiguous chunks of the clip's frames (sizes differ by at most one)."""
    clip = ctx.get(inputs["clip"])
    return {f"chunk_{i}": np.ascontiguousarray(c) for i, c in enumerate(np.array_split(clip, CHUNKS))}


def detect_faces(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """YOLO over one chunk; detections of the face class become normalised crops for recognition."""
    frames = ctx.get(inputs["chunk"]).astype(np.float32) / np.float32(255.0)
    p = DetectParams.from_params(ctx.params)
    face = int(ctx.params.get("face_class", FACE_CLASS))
    dets = detect_in_frames(ctx.model, frames, None, ((face,),), p)
    return {"detections": dets, "crops": crops(frames, dets, int(scaled(ctx, "crop_size"))),
            "num_faces": np.int64(len(dets))}


def recognise(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """ResNet-50 over the faces of all chunks, in chunk order; ``per_chunk`` counts them per chunk."""
    parts = [ctx.get(inputs[f"crops_{i}"], device=True) for i in range(CHUNKS)]  # on its GPU, if it has one
    out = classify_crops(ctx, concat(parts))
    out["per_chunk"] = np.array([len(p) for p in parts], dtype=np.int64)
    return out


def make_inputs(seed: int = 0, scale: str = "small") -> dict[str, np.ndarray]:
    """A clip of 8 frames with 2-3 moving faces: uint8 ``[8, H, W, 3]``, 720p at full scale, 96x128 at small."""
    hw = HD_HW if check_scale(scale) == "full" else SMALL_HW
    rng = np.random.default_rng([seed, 3])
    return {"clip": face_frames(seed, FRAMES, hw, faces=int(rng.integers(2, 4)))}
