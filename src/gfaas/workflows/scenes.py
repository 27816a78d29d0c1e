"""Deterministic synthetic inputs: road scenes with moving vehicles and pedestrians, rooms with moving
faces, and photo-like images.

Backgrounds are grey or pale (unsaturated); objects are painted in saturated colours, which is what
the detectors' saliency gate keys on (see :mod:`gfaas.workflows.detection`). Everything is drawn from
``numpy.random.default_rng(seed)``, so one seed always gives the same pixels.
"""

from __future__ import annotations

import numpy as np

# Sizes per scale: frames (height, width) and frame counts.
SMALL_HW = (96, 128)
FULL_HW = (1080, 1920)
HD_HW = (720, 1280)

VEHICLE_COLOURS = np.array([[200, 30, 30], [30, 60, 200], [230, 200, 20], [20, 160, 60], [240, 120, 10]],
                           dtype=np.float32)
CLOTHES_COLOURS = np.array([[220, 40, 160], [40, 180, 220], [250, 90, 40], [120, 40, 200]], dtype=np.float32)
SKIN = np.array([225, 170, 120], dtype=np.float32)


def check_scale(scale: str) -> str:
    if scale not in ("small", "full"):
        raise ValueError(f"scale {scale!r} is not 'small' or 'full'")
    return scale


def _grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    return yy, xx


def _ellipse(yy: np.ndarray, xx: np.ndarray, cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    return ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0


def _rect(yy: np.ndarray, xx: np.ndarray, y1: float, x1: float, y2: float, x2: float) -> np.ndarray:
    return (yy >= y1) & (yy < y2) & (xx >= x1) & (xx < x2)


def _finish(img: np.ndarray, rng: np.random.Generator, sigma: float) -> np.ndarray:
    """Add Gaussian noise and quantise to uint8."""
    noisy = img + rng.normal(0.0, sigma, size=img.shape).astype(np.float32)
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def road_background(h: int, w: int) -> np.ndarray:
    """Pale grey sky over a grey road: float32 ``[h, w, 3]`` with near-equal channels."""
    yy, _ = _grid(h, w)
    horizon = 0.35 * h
    sky = 215.0 - 25.0 * (yy / max(horizon, 1.0))
    road = 80.0 + 40.0 * ((yy - horizon) / max(h - horizon, 1.0))
    grey = np.where(yy < horizon, sky, road)
    img = np.repeat(grey[..., None], 3, axis=2)
    img[..., 2] += np.where(yy < horizon, 4.0, 0.0)  # a hint of blue in the sky, still unsaturated
    return img


def road_frames(seed: int, frames: int, hw: tuple[int, int], vehicles: int, persons: int,
                salt_pepper: float = 0.0) -> np.ndarray:
    """``frames`` uint8 ``[T, H, W, 3]`` of a road with moving vehicles (coloured boxes with dark
    windows) and pedestrians (coloured bodies, skin-coloured heads), plus Gaussian noise and, if
    ``salt_pepper`` > 0, that fraction of pixels set to black or white."""
    rng = np.random.default_rng(seed)
    h, w = hw
    yy, xx = _grid(h, w)
    base = road_background(h, w)
    horizon = 0.35 * h
    objs = []
    for _ in range(vehicles):
        vw, vh = rng.uniform(0.12, 0.2) * w, rng.uniform(0.1, 0.16) * h
        objs.append(("vehicle", rng.uniform(0, w - vw), rng.uniform(horizon, h - vh), vw, vh,
                     rng.uniform(-0.03, 0.03) * w, 0.0, VEHICLE_COLOURS[rng.integers(len(VEHICLE_COLOURS))]))
    for _ in range(persons):
        pw, ph = rng.uniform(0.05, 0.07) * w, rng.uniform(0.2, 0.28) * h
        objs.append(("person", rng.uniform(0, w - pw), rng.uniform(horizon - 0.5 * ph, h - ph), pw, ph,
                     rng.uniform(-0.01, 0.01) * w, rng.uniform(-0.005, 0.005) * h,
                     CLOTHES_COLOURS[rng.integers(len(CLOTHES_COLOURS))]))
    out = np.empty((frames, h, w, 3), dtype=np.uint8)
    dash = max(h // 12, 2)
    for t in range(frames):
        img = base.copy()
        lane = (np.abs(xx - w / 2) < max(w / 160, 1)) & (yy > horizon) & (((yy + 3 * t * dash // 4) // dash) % 2 == 0)
        img[lane] = 230.0
        for kind, x, y, ow, oh, vx, vy, colour in objs:
            x = float(np.clip(x + vx * t, 0, w - ow))
            y = float(np.clip(y + vy * t, 0, h - oh))
            if kind == "vehicle":
                img[_rect(yy, xx, y, x, y + oh, x + ow)] = colour
                img[_rect(yy, xx, y + 0.1 * oh, x + 0.15 * ow, y + 0.35 * oh, x + 0.85 * ow)] = 40.0
            else:
                head = oh * 0.2
                img[_ellipse(yy, xx, y + head + (oh - head) / 2, x + ow / 2, (oh - head) / 2, ow / 2)] = colour
                img[_ellipse(yy, xx, y + head / 2, x + ow / 2, head / 2, ow / 3)] = SKIN
        out[t] = _finish(img, rng, 4.0)
    if salt_pepper > 0:
        hit = rng.random(out.shape[:3]) < salt_pepper
        white = rng.random(out.shape[:3]) < 0.5
        out[hit & white] = 255
        out[hit & ~white] = 0
    return out


def face_frames(seed: int, frames: int, hw: tuple[int, int], faces: int) -> np.ndarray:
    """``frames`` uint8 ``[T, H, W, 3]`` of a pale room with ``faces`` skin-coloured faces (dark hair,
    dark eyes) drifting across it, plus Gaussian noise."""
    rng = np.random.default_rng(seed)
    h, w = hw
    yy, xx = _grid(h, w)
    wall = 190.0 + 30.0 * (xx / w)
    base = np.stack([wall + 6, wall + 2, wall - 4], axis=-1)
    base[yy > 0.8 * h] = 150.0
    people = []
    for _ in range(faces):
        rx, ry = rng.uniform(0.05, 0.08) * w, rng.uniform(0.1, 0.16) * h
        people.append((rng.uniform(rx, w - rx), rng.uniform(ry, 0.8 * h - ry), ry, rx,
                       rng.uniform(-0.01, 0.01) * w, rng.uniform(-0.005, 0.005) * h))
    out = np.empty((frames, h, w, 3), dtype=np.uint8)
    for t in range(frames):
        img = base.copy()
        for cx, cy, ry, rx, vx, vy in people:
            cx = float(np.clip(cx + vx * t, rx, w - rx))
            cy = float(np.clip(cy + vy * t, ry, h - ry))
            img[_ellipse(yy, xx, cy, cx, ry, rx)] = SKIN
            img[_ellipse(yy, xx, cy - 0.8 * ry, cx, 0.35 * ry, 0.9 * rx)] = 35.0
            for side in (-1, 1):
                img[_ellipse(yy, xx, cy - 0.15 * ry, cx + side * 0.4 * rx, 0.08 * ry, 0.12 * rx)] = 20.0
        out[t] = _finish(img, rng, 4.0)
    return out


def photo(seed: int, hw: tuple[int, int]) -> np.ndarray:
    """A photo-like uint8 ``[H, W, 3]`` image: blue sky gradient, green hills, a sun, a few coloured
    shapes in the foreground, Gaussian noise."""
    rng = np.random.default_rng(seed)
    h, w = hw
    yy, xx = _grid(h, w)
    t = yy / h
    img = np.stack([90 + 100 * t, 150 + 70 * t, 235 - 20 * t], axis=-1).astype(np.float32)
    hill = 0.55 * h + 0.08 * h * np.sin(xx / w * 2 * np.pi * rng.uniform(0.5, 2.0) + rng.uniform(0, 6.28))
    img[yy > hill] = np.array([60, 140, 50], dtype=np.float32)
    img[_ellipse(yy, xx, rng.uniform(0.1, 0.25) * h, rng.uniform(0.1, 0.9) * w, 0.07 * h, 0.07 * h)] = \
        np.array([250, 230, 120], dtype=np.float32)
    for _ in range(int(rng.integers(2, 5))):
        colour = rng.uniform(0, 255, size=3).astype(np.float32)
        cy, cx = rng.uniform(0.6, 0.95) * h, rng.uniform(0.05, 0.95) * w
        ry, rx = rng.uniform(0.05, 0.15) * h, rng.uniform(0.05, 0.15) * w
        mask = _ellipse(yy, xx, cy, cx, ry, rx) if rng.random() < 0.5 else _rect(yy, xx, cy - ry, cx - rx,
                                                                                  cy + ry, cx + rx)
        img[mask] = colour
    return _finish(img, rng, 8.0)
