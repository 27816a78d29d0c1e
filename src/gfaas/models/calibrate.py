"""BatchNorm running statistics for random-weight networks, from one calibration pass.

With running mean 0 and variance 1 a BatchNorm normalises nothing, and a random network then
drifts: every residual add doubles the stream's variance (ResNet-50 logits in the thousands), while
SiLU and squeeze-excitation gates shrink it (EfficientNet-B0 logits near 1e-6). A trained network's
running statistics are what keep its activations near unit scale, so we compute the same thing for
the random one: build the graph once with every BatchNorm in training mode (normalising by its input's
own batch statistics, which it also outputs), run it on a seeded standard-normal batch, and use those
statistics as the running mean and variance of the real graph. On that batch the inference graph then
reproduces the training-mode forward pass exactly, and every BatchNorm output is unit-variance per
channel on image-like inputs. Weights are untouched (the statistics are buffers, not parameters).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from .builder import GraphBuilder
from .signature import Signature

# Images per calibration batch: small-scale maps are tiny (2x2 at the last ResNet stage), so more
# images keep the per-channel estimates steady; one full-size image already has 49+ positions.
_BATCH = {"small": 4, "full": 1}


def bn_statistics(define: Callable[[GraphBuilder, str, bool], Signature], scale: str,
                  seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{batchnorm layer name: (mean, var)}`` of the network ``define`` builds with ``seed``."""
    b = GraphBuilder(np.random.default_rng(seed), calibrating=True)
    sig = define(b, scale, False)
    outputs: dict[str, tuple[tuple[int | str, ...], str]] = {}
    for layer, c in b.bn_layers.items():
        outputs[f"{layer}.batch_mean"] = ((c,), "float32")
        outputs[f"{layer}.batch_var"] = ((c,), "float32")
    if not outputs:
        return {}
    model = b.to_model("calibration", sig.inputs, outputs)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # One thread: reductions then sum in one fixed order, so the statistics (and the built file) do
    # not depend on how many cores the building machine has.
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    # A separate stream from the weights' (same seed), so the calibration batch is not the weights.
    rng = np.random.default_rng([seed, 0xCA11B])
    feeds = {}
    for k, s in sig.inputs.items():
        shape, dtype = sig.concrete(s, _BATCH[scale])
        if dtype != "float32":
            raise ValueError(f"BatchNorm calibration feeds float inputs only; {k!r} is {dtype}")
        feeds[k] = rng.standard_normal(tuple(int(d) for d in shape), dtype=np.float32)
    names = list(outputs)
    values = sess.run(names, feeds)
    stats = {}
    for layer in b.bn_layers:
        mean = values[names.index(f"{layer}.batch_mean")]
        var = values[names.index(f"{layer}.batch_var")]
        stats[layer] = (np.asarray(mean, np.float32), np.asarray(var, np.float32))
    return stats
