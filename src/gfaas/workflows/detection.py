"""Object-detection post-processing for the YOLO functions: box conversion, IoU, greedy NMS, and
turning a detector's raw outputs into detections in frame pixels.

The zoo's detector has random weights, so its scores cannot tell an object from the road. Detections
are therefore also gated by a saliency test on the frame itself: the fraction of strongly coloured
pixels under the box (:func:`saturated_fraction`). The synthetic scenes paint objects in saturated
colours on a grey, unsaturated background, so an empty scene yields no detections and a scene with
objects yields a few, always the same ones for the same input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._util import run_model
from .imaging import crop_resize, model_image_hw, to_model_input

# COCO class indices (the 80-class order YOLO is trained with).
PERSON = 0
VEHICLES = (2, 3, 5, 7)  # car, motorcycle, bus, truck


def cxcywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    """``[..., 4]`` centre/size boxes -> corner boxes (x1, y1, x2, y2)."""
    b = np.asarray(boxes, dtype=np.float32)
    half = b[..., 2:4] / 2
    return np.concatenate([b[..., 0:2] - half, b[..., 0:2] + half], axis=-1)


def box_area(boxes: np.ndarray) -> np.ndarray:
    b = np.asarray(boxes)
    return np.clip(b[..., 2] - b[..., 0], 0, None) * np.clip(b[..., 3] - b[..., 1], 0, None)


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Intersection over union of one corner box with each of ``boxes`` (0 where the union is empty)."""
    b = np.asarray(boxes, dtype=np.float64)
    a = np.asarray(box, dtype=np.float64)
    iw = np.clip(np.minimum(a[2], b[:, 2]) - np.maximum(a[0], b[:, 0]), 0, None)
    ih = np.clip(np.minimum(a[3], b[:, 3]) - np.maximum(a[1], b[:, 1]), 0, None)
    inter = iw * ih
    union = box_area(a) + box_area(b) - inter
    out = np.zeros(len(b), dtype=np.float64)
    np.divide(inter, union, out=out, where=union > 0)
    return out


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy non-maximum suppression.

    Visits boxes by descending score (ties: lower index first) and keeps a box unless it overlaps an
    already kept box with IoU strictly above ``iou_threshold``. Returns the kept indices, in the order
    visited (int64).
    """
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if len(b) != len(s):
        raise ValueError(f"{len(b)} boxes but {len(s)} scores")
    order = np.argsort(-s, kind="stable")
    alive = np.ones(len(b), dtype=bool)
    keep: list[int] = []
    for pos, i in enumerate(order):
        if not alive[i]:
            continue
        keep.append(int(i))
        rest = order[pos + 1:]
        rest = rest[alive[rest]]
        if len(rest):
            alive[rest[iou(b[i], b[rest]) > iou_threshold]] = False
    return np.asarray(keep, dtype=np.int64)


def saturation_integral(frame: np.ndarray, threshold: float) -> np.ndarray:
    """Summed-area table ``[H+1, W+1]`` of the pixels whose saturation (max - min channel, frame in
    [0, 1]) exceeds ``threshold``."""
    f = np.asarray(frame, dtype=np.float32)
    sat = (f.max(axis=-1) - f.min(axis=-1)) > threshold
    table = np.zeros((sat.shape[0] + 1, sat.shape[1] + 1), dtype=np.int64)
    table[1:, 1:] = sat.cumsum(axis=0).cumsum(axis=1)
    return table


def saturated_fraction(table: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Fraction of saturated pixels under each integer-clipped corner box, from :func:`saturation_integral`."""
    h, w = table.shape[0] - 1, table.shape[1] - 1
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    x1 = np.clip(np.floor(b[:, 0]), 0, w).astype(np.int64)
    y1 = np.clip(np.floor(b[:, 1]), 0, h).astype(np.int64)
    x2 = np.clip(np.ceil(b[:, 2]), 0, w).astype(np.int64)
    y2 = np.clip(np.ceil(b[:, 3]), 0, h).astype(np.int64)
    count = table[y2, x2] - table[y1, x2] - table[y2, x1] + table[y1, x1]
    area = (x2 - x1) * (y2 - y1)
    out = np.zeros(len(b), dtype=np.float64)
    np.divide(count, area, out=out, where=area > 0)
    return out


@dataclass(frozen=True)
class DetectParams:
    """Thresholds of :func:`detect_objects` (all overridable through a function's ``params:``)."""

    score_threshold: float = 0.25  # minimum class score (the zoo's YOLO gives probabilities in [0, 1])
    iou_threshold: float = 0.45    # NMS overlap above which the lower-scored box is dropped
    min_side: float = 4.0          # boxes narrower or shorter than this many frame pixels are dropped
    max_side_frac: float = 0.5     # ... and so are boxes wider/taller than this fraction of the frame
    saturation: float = 0.25       # a pixel is "coloured" when max - min channel exceeds this
    min_coloured: float = 0.3      # a box needs at least this fraction of coloured pixels
    max_detections: int = 3        # per frame and class group, highest scores first

    @classmethod
    def from_params(cls, params: object) -> DetectParams:
        get = getattr(params, "get", None)
        if get is None:
            return cls()
        kw = {k: type(getattr(cls(), k))(get(k)) for k in cls.__dataclass_fields__ if get(k) is not None}
        return cls(**kw)


def detect_objects(boxes: np.ndarray, scores: np.ndarray, frame: np.ndarray, input_hw: tuple[int, int],
                   groups: Sequence[Sequence[int]], p: DetectParams = DetectParams()) -> np.ndarray:
    """One frame's detections from a detector's raw outputs.

    ``boxes`` ``[K, 4]`` are centre/size in detector-input pixels (the input was ``input_hw``, resized
    from ``frame`` ``[H, W, 3]`` in [0, 1]); ``scores`` ``[K, C]``. Only the classes listed in
    ``groups`` are considered (e.g. ``((0,), (2, 3, 5, 7))``: people, and vehicles of four kinds).
    Steps: each box takes its best class of interest; boxes are mapped to frame pixels and clipped;
    too small, too large, low-scoring or uncoloured boxes are dropped; class-wise greedy NMS; in each
    group the ``max_detections`` highest-scoring survivors are kept (one class with higher scores all
    round cannot crowd out another group). Returns ``[D, 6]`` float32 rows ``(x1, y1, x2, y2, score,
    class)`` sorted by descending score (ties: lower candidate index).
    """
    fh, fw = frame.shape[:2]
    ih, iw = input_hw
    cls_idx = np.asarray([c for g in groups for c in g], dtype=np.int64)
    s = np.asarray(scores, dtype=np.float32)[:, cls_idx]
    best = np.argmax(s, axis=1)
    score = s[np.arange(len(s)), best]
    label = cls_idx[best]
    xyxy = cxcywh_to_xyxy(boxes) * np.array([fw / iw, fh / ih, fw / iw, fh / ih], dtype=np.float32)
    xyxy = np.clip(xyxy, 0, np.array([fw, fh, fw, fh], dtype=np.float32))
    bw, bh = xyxy[:, 2] - xyxy[:, 0], xyxy[:, 3] - xyxy[:, 1]
    ok = ((bw >= p.min_side) & (bh >= p.min_side) & (bw <= p.max_side_frac * fw) & (bh <= p.max_side_frac * fh)
          & (score > p.score_threshold) & np.isfinite(score))
    cand = np.flatnonzero(ok)
    if len(cand):
        frac = saturated_fraction(saturation_integral(frame, p.saturation), xyxy[cand])
        cand = cand[frac >= p.min_coloured]
    kept: list[int] = []
    for group in groups:
        survivors: list[int] = []
        for c in group:
            members = cand[label[cand] == c]
            survivors.extend(int(i) for i in members[nms(xyxy[members], score[members], p.iou_threshold)])
        kept.extend(sorted(survivors, key=lambda i: (-float(score[i]), i))[:p.max_detections])
    kept_arr = np.asarray(sorted(kept, key=lambda i: (-float(score[i]), i)), dtype=np.int64)
    out = np.zeros((len(kept_arr), 6), dtype=np.float32)
    if len(kept_arr):
        out[:, :4] = xyxy[kept_arr]
        out[:, 4] = score[kept_arr]
        out[:, 5] = label[kept_arr]
    return out


def detect_in_frames(model: Any, frames: np.ndarray, batch: np.ndarray | None, groups: Sequence[Sequence[int]],
                     p: DetectParams) -> np.ndarray:
    """Run a YOLO ``model`` over ``frames`` (float ``[T, H, W, 3]`` in [0, 1]) and post-process each
    frame with :func:`detect_objects`. ``batch`` is the already prepared detector input; it is rebuilt
    from the frames when absent or of another size than the model takes. Returns ``[D, 7]`` float32
    rows ``(frame, x1, y1, x2, y2, score, class)``, frame by frame."""
    hw = model_image_hw(model)
    if batch is None or tuple(batch.shape[-2:]) != hw:
        batch = to_model_input(frames, *hw)
    if len(frames) == 0:
        return np.zeros((0, 7), dtype=np.float32)
    out = run_model(model, image=batch)
    rows = []
    for t in range(len(frames)):
        d = detect_objects(out["boxes"][t], out["scores"][t], frames[t], hw, groups, p)
        rows.append(np.concatenate([np.full((len(d), 1), t, dtype=np.float32), d], axis=1))
    return np.concatenate(rows, axis=0)


def crops(frames: np.ndarray, detections: np.ndarray, size: int) -> np.ndarray:
    """The detected regions of ``frames`` as classifier input: ``[D, 3, size, size]`` float32, normalised
    (``detections`` rows as returned by :func:`detect_in_frames`)."""
    if len(detections) == 0:
        return np.zeros((0, 3, size, size), dtype=np.float32)
    cut = np.stack([crop_resize(frames[int(d[0])], d[1:5], size, size) for d in detections])
    return to_model_input(cut, size, size)
