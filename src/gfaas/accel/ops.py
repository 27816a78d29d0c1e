"""Numpy reference semantics of the ONNX (opset 17) operators the accelerator's vector unit runs, and
of the shape computations the compiler folds away. The matrix operators (Conv, Gemm, MatMul) are not
here: they run tile by tile on the emulated matrix unit (:mod:`gfaas.accel.emulate`).

Each function takes the node's attributes and its input arrays (``None`` for an omitted optional
input) and returns its outputs as a list, in fp32 for floating tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from ..errors import ConfigError

Arr = np.ndarray
OpFn = Callable[[dict[str, Any], list[Any]], list[Arr]]

# Abramowitz & Stegun 7.1.26 is only good to 1.5e-7 absolute; erf via math.erf (correctly rounded)
# vectorised is exact but slow, so use it: the tensors the zoo feeds to Erf (GELU) are small.
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _f32(x: Arr) -> Arr:
    return np.asarray(x, dtype=np.float32) if np.asarray(x).dtype.kind == "f" else np.asarray(x)


def _unary(fn: Callable[[Arr], Arr]) -> OpFn:
    return lambda at, xs: [_f32(fn(xs[0]))]


def _binary(fn: Callable[[Arr, Arr], Arr]) -> OpFn:
    return lambda at, xs: [np.asarray(fn(xs[0], xs[1])).astype(np.result_type(xs[0], xs[1]))]


def _sigmoid(x: Arr) -> Arr:
    x64 = x.astype(np.float64)
    return 1.0 / (1.0 + np.exp(-x64))


def softmax(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    x = xs[0].astype(np.float64)
    ax = int(at.get("axis", -1))
    e = np.exp(x - x.max(axis=ax, keepdims=True))
    return [_f32(e / e.sum(axis=ax, keepdims=True))]


def layer_norm(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    x, scale = xs[0].astype(np.float64), xs[1]
    bias = xs[2] if len(xs) > 2 else None
    ax = int(at.get("axis", -1)) % x.ndim
    axes = tuple(range(ax, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + float(at.get("epsilon", 1e-5))) * scale
    if bias is not None:
        y = y + bias
    return [_f32(y)]


def batch_norm(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    """Inference-mode BatchNormalization (one not after a Conv; after a Conv it is folded)."""
    x, s, b, mean, var = xs[:5]
    shp = (1, -1) + (1,) * (x.ndim - 2)
    inv = s / np.sqrt(var + float(at.get("epsilon", 1e-5)))
    return [_f32(x * inv.reshape(shp) + (b - mean * inv).reshape(shp))]


def _pads(at: dict[str, Any], nsp: int) -> list[int]:
    pads = list(at.get("pads", [0] * (2 * nsp)))
    if at.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise ConfigError(f"auto_pad={at['auto_pad']!r} is not supported; export with explicit pads")
    return pads


def max_pool(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    x = xs[0]
    kh, kw = at["kernel_shape"]
    sh, sw = at.get("strides", [1, 1])
    dh, dw = at.get("dilations", [1, 1])
    pt, pl, pb, pr = _pads(at, 2)
    h, w = x.shape[2] + pt + pb, x.shape[3] + pl + pr
    ceil = bool(at.get("ceil_mode", 0))
    rnd = math.ceil if ceil else math.floor
    oh = rnd((h - dh * (kh - 1) - 1) / sh) + 1
    ow = rnd((w - dw * (kw - 1) - 1) / sw) + 1
    extra_h = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - h)
    extra_w = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - w)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb + extra_h), (pl, pr + extra_w)), constant_values=-np.inf)
    out = np.full(x.shape[:2] + (oh, ow), -np.inf, dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            out = np.maximum(out, xp[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh,
                                     j * dw: j * dw + sw * (ow - 1) + 1: sw])
    return [out]


def reshape(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    x, shape = xs[0], [int(v) for v in xs[1]]
    if not at.get("allowzero", 0):
        shape = [x.shape[i] if v == 0 else v for i, v in enumerate(shape)]
    return [x.reshape(shape)]


def flatten(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    x = xs[0]
    ax = int(at.get("axis", 1)) % (x.ndim + 1) if x.ndim else 0
    return [x.reshape(int(np.prod(x.shape[:ax])), -1)]


def split(at: dict[str, Any], xs: list[Any], nout: int) -> list[Arr]:
    x = xs[0]
    ax = int(at.get("axis", 0)) % x.ndim
    if len(xs) > 1 and xs[1] is not None:
        sizes = [int(v) for v in xs[1]]
    else:
        n = x.shape[ax]
        per = -(-n // nout)
        sizes = [min(per, n - i * per) for i in range(nout)]
    return list(np.split(x, np.cumsum(sizes)[:-1], axis=ax))


def slice_(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    x, starts, ends = xs[0], xs[1], xs[2]
    axes = xs[3] if len(xs) > 3 and xs[3] is not None else range(len(starts))
    steps = xs[4] if len(xs) > 4 and xs[4] is not None else [1] * len(starts)
    sl = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        n = x.shape[int(a)]
        s, e, st = int(s), int(e), int(st)
        # ONNX clamps starts/ends (INT64_MAX means "to the end"); Python slicing clamps the same way.
        sl[int(a) % x.ndim] = slice(max(min(s, n), -n - 1), max(min(e, n), -n - 1), st)
    return [x[tuple(sl)]]


def gather(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    x, idx = xs[0], np.asarray(xs[1]).astype(np.int64)
    ax = int(at.get("axis", 0)) % x.ndim
    return [np.take(x, np.where(idx < 0, idx + x.shape[ax], idx), axis=ax)]


def expand(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    x = xs[0]
    shape = np.broadcast_shapes(x.shape, tuple(int(v) for v in xs[1]))
    return [np.broadcast_to(x, shape).copy()]


def shape_(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    s = np.array(xs[0].shape, dtype=np.int64)
    start, end = int(at.get("start", 0)), at.get("end")
    return [s[start:None if end is None else int(end)]]


def unsqueeze(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    x = xs[0]
    axes = sorted(int(a) % (x.ndim + len(xs[1])) for a in xs[1])
    for a in axes:
        x = np.expand_dims(x, a)
    return [x]


def trilu(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    x = xs[0]
    k = int(xs[1]) if len(xs) > 1 and xs[1] is not None else 0
    return [np.triu(x, k) if at.get("upper", 1) else np.tril(x, k)]


def constant_of_shape(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    v = at.get("value")
    val = onnx.numpy_helper.to_array(v) if v is not None else np.zeros(1, np.float32)
    return [np.full(tuple(int(s) for s in xs[0]), val.reshape(-1)[0], dtype=val.dtype)]


def cast(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    return [xs[0].astype(onnx.helper.tensor_dtype_to_np_dtype(int(at["to"])))]


def resize(at: dict[str, Any], xs: list[Any]) -> list[Arr]:
    """Resize on the spatial axes (nearest or linear = bilinear), any coordinate transformation mode
    ONNX defines except tf_crop_and_resize."""
    x = xs[0]
    scales = xs[2] if len(xs) > 2 and xs[2] is not None and np.asarray(xs[2]).size else None
    sizes = xs[3] if len(xs) > 3 and xs[3] is not None and np.asarray(xs[3]).size else None
    if sizes is not None:
        out_shape = [int(v) for v in sizes]
        sc = [o / i for o, i in zip(out_shape, x.shape, strict=True)]
    else:
        assert scales is not None
        sc = [float(v) for v in scales]
        out_shape = [int(math.floor(i * s)) for i, s in zip(x.shape, sc, strict=True)]
    mode = _s(at.get("mode", "nearest"))
    ctm = _s(at.get("coordinate_transformation_mode", "half_pixel"))
    nearest_mode = _s(at.get("nearest_mode", "round_prefer_floor"))
    if mode not in ("nearest", "linear"):
        raise ConfigError(f"Resize mode={mode!r} is not supported (nearest and linear are)")
    y = x
    for ax in range(x.ndim):
        if out_shape[ax] == x.shape[ax] and sc[ax] == 1.0:
            continue
        y = _resize_axis(y, ax, out_shape[ax], sc[ax], mode, ctm, nearest_mode)
    return [y.astype(x.dtype)]


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _resize_axis(x: Arr, ax: int, n_out: int, scale: float, mode: str, ctm: str, nm: str) -> Arr:
    n_in = x.shape[ax]
    o = np.arange(n_out, dtype=np.float64)
    if ctm == "half_pixel":
        c = (o + 0.5) / scale - 0.5
    elif ctm == "pytorch_half_pixel":
        c = (o + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(o)
    elif ctm == "align_corners":
        c = o * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros_like(o)
    elif ctm == "asymmetric":
        c = o / scale
    elif ctm == "half_pixel_symmetric":
        adj = n_out / (scale * n_in)
        c = (n_in / 2) * (1 - adj) + (o + 0.5) / scale - 0.5
    else:
        raise ConfigError(f"Resize coordinate_transformation_mode={ctm!r} is not supported")
    if mode == "nearest":
        rounders: dict[str, Callable[[Arr], Arr]] = {"round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
                                                     "floor": np.floor, "ceil": np.ceil}
        idx = np.clip(rounders[nm](c).astype(np.int64), 0, n_in - 1)
        return np.take(x, idx, axis=ax)
    c = np.clip(c, 0, n_in - 1)
    lo = np.floor(c).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    w = (c - lo).reshape([-1 if i == ax else 1 for i in range(x.ndim)])
    return np.take(x, lo, axis=ax) * (1 - w) + np.take(x, hi, axis=ax) * w


OPS: dict[str, OpFn] = {
    "Relu": _unary(lambda x: np.maximum(x, 0)),
    "LeakyRelu": lambda at, xs: [_f32(np.where(xs[0] >= 0, xs[0], xs[0] * float(at.get("alpha", 0.01))))],
    "Sigmoid": _unary(_sigmoid),
    "Tanh": _unary(np.tanh),
    "Erf": _unary(lambda x: _erf(x.astype(np.float64))),
    "Exp": _unary(lambda x: np.exp(x.astype(np.float64))),
    "Mul": _binary(np.multiply),
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Softmax": softmax,
    "LayerNormalization": layer_norm,
    "BatchNormalization": batch_norm,
    "MaxPool": max_pool,
    "GlobalAveragePool": lambda at, xs: [xs[0].mean(axis=tuple(range(2, xs[0].ndim)), keepdims=True,
                                                    dtype=np.float64).astype(xs[0].dtype)],
    "Flatten": flatten,
    "Reshape": reshape,
    "Transpose": lambda at, xs: [np.transpose(xs[0], at.get("perm"))],
    "Concat": lambda at, xs: [np.concatenate([np.asarray(x) for x in xs], axis=int(at["axis"]))],
    "Slice": slice_,
    "Gather": gather,
    "Expand": expand,
    "Shape": shape_,
    "Cast": cast,
    "Unsqueeze": unsqueeze,
    "Trilu": trilu,
    "ConstantOfShape": constant_of_shape,
    "Resize": resize,
    "Identity": lambda at, xs: [xs[0]],
}
#: Run on the matrix unit, not here.
MATRIX_OPS = ("Conv", "Gemm", "MatMul")
SUPPORTED = frozenset(OPS) | {"Split", "Constant"} | frozenset(MATRIX_OPS)


def run(op: str, attrs: dict[str, Any], inputs: list[Any], n_outputs: int = 1) -> list[Arr]:
    """The outputs of one vector-unit (or folded) node."""
    if op == "Split":
        return split(attrs, inputs, n_outputs)
    if op == "Constant":
        return [onnx.numpy_helper.to_array(attrs["value"])]
    return OPS[op](attrs, inputs)
