"""Traffic monitoring (condition): decode -> preprocess -> detect -> recognise people / vehicles.

The detector (YOLOv3-tiny) finds people and vehicles in every other frame of a clip; the crops of each
kind go to their own ResNet-50, and each recogniser runs only when its kind was seen at all
(``when: detect.num_persons > 0`` / ``detect.num_vehicles > 0``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dataplane.device_array import DeviceArray
from ..runtime.context import Context
from ._util import run_model, scaled
from .detection import PERSON, VEHICLES, DetectParams, crops, detect_in_frames
from .imaging import model_image_hw, resize, softmax, to_model_input
from .scenes import FULL_HW, SMALL_HW, check_scale, road_frames

SPEC = "traffic"
FRAMES = 4


def decode(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """Keep every ``stride``-th frame of the clip, as float32 in [0, 1]."""
    video = ctx.get(inputs["video"])
    stride = int(ctx.params.get("stride", 2))
    return {"frames": video[::stride].astype(np.float32) / np.float32(255.0)}


def preprocess(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """Resize the frames to the detector's input and normalise them: ``[T, 3, S, S]`` float32."""
    frames = ctx.get(inputs["frames"])
    size = int(scaled(ctx, "size"))
    return {"batch": to_model_input(frames, size, size)}


def detect(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """YOLO over the batch, then thresholds, class-wise NMS and the saliency gate; crops of people and
    of vehicles cut from the full-resolution frames and resized for the recognisers."""
    frames = ctx.get(inputs["frames"])
    batch = ctx.get(inputs["batch"])
    p = DetectParams.from_params(ctx.params)
    dets = detect_in_frames(ctx.model, frames, batch, ((PERSON,), VEHICLES), p)
    size = int(scaled(ctx, "crop_size"))
    is_person = dets[:, 6] == PERSON
    return {
        "detections": dets,
        "person_crops": crops(frames, dets[is_person], size),
        "vehicle_crops": crops(frames, dets[~is_person], size),
        "num_persons": np.int64(np.count_nonzero(is_person)),
        "num_vehicles": np.int64(np.count_nonzero(~is_person)),
    }


def recognise(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """ResNet-50 over the crops: the top class of each and its probability."""
    return classify_crops(ctx, ctx.get(inputs["crops"], device=True))


def classify_crops(ctx: Context, batch: np.ndarray) -> dict[str, Any]:
    """Labels (int64 ``[N]``) and top probabilities (float32 ``[N]``) of normalised ``[N, 3, h, w]`` crops,
    resized first if the model takes another size."""
    if len(batch) == 0:
        return {"labels": np.zeros(0, dtype=np.int64), "top_prob": np.zeros(0, dtype=np.float32)}
    hw = model_image_hw(ctx.model)
    if tuple(batch.shape[-2:]) != hw:
        batch = resize(np.asarray(batch), *hw, channels_last=False)
    # Crops on a GPU (DeviceArray) feed the model where they are; only the logits come to the host.
    x = batch if isinstance(batch, DeviceArray) else np.ascontiguousarray(batch, dtype=np.float32)
    probs = softmax(run_model(ctx.model, image=x)["logits"])
    labels = probs.argmax(axis=1)
    return {"labels": labels.astype(np.int64), "top_prob": probs[np.arange(len(probs)), labels].astype(np.float32)}


def make_inputs(seed: int = 0, scale: str = "small") -> dict[str, np.ndarray]:
    """A road clip with 2-4 vehicles and 1-3 pedestrians moving: uint8 ``[4, H, W, 3]``, 1080p at full
    scale, 96x128 at small."""
    hw = FULL_HW if check_scale(scale) == "full" else SMALL_HW
    rng = np.random.default_rng([seed, 1])
    return {"video": road_frames(seed, FRAMES, hw, vehicles=int(rng.integers(2, 5)), persons=int(rng.integers(1, 4)))}
