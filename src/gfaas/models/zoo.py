"""The zoo's registry: names, published parameter counts (with their sources), :func:`info`,
:func:`param_count` and :func:`build`."""

from __future__ import annotations

import functools
import logging
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from ..errors import ConfigError, NotFound
from . import calibrate, tabular, text, vision
from .builder import GraphBuilder
from .signature import Signature, TensorSig

log = logging.getLogger("gfaas.models")

# Part of every cache file name: bump it whenever a definition or the init changes, so that files
# built by an older gfaas are never mistaken for the current graphs.
VERSION = "v1"
SCALES = ("small", "full")

Definer = Callable[[GraphBuilder, str, bool], Signature]


@dataclass(frozen=True)
class _Entry:
    define: Definer
    reference_params: int
    reference_source: str
    summary: str
    # Has BatchNorm layers, whose running statistics come from a calibration pass (calibrate.py).
    batchnorm: bool = False


_ZOO: dict[str, _Entry] = {
    "resnet50": _Entry(
        vision.define_resnet50, 25_557_032,
        "torchvision resnet50 (IMAGENET1K weights metadata: num_params 25,557,032); He et al. 2016, v1.5 "
        "stride placement",
        "ResNet-50 v1.5 image classifier, 1000 ImageNet classes", batchnorm=True),
    "yolo": _Entry(
        vision.define_yolo, 8_852_366,
        "darknet yolov3-tiny.cfg (Redmon & Farhadi 2018), 80 COCO classes: conv weights + BN scale/shift "
        "+ detector biases = 8,852,366 (the ~8.85M usually quoted)",
        "YOLOv3-tiny detector, two heads (stride 32 and 16), boxes and scores decoded in the graph", batchnorm=True),
    "fcn": _Entry(
        vision.define_fcn, 32_957_013,
        "torchvision fcn_resnet50 (21 VOC classes) lists 35,322,218 including the training-only aux "
        "classifier (FCNHead(1024, 21): 2,365,205); without it 32,957,013",
        "FCN-ResNet50 semantic segmenter, 21 VOC classes, stride-32 backbone, bilinear upsampling", batchnorm=True),
    "efficientnet_b0": _Entry(
        vision.define_efficientnet_b0, 5_288_548,
        "torchvision efficientnet_b0 (IMAGENET1K_V1 metadata: 5,288,548); Tan & Le 2019 report 5.3M",
        "EfficientNet-B0 image classifier: MBConv, squeeze-excitation, swish", batchnorm=True),
    "alexnet": _Entry(
        vision.define_alexnet, 61_100_840,
        "torchvision alexnet (IMAGENET1K_V1 metadata: num_params 61,100,840); Krizhevsky et al. 2012, "
        "torchvision's one-GPU channel widths (64, 192, 384, 256, 256)",
        "AlexNet image classifier, 1000 ImageNet classes; 61M parameters, 96% of them in the three linear layers"),
    "vit_b16": _Entry(
        vision.define_vit_b16, 86_567_656,
        "torchvision vit_b_16 (IMAGENET1K_V1 metadata: 86,567,656); Dosovitskiy et al. 2021 report 86M",
        "ViT-B/16 vision transformer, 1000 ImageNet classes"),
    "bert_base": _Entry(
        text.define_bert, 109_482_240,
        "HuggingFace bert-base-uncased BertModel incl. pooler: 109,482,240 (Devlin et al. 2019 report 110M); "
        "our 2-class head adds 1,538",
        "BERT-base uncased encoder with pooler and a 2-class classification head"),
    "gpt2_small": _Entry(
        text.define_gpt2, 124_439_808,
        "HuggingFace gpt2 (tied LM head): 124,439,808 (Radford et al. 2019 report 117M, an undercount later "
        "corrected by OpenAI)",
        "GPT-2 small causal language model, LM head tied to the token embedding"),
    "logreg": _Entry(
        tabular.define_logreg, 33,
        "logistic regression on 32 features: 32 weights + 1 intercept",
        "logistic regression for credit-risk scoring (probability of default)"),
}


@dataclass(frozen=True)
class ModelInfo:
    """What a model takes and gives. ``inputs`` maps each input to its default concrete shape (batch 1;
    the batch dim, sequence length of text models and image size of ``fcn`` are dynamic in the graph:
    see ``dynamic_inputs``) and dtype."""

    name: str
    scale: str
    inputs: dict[str, tuple[tuple[int | str, ...], str]]
    outputs: tuple[str, ...]
    reference_params: int | None
    reference_source: str
    vocab_size: int | None
    dynamic_inputs: dict[str, tuple[tuple[int | str, ...], str]]
    output_shapes: dict[str, tuple[tuple[int | str, ...], str]]
    max_seq_len: int | None
    summary: str


def names() -> list[str]:
    """The model names the zoo knows, in a fixed order."""
    return list(_ZOO)


def check_name(name: object) -> str:
    if not isinstance(name, str) or name not in _ZOO:
        raise NotFound(f"no model {name!r} in the zoo; known: {', '.join(_ZOO)}")
    return name


def check_scale(scale: object) -> str:
    if scale not in SCALES:
        raise ConfigError(f"scale {scale!r} is not one of {', '.join(map(repr, SCALES))}: use 'small' for tests "
                          f"and 'full' for the published architecture")
    return str(scale)


def check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or int(seed) < 0:
        raise ConfigError(f"seed {seed!r} must be a non-negative integer, e.g. seed=0")
    return int(seed)


def define_shapes(name: str, scale: str = "full") -> tuple[GraphBuilder, Signature]:
    """The model's graph in shapes-only mode: nodes, parameter shapes and the signature, with no
    weights drawn (GPT-2 costs milliseconds instead of 0.5 GB). For counting work, not for running."""
    b = GraphBuilder(None)
    sig = _ZOO[check_name(name)].define(b, check_scale(scale), False)
    return b, sig


@functools.cache
def _signature(name: str, scale: str) -> tuple[Signature, int]:
    b, sig = define_shapes(name, scale)
    return sig, b.n_params()


def signature(name: str, scale: str = "small") -> Signature:
    return _signature(check_name(name), check_scale(scale))[0]


def info(name: str, scale: str = "small") -> ModelInfo:
    """Inputs (default shapes, batch 1), outputs and reference figures of ``name`` at ``scale``."""
    sig = signature(name, scale)
    entry = _ZOO[name]
    # A published count describes the real architecture; logreg is the same model at both scales.
    published = scale == "full" or name == "logreg"

    def conc(s: dict[str, TensorSig]) -> dict[str, tuple[tuple[int | str, ...], str]]:
        return {k: sig.concrete(v) for k, v in s.items()}

    return ModelInfo(
        name=name, scale=scale, inputs=conc(sig.inputs), outputs=tuple(sig.outputs),
        reference_params=entry.reference_params if published else None,
        reference_source=entry.reference_source if published else f"none at scale {scale!r} (a shrunk variant)",
        vocab_size=sig.vocab_size, dynamic_inputs=dict(sig.inputs), output_shapes=dict(sig.outputs),
        max_seq_len=sig.max_seq_len, summary=entry.summary,
    )


def param_count(name: str, scale: str = "full") -> int:
    """Trainable parameters of ``name`` at ``scale``, summed over initializer shapes (BatchNorm running
    statistics and graph constants excluded, as in PyTorch's ``parameters()``). Allocates no weights."""
    return _signature(check_name(name), check_scale(scale))[1]


def build(name: str, scale: str = "small", seed: int = 0, debug: bool = False) -> onnx.ModelProto:
    """The ONNX model ``name`` at ``scale`` with weights drawn from ``numpy.random.default_rng(seed)``.

    ``debug=True`` adds intermediate outputs where a model has some worth checking (``yolo``: the raw
    head maps ``raw0``, ``raw1``).
    """
    name, scale, seed = check_name(name), check_scale(scale), check_seed(seed)
    entry = _ZOO[name]
    stats = calibrate.bn_statistics(entry.define, scale, seed) if entry.batchnorm else None
    b = GraphBuilder(np.random.default_rng(seed), bn_stats=stats)
    sig = entry.define(b, scale, bool(debug))
    model = b.to_model(name, sig.inputs, sig.outputs, doc=_ZOO[name].summary)
    onnx.helper.set_model_props(model, {"gfaas.name": name, "gfaas.scale": scale, "gfaas.seed": str(seed),
                                        "gfaas.version": VERSION})
    log.debug("built %s scale=%s seed=%d: %d parameters", name, scale, seed, b.n_params())
    return model
