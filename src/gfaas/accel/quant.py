"""The int8 scheme of the emulated matrix unit.

* Weights: symmetric, per output channel: ``s_w[c] = max|W[:, c]| / 127``, ``q = round(W / s_w)``
  in [-127, 127] (no -128, so that negation stays in range).
* Activations entering a matrix layer: symmetric, per tensor, calibrated on the tensor the layer
  actually receives for this input (dynamic calibration): ``s_a = max|A| / 127``. The second operand
  of an activation x activation product (attention) is quantised the same way.
* The array multiplies int8 x int8 and accumulates in int32 across all k-splits; the output buffer
  then requantises: ``y = acc * s_a * s_w[c] + bias`` in fp32, applies the fused activation, and the
  next matrix layer quantises its input again. Vector-unit operators run in fp32.

Error bound. For one layer the rounding error of each operand is at most half a step, so for a dot
product of length k: ``|y - y_fp32| <= k * (max|a| * s_w / 2 + max|w| * s_a / 2 + s_a * s_w / 4)``
(:func:`layer_error_bound`; the tests check it exactly). Across a network these errors compound
and depend on the weights, so the model-level bound is empirical with margin: ``max |y - ref| /
max |ref|`` <= 0.3 (:data:`gfaas.accel.emulate.INT8_TOLERANCE`). Measured on the eight small zoo
models with inputs seeds 0-2 it ranges from below 0.005 (logreg) to 0.224 (efficientnet_b0, seed 2: depthwise
and squeeze-excitation layers amplify the per-tensor activation rounding); full-size resnet50 0.168,
efficientnet_b0 0.176, bert_base 0.045. Top-1 agreement is not a usable check on these
random-weight classifiers: their 1000 logits are nearly tied, and it flips on some seeds.
"""

from __future__ import annotations

import numpy as np

QMAX = 127
#: int32 accumulators: a dot product of k int8 products stays below 2**31 while k * 127 * 127 does.
MAX_K = (2**31 - 1) // (QMAX * QMAX)


def quantise_per_tensor(x: np.ndarray) -> tuple[np.ndarray, float]:
    """(integer values as float64, scale) of ``x``."""
    amax = float(np.max(np.abs(x))) if x.size else 0.0
    s = amax / QMAX if amax > 0 else 1.0
    return np.clip(np.rint(x / s), -QMAX, QMAX).astype(np.float64), s


def quantise_per_column(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``w`` of shape (G, K, N): one scale per (group, column) = per output channel."""
    amax = np.max(np.abs(w), axis=1, keepdims=True).astype(np.float64)
    s = np.where(amax > 0, amax / QMAX, 1.0)
    return np.clip(np.rint(w / s), -QMAX, QMAX), s[:, 0, :]


def layer_error_bound(a: np.ndarray, w: np.ndarray, k: int) -> float:
    """The largest |int8 result - fp32 result| one matrix layer can have (before bias/activation),
    with per-tensor ``a`` and per-tensor-bounded ``w`` scales (per-column scales are no larger)."""
    sa = float(np.max(np.abs(a))) / QMAX
    sw = float(np.max(np.abs(w))) / QMAX
    return k * (float(np.max(np.abs(a))) * sw / 2 + float(np.max(np.abs(w))) * sa / 2 + sa * sw / 4)
