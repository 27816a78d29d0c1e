"""The model zoo: real architectures built in code as ONNX graphs with seeded random weights.

No weights are downloaded: :func:`build` draws them from ``numpy.random.default_rng(seed)`` with the
usual init (He for convs, scaled normal for linear layers, BatchNorm 1/0/0/1), so a model's outputs
are finite but meaningless; use the zoo to measure compute and data movement, never accuracy.

``scale="full"`` is the published architecture (parameter counts equal to the references; BERT adds
its 1,538-parameter classification head; sources in docs/models.md); ``scale="small"`` is the same
family shrunk so that each model builds and runs a forward pass in well under a second on one core.

:mod:`gfaas.models.llm` is apart from the zoo: a Llama-style decoder in numpy (torch optional), split
into tensor-packed blocks for multicast and pipelined execution (docs/scaling.md, "The model").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Names load on first use (PEP 562): ``import gfaas.models.llm`` on a node process must not pay for
# onnx, which the zoo needs and the LLM does not.
_EXPORTS: dict[str, str] = {
    "ANCHORS": "vision",
    "LlamaConfig": "llm",
    "LlamaModel": "llm",
    "LlamaStage": "llm",
    "Model": "runtime",
    "ModelInfo": "zoo",
    "NUM_ANCHORS": "vision",
    "NUM_CLASSES": "vision",
    "RequestState": "llm",
    "SCALES": "zoo",
    "STRIDES": "vision",
    "VERSION": "zoo",
    "build": "zoo",
    "info": "zoo",
    "load": "runtime",
    "names": "zoo",
    "pack_block": "llm",
    "param_count": "zoo",
    "path": "cache",
    "resolve_cache_dir": "cache",
    "unpack_block": "llm",
    "yolo_anchors": "vision",
}

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on demand
    from .cache import path, resolve_cache_dir
    from .llm import LlamaConfig, LlamaModel, LlamaStage, RequestState, pack_block, unpack_block
    from .runtime import Model, load
    from .vision import ANCHORS, NUM_ANCHORS, NUM_CLASSES, STRIDES, yolo_anchors
    from .zoo import SCALES, VERSION, ModelInfo, build, info, names, param_count

__all__ = [
    "ANCHORS",
    "LlamaConfig",
    "LlamaModel",
    "LlamaStage",
    "Model",
    "ModelInfo",
    "NUM_ANCHORS",
    "NUM_CLASSES",
    "RequestState",
    "SCALES",
    "STRIDES",
    "VERSION",
    "build",
    "info",
    "load",
    "names",
    "pack_block",
    "param_count",
    "path",
    "resolve_cache_dir",
    "unpack_block",
    "yolo_anchors",
]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gfaas.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
