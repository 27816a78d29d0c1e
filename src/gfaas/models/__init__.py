"""The model zoo: real architectures built in code as ONNX graphs with seeded random weights.

No weights are downloaded: :func:`build` draws them from ``numpy.random.default_rng(seed)`` with the
usual init (He for convs, scaled normal for linear layers, BatchNorm 1/0/0/1), so a model's outputs
are finite but meaningless; use the zoo to measure compute and data movement, never accuracy.

``scale="full"`` is the published architecture (parameter counts equal to the references; BERT adds
its 1,538-parameter classification head; sources in docs/models.md); ``scale="small"`` is the same
family shrunk so that each model builds and runs a forward pass in well under a second on one core.
"""

from .cache import path, resolve_cache_dir
from .runtime import Model, load
from .vision import ANCHORS, NUM_ANCHORS, NUM_CLASSES, STRIDES, yolo_anchors
from .zoo import SCALES, VERSION, ModelInfo, build, info, names, param_count

__all__ = [
    "ANCHORS",
    "NUM_ANCHORS",
    "NUM_CLASSES",
    "SCALES",
    "STRIDES",
    "VERSION",
    "Model",
    "ModelInfo",
    "build",
    "info",
    "load",
    "names",
    "param_count",
    "path",
    "resolve_cache_dir",
    "yolo_anchors",
]
