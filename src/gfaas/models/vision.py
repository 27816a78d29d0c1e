"""Image models: ResNet-50 v1.5, FCN-ResNet50, YOLOv3-tiny (with in-graph decoding),
EfficientNet-B0, AlexNet and ViT-B/16, each as a definition over a :class:`~.builder.GraphBuilder`.

Parameter names follow torchvision's where there is one, so that a reader can line our counts up
against ``model.named_parameters()`` (torchvision stores Linear weights [out, in]; we store [in, out]
so MatMul needs no transpose: same count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from .builder import LEAKY_GAIN, RELU_GAIN, SILU_GAIN, GraphBuilder
from .signature import Signature, TensorSig

# ---- ResNet-50 ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResNetConfig:
    stem: int = 64
    widths: tuple[int, ...] = (64, 128, 256, 512)
    blocks: tuple[int, ...] = (3, 4, 6, 3)
    expansion: int = 4
    classes: int = 1000
    side: int = 224

    @property
    def out_channels(self) -> int:
        return self.widths[-1] * self.expansion


RESNET = {
    "full": ResNetConfig(),
    "small": ResNetConfig(stem=8, widths=(8, 16, 32, 64), blocks=(1, 1, 1, 1), side=64),
}


def bottleneck(b: GraphBuilder, x: str, name: str, cin: int, width: int, stride: int, expansion: int = 4) -> str:
    """ResNet v1.5 bottleneck: the stride sits on the 3x3 conv (v1 put it on the first 1x1), which is
    torchvision's ``Bottleneck`` and the 25,557,032-parameter ResNet-50."""
    cout = width * expansion
    y = b.op("Relu", [b.batchnorm(b.conv(x, f"{name}.conv1", cin, width, 1), f"{name}.bn1", width)])
    y = b.op("Relu", [b.batchnorm(b.conv(y, f"{name}.conv2", width, width, 3, stride), f"{name}.bn2", width)])
    y = b.batchnorm(b.conv(y, f"{name}.conv3", width, cout, 1), f"{name}.bn3", cout)
    short = x
    if stride != 1 or cin != cout:
        short = b.batchnorm(b.conv(x, f"{name}.downsample.0", cin, cout, 1, stride, pad=0),
                            f"{name}.downsample.1", cout)
    return b.op("Relu", [b.op("Add", [y, short], f"{name}.add")], f"{name}.out")


def resnet_backbone(b: GraphBuilder, x: str, cfg: ResNetConfig) -> str:
    """Stem and the four stages at output stride 32 (no dilation); returns the last feature map."""
    y = b.op("Relu", [b.batchnorm(b.conv(x, "conv1", 3, cfg.stem, 7, 2), "bn1", cfg.stem)])
    y = b.op("MaxPool", [y], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = cfg.stem
    for stage, (width, n) in enumerate(zip(cfg.widths, cfg.blocks, strict=True)):
        for i in range(n):
            stride = 2 if (i == 0 and stage > 0) else 1
            y = bottleneck(b, y, f"layer{stage + 1}.{i}", cin, width, stride, cfg.expansion)
            cin = width * cfg.expansion
    return y


def classifier(b: GraphBuilder, feat: str, cin: int, classes: int, name: str = "fc") -> str:
    pooled = b.op("Flatten", [b.op("GlobalAveragePool", [feat], "avgpool")], "flatten", axis=1)
    return b.linear(pooled, name, cin, classes)


def define_resnet50(b: GraphBuilder, scale: str, debug: bool = False) -> Signature:
    cfg = RESNET[scale]
    logits = classifier(b, resnet_backbone(b, "image", cfg), cfg.out_channels, cfg.classes)
    b.rename(logits, "logits")
    return Signature({"image": (("N", 3, "H", "W"), "float32")}, {"logits": (("N", cfg.classes), "float32")},
                     {"H": cfg.side, "W": cfg.side})


def bottleneck_model(cin: int, width: int, stride: int, seed: int = 0) -> onnx.ModelProto:
    """One bottleneck block as a model (``x`` [N, cin, H, W] -> ``y``), for checking the block against
    an independent implementation. BatchNorm statistics are random here (the zoo's are 0/1) so that a
    mix-up of mean, var, scale or bias cannot go unnoticed."""
    b = GraphBuilder(np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    y = bottleneck(b, "x", "block", cin, width, stride)
    for t in b.initializers:
        if t.name.endswith(("running_mean", "bn1.bias", "bn2.bias", "bn3.bias", "downsample.1.bias")):
            t.CopyFrom(onnx.numpy_helper.from_array(
                rng.normal(0, 0.1, t.dims[0]).astype(np.float32), t.name))
        elif t.name.endswith(("running_var", ".weight")) and len(t.dims) == 1:
            t.CopyFrom(onnx.numpy_helper.from_array(
                rng.uniform(0.5, 1.5, t.dims[0]).astype(np.float32), t.name))
    b.rename(y, "y")
    return b.to_model("bottleneck", {"x": (("N", cin, "H", "W"), "float32")},
                      {"y": (("N", width * 4, "Ho", "Wo"), "float32")})


# ---- FCN-ResNet50 -------------------------------------------------------------------------------

FCN_CLASSES = 21


def define_fcn(b: GraphBuilder, scale: str, debug: bool = False) -> Signature:
    """FCN-ResNet50 (torchvision ``fcn_resnet50``: ResNet-50 backbone, ``FCNHead`` 3x3 conv to
    in/4 channels, BN, ReLU, 1x1 conv to 21 classes, bilinear upsampling to the input size).

    Departure: torchvision runs the backbone at output stride 8 (dilated layer3/layer4); we keep the
    plain stride-32 ResNet-50 so a CPU forward pass stays cheap. Dilation changes no weight shape,
    so the parameter count is the same. No auxiliary head (it is only used in training).
    """
    cfg = RESNET[scale]
    feat = resnet_backbone(b, "image", cfg)
    cin = cfg.out_channels
    mid = cin // 4
    y = b.op("Relu", [b.batchnorm(b.conv(feat, "classifier.0", cin, mid, 3), "classifier.1", mid)])
    y = b.conv(y, "classifier.4", mid, FCN_CLASSES, 1, bias=True, std=math.sqrt(1.0 / mid))
    # Output size = (N, classes) of the head and (H, W) of the input: dynamic H, W stay dynamic.
    sizes = b.op("Concat", [b.op("Shape", [y], "head_nc", end=2), b.op("Shape", ["image"], "image_hw", start=2)],
                 "out_size", axis=0)
    # Bilinear with half-pixel centres is F.interpolate(mode="bilinear", align_corners=False).
    up = b.op("Resize", [y, "", "", sizes], "upsample", mode="linear",
              coordinate_transformation_mode="half_pixel")
    b.rename(up, "logits")
    return Signature({"image": (("N", 3, "H", "W"), "float32")},
                     {"logits": (("N", FCN_CLASSES, "H", "W"), "float32")}, {"H": cfg.side, "W": cfg.side})


# ---- YOLOv3-tiny --------------------------------------------------------------------------------

# yolov3-tiny.cfg (Redmon & Farhadi 2018): anchor (w, h) in input pixels at 416x416. The stride-32
# head (13x13 at 416) uses the three large anchors ("mask = 3,4,5"), the stride-16 head the three
# small ones ("mask = 0,1,2").
ANCHORS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((81, 82), (135, 169), (344, 319)),
    ((10, 14), (23, 27), (37, 58)),
)
STRIDES: tuple[int, ...] = (32, 16)
NUM_CLASSES = 80
NUM_ANCHORS = 3
YOLO_SIDE = {"full": 416, "small": 64}
# Channel widths of conv layers 0, 2, 4, 6, 8, 10, 12 (backbone), 13, 14 (neck/head 1), 18 (route
# to the upsample), 21 (head 2); "small" divides them by 4.
_YOLO_WIDTHS = {"full": (16, 32, 64, 128, 256, 512, 1024, 256, 512, 128, 256),
                "small": (4, 8, 16, 32, 64, 128, 256, 64, 128, 32, 64)}


def yolo_anchors(scale: str) -> tuple[tuple[tuple[float, float], ...], ...]:
    """Anchors in input pixels for ``scale``: the published ones at full scale, shrunk with the input
    side at small scale so that anchors keep the same size relative to the image."""
    f = YOLO_SIDE[scale] / YOLO_SIDE["full"]
    return tuple(tuple((w * f, h * f) for w, h in head) for head in ANCHORS)


def _cbl(b: GraphBuilder, x: str, i: int, cin: int, cout: int, k: int) -> str:
    """Darknet's convolutional block: conv (no bias), BN, leaky ReLU 0.1."""
    y = b.batchnorm(b.conv(x, f"conv{i}", cin, cout, k, gain=LEAKY_GAIN), f"bn{i}", cout)
    return b.op("LeakyRelu", [y], f"leaky{i}", alpha=0.1)


def _decode(b: GraphBuilder, raw: str, head: int, grid: int, stride: int,
            anchors: tuple[tuple[float, float], ...]) -> tuple[str, str]:
    """YOLO box decoding for one head ``raw`` [N, A*(5+C), G, G] -> boxes [N, A*G*G, 4] (cx, cy, w, h
    in input pixels) and scores [N, A*G*G, C]; rows ordered (anchor, gy, gx) like darknet's output.

    cx = (sigmoid(tx) + gx) * stride, w = exp(tw) * anchor_w; score = sigmoid(obj) * sigmoid(cls).
    """
    a, c = len(anchors), NUM_CLASSES
    t = b.op("Reshape", [raw, b.ints("head_shape", 0, a, 5 + c, grid * grid)], f"head{head}.r")
    t = b.op("Transpose", [t], f"head{head}.t", perm=[0, 1, 3, 2])  # [N, A, G*G, 5+C]
    t = b.op("Reshape", [t, b.ints("rows_shape", 0, a * grid * grid, 5 + c)], f"head{head}.rows")
    xy, wh, obj, cls = b.op_multi("Split", [t, b.ints("split", 2, 2, 1, c)], f"head{head}.split", n_out=4, axis=2)
    gy, gx = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")
    cell = np.stack([gx.ravel(), gy.ravel()], axis=1).astype(np.float32)  # (x, y) per cell, row-major
    offsets = np.tile(cell, (a, 1))[None]  # [1, A*G*G, 2]
    sizes = np.repeat(np.asarray(anchors, np.float32), grid * grid, axis=0)[None]
    centre = b.op("Mul", [b.op("Add", [b.op("Sigmoid", [xy]), b.const(f"grid{head}", offsets)]),
                          b.scalar(f"stride{head}", float(stride))], f"head{head}.centre")
    size = b.op("Mul", [b.op("Exp", [wh]), b.const(f"anchors{head}", sizes)], f"head{head}.size")
    boxes = b.op("Concat", [centre, size], f"head{head}.boxes", axis=2)
    scores = b.op("Mul", [b.op("Sigmoid", [obj]), b.op("Sigmoid", [cls])], f"head{head}.scores")
    return boxes, scores


def define_yolo(b: GraphBuilder, scale: str, debug: bool = False) -> Signature:
    """YOLOv3-tiny, layer by layer after darknet's ``yolov3-tiny.cfg``; ``debug`` also exposes the raw
    head outputs ``raw0`` (stride 32) and ``raw1`` (stride 16)."""
    w = _YOLO_WIDTHS[scale]
    side = YOLO_SIDE[scale]
    out = NUM_ANCHORS * (5 + NUM_CLASSES)
    y, cin = "image", 3
    route8 = ""
    for i, cout in enumerate(w[:6]):  # layers 0..10: conv, maxpool pairs
        y = _cbl(b, y, 2 * i, cin, cout, 3)
        cin = cout
        if i == 4:
            route8 = y
        if i < 5:
            y = b.op("MaxPool", [y], f"maxpool{2 * i + 1}", kernel_shape=[2, 2], strides=[2, 2])
    # Layer 11: a 2x2 max pool with stride 1, padded at the end so the 13x13 grid is kept.
    y = b.op("MaxPool", [y], "maxpool11", kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1])
    y = _cbl(b, y, 12, cin, w[6], 3)
    r13 = _cbl(b, y, 13, w[6], w[7], 1)
    y = _cbl(b, r13, 14, w[7], w[8], 3)
    # Detector convs: biased and linear. A small std keeps the initial boxes near the anchors (exp of a
    # large tw would overflow), the usual init for detection heads.
    raw0 = b.conv(y, "conv15", w[8], out, 1, bias=True, std=0.01)
    y = _cbl(b, r13, 18, w[7], w[9], 1)
    y = b.op("Resize", [y, "", b.const("up_scales", np.array([1, 1, 2, 2], np.float32))], "upsample19",
             mode="nearest")
    y = b.op("Concat", [y, route8], "route20", axis=1)
    y = _cbl(b, y, 21, w[9] + w[4], w[10], 3)
    raw1 = b.conv(y, "conv22", w[10], out, 1, bias=True, std=0.01)

    anchors = yolo_anchors(scale)
    grids = (side // STRIDES[0], side // STRIDES[1])
    d0 = _decode(b, raw0, 0, grids[0], STRIDES[0], anchors[0])
    d1 = _decode(b, raw1, 1, grids[1], STRIDES[1], anchors[1])
    b.rename(b.op("Concat", [d0[0], d1[0]], "boxes_cat", axis=1), "boxes")
    b.rename(b.op("Concat", [d0[1], d1[1]], "scores_cat", axis=1), "scores")
    k = NUM_ANCHORS * (grids[0] ** 2 + grids[1] ** 2)
    outputs: dict[str, TensorSig] = {"boxes": (("N", k, 4), "float32"),
                                     "scores": (("N", k, NUM_CLASSES), "float32")}
    if debug:
        b.rename(raw0, "raw0")
        b.rename(raw1, "raw1")
        outputs["raw0"] = (("N", out, grids[0], grids[0]), "float32")
        outputs["raw1"] = (("N", out, grids[1], grids[1]), "float32")
    return Signature({"image": (("N", 3, side, side), "float32")}, outputs)


# ---- EfficientNet-B0 ----------------------------------------------------------------------------

# (expand ratio, kernel, stride, out channels, repeats) per stage, Tan & Le 2019 Table 1.
_B0_STAGES = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
              (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))


@dataclass(frozen=True)
class EffNetConfig:
    width: float = 1.0
    max_repeats: int = 99
    stem: int = 32
    head: int = 1280
    classes: int = 1000
    side: int = 224


EFFNET = {"full": EffNetConfig(), "small": EffNetConfig(width=0.25, max_repeats=1, stem=8, head=128, side=64)}


def _ch(c: int, width: float) -> int:
    # Shrinking keeps channel counts multiples of 4 (>= 4) so the small model is still depthwise-friendly.
    return c if width == 1.0 else max(4, int(round(c * width / 4)) * 4)


def _mbconv(b: GraphBuilder, x: str, name: str, cin: int, cout: int, expand: int, k: int, stride: int) -> str:
    """MBConv: 1x1 expansion, kxk depthwise, squeeze-excitation (squeeze to cin/4, torchvision's
    ``max(1, input_channels // 4)``), 1x1 linear projection; identity shortcut when shapes allow
    (stochastic depth is training-only)."""
    mid = cin * expand
    y, i = x, 0
    if expand != 1:
        y = b.swish(b.batchnorm(b.conv(y, f"{name}.{i}.0", cin, mid, 1, gain=SILU_GAIN), f"{name}.{i}.1", mid,
                                eps=1e-3), f"{name}.{i}.act")
        i += 1
    y = b.swish(b.batchnorm(b.conv(y, f"{name}.{i}.0", mid, mid, k, stride, groups=mid, gain=SILU_GAIN),
                            f"{name}.{i}.1", mid, eps=1e-3), f"{name}.{i}.act")
    i += 1
    sq = max(1, cin // 4)
    s = b.op("GlobalAveragePool", [y], f"{name}.{i}.avgpool")
    s = b.swish(b.conv(s, f"{name}.{i}.fc1", mid, sq, 1, bias=True, gain=SILU_GAIN), f"{name}.{i}.act")
    s = b.op("Sigmoid", [b.conv(s, f"{name}.{i}.fc2", sq, mid, 1, bias=True, gain=SILU_GAIN)])
    y = b.op("Mul", [y, s], f"{name}.{i}.scale")
    i += 1
    y = b.batchnorm(b.conv(y, f"{name}.{i}.0", mid, cout, 1, gain=SILU_GAIN), f"{name}.{i}.1", cout, eps=1e-3)
    if stride == 1 and cin == cout:
        y = b.op("Add", [y, x], f"{name}.add")
    return y


def define_efficientnet_b0(b: GraphBuilder, scale: str, debug: bool = False) -> Signature:
    cfg = EFFNET[scale]
    stem = cfg.stem
    y = b.swish(b.batchnorm(b.conv("image", "features.0.0", 3, stem, 3, 2, gain=1.0), "features.0.1", stem, eps=1e-3),
                "features.0.act")
    cin = stem
    for s, (e, k, stride, c, n) in enumerate(_B0_STAGES):
        cout = _ch(c, cfg.width)
        for i in range(min(n, cfg.max_repeats)):
            y = _mbconv(b, y, f"features.{s + 1}.{i}.block", cin, cout, e, k, stride if i == 0 else 1)
            cin = cout
    head = cfg.head
    y = b.swish(b.batchnorm(b.conv(y, "features.8.0", cin, head, 1, gain=SILU_GAIN), "features.8.1", head, eps=1e-3),
                "features.8.act")
    b.rename(classifier(b, y, head, cfg.classes, "classifier.1"), "logits")
    return Signature({"image": (("N", 3, "H", "W"), "float32")}, {"logits": (("N", cfg.classes), "float32")},
                     {"H": cfg.side, "W": cfg.side})


# ---- AlexNet ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlexNetConfig:
    widths: tuple[int, ...] = (64, 192, 384, 256, 256)
    hidden: int = 4096
    classes: int = 1000
    side: int = 224


ALEXNET = {"full": AlexNetConfig(), "small": AlexNetConfig(widths=(8, 24, 48, 32, 32), hidden=128, side=64)}


def define_alexnet(b: GraphBuilder, scale: str, debug: bool = False) -> Signature:
    """AlexNet (torchvision ``alexnet``, the one-GPU variant of Krizhevsky et al. 2012): five convs
    (11x11 stride 4, 5x5, three 3x3) with ReLU and three 3x3/2 max pools, then three linear layers
    (9216 -> 4096 -> 4096 -> 1000). Most of its 61.1M parameters are in the first linear layer, which
    makes it the zoo's weight-heavy, compute-light model.

    Departure: torchvision's ``AdaptiveAvgPool2d((6, 6))`` is the identity at 224x224 (the features are
    6x6 already), so the graph omits it and fixes the input at 224x224 (64x64 at small scale, 1x1
    features); dropout is training-only."""
    cfg = ALEXNET[scale]
    (c1, c2, c3, c4, c5), side = cfg.widths, cfg.side

    def pool(x: str, name: str) -> str:
        return b.op("MaxPool", [x], name, kernel_shape=[3, 3], strides=[2, 2])

    y = b.op("Relu", [b.conv("image", "features.0", 3, c1, 11, 4, bias=True, pad=2)])
    y = pool(y, "features.2")
    y = b.op("Relu", [b.conv(y, "features.3", c1, c2, 5, bias=True)])
    y = pool(y, "features.5")
    y = b.op("Relu", [b.conv(y, "features.6", c2, c3, 3, bias=True)])
    y = b.op("Relu", [b.conv(y, "features.8", c3, c4, 3, bias=True)])
    y = b.op("Relu", [b.conv(y, "features.10", c4, c5, 3, bias=True)])
    y = pool(y, "features.12")
    s = (side + 4 - 11) // 4 + 1
    for _ in range(3):
        s = (s - 3) // 2 + 1
    flat = c5 * s * s
    y = b.op("Flatten", [y], "flatten", axis=1)
    y = b.op("Relu", [b.linear(y, "classifier.1", flat, cfg.hidden, std=RELU_GAIN / math.sqrt(flat))])
    y = b.op("Relu", [b.linear(y, "classifier.4", cfg.hidden, cfg.hidden, std=RELU_GAIN / math.sqrt(cfg.hidden))])
    b.rename(b.linear(y, "classifier.6", cfg.hidden, cfg.classes), "logits")
    return Signature({"image": (("N", 3, side, side), "float32")}, {"logits": (("N", cfg.classes), "float32")})


# ---- ViT-B/16 -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ViTConfig:
    patch: int = 16
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    mlp: int = 3072
    classes: int = 1000
    side: int = 224


VIT = {"full": ViTConfig(), "small": ViTConfig(hidden=64, layers=2, heads=4, mlp=256, side=64)}
_TSTD = 0.02  # BERT/ViT-style initializer range for transformer weights


def define_vit_b16(b: GraphBuilder, scale: str, debug: bool = False) -> Signature:
    """ViT-B/16 (torchvision ``vit_b_16``): 16x16 patch conv, class token, learned position embedding,
    pre-LayerNorm encoder (eps 1e-6), exact GELU, class-token head. The position embedding fixes the
    input at 224x224 (64x64 at small scale)."""
    cfg = VIT[scale]
    h, p = cfg.hidden, cfg.patch
    seq = (cfg.side // p) ** 2 + 1
    x = b.conv("image", "conv_proj", 3, h, p, p, bias=True, pad=0, std=math.sqrt(1.0 / (3 * p * p)))
    x = b.op("Transpose", [b.op("Reshape", [x, b.ints("flat", 0, h, -1)], "patches")], "tokens", perm=[0, 2, 1])
    n = b.op("Shape", ["image"], "batch", end=1)
    cls = b.op("Expand", [b.param("class_token", (1, 1, h), std=_TSTD),
                          b.op("Concat", [n, b.ints("one_h", 1, h)], "cls_shape", axis=0)], "cls")
    x = b.op("Concat", [cls, x], "with_cls", axis=1)
    x = b.op("Add", [x, b.param("encoder.pos_embedding", (1, seq, h), std=_TSTD)], "embedded")
    for i in range(cfg.layers):
        name = f"encoder.layers.{i}"
        a = b.attention(b.layernorm(x, f"{name}.ln_1", h, 1e-6), f"{name}.self_attention", h, cfg.heads, None,
                        std=_TSTD)
        x = b.op("Add", [x, a], f"{name}.res1")
        m = b.linear(b.layernorm(x, f"{name}.ln_2", h, 1e-6), f"{name}.mlp.0", h, cfg.mlp, _TSTD)
        m = b.linear(b.gelu(m, f"{name}.mlp.gelu"), f"{name}.mlp.3", cfg.mlp, h, _TSTD)
        x = b.op("Add", [x, m], f"{name}.res2")
    x = b.layernorm(x, "encoder.ln", h, 1e-6)
    cls_out = b.op("Gather", [x, b.const("index0", np.asarray(0, np.int64))], "cls_out", axis=1)
    b.rename(b.linear(cls_out, "heads.head", h, cfg.classes, _TSTD), "logits")
    return Signature({"image": (("N", 3, cfg.side, cfg.side), "float32")},
                     {"logits": (("N", cfg.classes), "float32")})
