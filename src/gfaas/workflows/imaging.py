"""Numpy image operations shared by the reference workflows: resizing, normalisation, 3x3 filters,
crops, softmax/top-k and the segmentation palette.

Images are channel-last (``[..., H, W, C]``) until they are handed to a model, which takes
``[N, 3, H, W]`` float32 (:func:`to_model_input`). Every function here is pure and deterministic;
each has an oracle test in ``tests/unit/test_workflows.py``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# ImageNet statistics: the normalisation torchvision-style classifiers and detectors are trained with.
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


# ---- resizing ---------------------------------------------------------------------------------------
def _taps_bilinear(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Source indices and weights ``[n_out, 2]`` of linear interpolation with half-pixel centres."""
    src = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
    src = np.clip(src, 0.0, n_in - 1)
    i0 = np.floor(src).astype(np.int64)
    i1 = np.minimum(i0 + 1, n_in - 1)
    t = src - i0
    return np.stack([i0, i1], axis=1), np.stack([1.0 - t, t], axis=1)


def _taps_area(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Source indices and weights of box averaging: output ``i`` averages input interval
    ``[i * s, (i + 1) * s)`` with ``s = n_in / n_out``, partial pixels weighted by their overlap."""
    s = n_in / n_out
    taps = math.ceil(s) + 1
    lo = np.arange(n_out, dtype=np.float64) * s
    first = np.floor(lo).astype(np.int64)
    idx = first[:, None] + np.arange(taps)[None, :]
    left = np.maximum(lo[:, None], idx)
    right = np.minimum(lo[:, None] + s, idx + 1)
    wt = np.clip(right - left, 0.0, None) / s
    idx = np.minimum(idx, n_in - 1)  # taps past the end carry zero weight
    return idx, wt


def _resample(x: np.ndarray, n_out: int, axis: int, method: str) -> np.ndarray:
    n_in = x.shape[axis]
    if n_in == n_out:
        return x
    if method == "nearest":
        idx = np.minimum(((np.arange(n_out) + 0.5) * (n_in / n_out)).astype(np.int64), n_in - 1)
        return np.take(x, idx, axis=axis)
    if method == "auto":
        method = "area" if n_out < n_in else "bilinear"
    if method == "bilinear":
        idx, wt = _taps_bilinear(n_in, n_out)
    elif method == "area":
        idx, wt = _taps_area(n_in, n_out)
    else:
        raise ValueError(f"resize method {method!r} is not nearest, bilinear, area or auto")
    shape = [1] * x.ndim
    shape[axis] = n_out
    out = np.zeros(x.shape[:axis] + (n_out,) + x.shape[axis + 1:], dtype=x.dtype)
    for k in range(idx.shape[1]):
        out += np.take(x, idx[:, k], axis=axis) * wt[:, k].astype(x.dtype).reshape(shape)
    return out


def resize(img: np.ndarray, height: int, width: int, method: str = "auto",
           channels_last: bool = True) -> np.ndarray:
    """Resize the two spatial axes of ``img`` to ``height`` x ``width``.

    ``img`` is ``[..., H, W, C]`` (``channels_last``) or ``[..., H, W]``. ``method`` is ``bilinear``
    (half-pixel centres, edge clamped: OpenCV's ``INTER_LINEAR``), ``area`` (box average with
    fractional overlaps), ``nearest``, or ``auto`` (area when shrinking an axis, bilinear when growing
    it). Non-nearest methods return float32 (float64 stays float64); nearest keeps the dtype.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"cannot resize to {height}x{width}")
    a = np.asarray(img)
    if method != "nearest" and a.dtype != np.float64:
        a = a.astype(np.float32)
    h_axis, w_axis = (a.ndim - 3, a.ndim - 2) if channels_last else (a.ndim - 2, a.ndim - 1)
    if h_axis < 0:
        raise ValueError(f"image of shape {a.shape} has no spatial axes")
    if a.shape[h_axis] == 0 or a.shape[w_axis] == 0:
        raise ValueError(f"cannot resize an empty image of shape {a.shape}")
    return _resample(_resample(a, height, h_axis, method), width, w_axis, method)


def to_model_input(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """``[N, H, W, 3]`` images in [0, 1] (or uint8) -> ``[N, 3, height, width]`` float32, resized and
    normalised with the ImageNet mean and standard deviation."""
    x = np.asarray(images)
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    x = resize(x, height, width)
    x = (x - MEAN) / STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2), dtype=np.float32)


def model_image_hw(model: Any, fallback: tuple[int, int] | None = None, name: str = "image") -> tuple[int, int]:
    """The spatial size a model expects for its ``image`` input, from ``model.info.inputs``.

    A dynamic dimension (-1, None or a symbolic name) falls back to ``fallback``.
    """
    shape = model.info.inputs[name][0]
    h, w = shape[-2], shape[-1]
    if isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0:
        return int(h), int(w)
    if fallback is None:
        raise ValueError(f"model input {name!r} has dynamic size {list(shape)} and no fallback was given")
    return fallback


# ---- 3x3 filters ------------------------------------------------------------------------------------
def _neighbours(img: np.ndarray) -> list[np.ndarray]:
    """The nine 3x3-neighbourhood shifts of ``[..., H, W, C]``, edges replicated."""
    h, w = img.shape[-3], img.shape[-2]
    pad = [(0, 0)] * (img.ndim - 3) + [(1, 1), (1, 1), (0, 0)]
    p = np.pad(img, pad, mode="edge")
    return [p[..., dy:dy + h, dx:dx + w, :] for dy in range(3) for dx in range(3)]


# Compare-exchange pairs of a 19-step selection network whose slot 4 ends up holding the median of
# nine values (Paeth's median-of-9 network, Graphics Gems; checked against np.median in the tests).
_MEDIAN9 = ((1, 2), (4, 5), (7, 8), (0, 1), (3, 4), (6, 7), (1, 2), (4, 5), (7, 8), (0, 3), (5, 8), (4, 7),
            (3, 6), (1, 4), (2, 5), (4, 7), (4, 2), (6, 4), (4, 2))


def median3x3(img: np.ndarray) -> np.ndarray:
    """Per-channel 3x3 median filter of ``[..., H, W, C]`` with replicated edges; keeps the dtype.

    Elementwise min/max over the nine shifted images (a selection network), a few times faster than
    sorting the neighbourhoods."""
    p = _neighbours(np.asarray(img))
    for i, j in _MEDIAN9:
        p[i], p[j] = np.minimum(p[i], p[j]), np.maximum(p[i], p[j])
    return np.ascontiguousarray(p[4])


def gaussian3x3(img: np.ndarray) -> np.ndarray:
    """Per-channel 3x3 Gaussian blur (kernel ``[1, 2, 1]^T [1, 2, 1] / 16``) of ``[..., H, W, C]`` with
    replicated edges; float32 out."""
    a = np.asarray(img).astype(np.float32)
    pad = [(0, 0)] * (a.ndim - 3) + [(1, 1), (1, 1), (0, 0)]
    p = np.pad(a, pad, mode="edge")
    rows = (p[..., :-2, :, :] + 2 * p[..., 1:-1, :, :] + p[..., 2:, :, :]) / 4
    return (rows[..., :-2, :] + 2 * rows[..., 1:-1, :] + rows[..., 2:, :]) / 4


# ---- crops ------------------------------------------------------------------------------------------
def crop_resize(frame: np.ndarray, box: np.ndarray, height: int, width: int) -> np.ndarray:
    """The pixels of ``frame`` (``[H, W, C]``) under ``box`` (x1, y1, x2, y2 in pixels, clipped to the
    frame, at least one pixel) resized to ``height`` x ``width``; float32."""
    fh, fw = frame.shape[:2]
    x1 = min(max(int(math.floor(box[0])), 0), fw - 1)
    y1 = min(max(int(math.floor(box[1])), 0), fh - 1)
    x2 = max(min(int(math.ceil(box[2])), fw), x1 + 1)
    y2 = max(min(int(math.ceil(box[3])), fh), y1 + 1)
    return resize(frame[y1:y2, x1:x2], height, width)


# ---- scores -----------------------------------------------------------------------------------------
def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax; float32 in, float32 out (float64 stays float64)."""
    a = np.asarray(x)
    if a.dtype != np.float64:
        a = a.astype(np.float32)
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def top_k(probs: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values of a 1-D array, largest first, ties broken by lower index."""
    p = np.asarray(probs)
    return np.argsort(-p, kind="stable")[:k].astype(np.int64)


# ---- segmentation palette ---------------------------------------------------------------------------
def palette(n: int = 256) -> np.ndarray:
    """The PASCAL VOC colour map: ``[n, 3]`` uint8, class 0 black, class 1 (128, 0, 0), ...

    Class ``c``'s bits are dealt round-robin to red, green and blue, most significant output bit first.
    """
    out = np.zeros((n, 3), dtype=np.uint8)
    for c in range(n):
        rgb = [0, 0, 0]
        v = c
        for bit in range(8):
            for ch in range(3):
                rgb[ch] |= ((v >> ch) & 1) << (7 - bit)
            v >>= 3
        out[c] = rgb
    return out


def colourise(classes: np.ndarray, frames: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """Blend the palette colour of each non-background class (``classes`` ``[..., H, W]``, 0 = background)
    into ``frames`` (uint8 ``[..., H, W, 3]``): ``round((1 - alpha) * frame + alpha * colour)``.
    Background pixels keep the frame's colour. Returns uint8."""
    cls = np.asarray(classes)
    pal = palette(int(cls.max(initial=0)) + 1).astype(np.float32)
    f = np.asarray(frames).astype(np.float32)
    blend = (1.0 - alpha) * f + alpha * pal[cls]
    out = np.where((cls > 0)[..., None], blend, f)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
