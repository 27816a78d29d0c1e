"""Comparing a workflow's outputs with the reference executor's (shared by the runtime's tests)."""

from __future__ import annotations

import numpy as np


def same_output(got: object, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-5) -> bool:
    """Same dtype and shape; integers bit-equal, floats within ``rtol``/``atol`` (onnxruntime's run-to-run
    noise by default; two engines, onnxruntime and torch, round differently and get wider bounds)."""
    g = np.asarray(got)
    if g.dtype != want.dtype or g.shape != want.shape:
        return False
    if want.dtype.kind in "fc":
        return bool(np.allclose(g, want, rtol=rtol, atol=atol))
    return bool(np.array_equal(g, want))
