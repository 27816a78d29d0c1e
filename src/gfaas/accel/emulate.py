"""Functional emulation: run a compiled :class:`~gfaas.accel.compiler.Program` and get the model's
real outputs, the matrix layers tile by tile exactly as the program lists them (each tile reads its
slice of the operands, partial sums accumulate over the k-splits in an output-buffer tile, the
epilogue adds the bias, applies the fused activation and writes the tile out). Vector-unit layers
run whole, with the numpy semantics of :mod:`gfaas.accel.ops`. fp32, or int8 (:mod:`gfaas.accel.quant`).

:func:`check` compares with onnxruntime on the same model with the same fixed dimensions. The error
is ``max |y - ref| / max |ref|`` per output (relative to the output's largest magnitude: element-wise
relative error is meaningless where the reference is near zero), the largest over the outputs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from . import ops, quant
from .compiler import MatStep, Program, VecStep
from .fuse import MatOp
from .graph import Graph

log = logging.getLogger("gfaas.accel")

FP32_TOLERANCE = 1e-4
INT8_TOLERANCE = 0.3


def _im2col(x: np.ndarray, op: MatOp) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(G, nb*oh*ow, cg*kh*kw) patches of ``x``, columns ordered like the weights (c, kh, kw)."""
    assert op.weight is not None
    _, cg, kh, kw = op.weight.shape
    grp = op.conv["group"]
    nb, c, h, w = x.shape
    pt, pl, pb, pr = op.conv["pads"]
    sh, sw = op.conv["strides"]
    dh, dw = op.conv["dilations"]
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))).reshape(nb, grp, cg, h + pt + pb, w + pl + pr)
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    cols = np.empty((grp, nb, oh, ow, cg, kh, kw), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
            cols[:, :, :, :, :, i, j] = win.transpose(1, 0, 3, 4, 2)
    return cols.reshape(grp, nb * oh * ow, cg * kh * kw), (nb, oh, ow)


def _activation(y: np.ndarray, op: MatOp) -> np.ndarray:
    if op.act is None:
        return y
    if op.act == "Swish":
        return (y * ops.run("Sigmoid", {}, [y])[0]).astype(np.float32)
    return ops.run(op.act, {"alpha": op.alpha}, [y])[0]


def _operands(step: MatStep, env: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, Any]:
    """(A (G, M, K), B (G, K, N), how to put the (G, M, N) result back into the output's layout)."""
    op, lay = step.op, step.layer
    x = env[op.a]
    if op.op == "Conv":
        assert op.weight is not None
        a, (nb, oh, ow) = _im2col(x, op)
        grp = op.conv["group"]
        b = op.weight.reshape(grp, lay.n, lay.k).transpose(0, 2, 1)
        return a, b, lambda y: y.reshape(grp, nb, oh, ow, lay.n).transpose(1, 0, 4, 2, 3).reshape(nb, -1, oh, ow)
    if op.weight is not None:
        lead = x.shape[:-1]
        return x.reshape(1, -1, lay.k), op.weight[None], lambda y: y.reshape(*lead, lay.n)
    assert op.b is not None
    y2 = env[op.b]
    batch = np.broadcast_shapes(x.shape[:-2], y2.shape[:-2])
    a = np.broadcast_to(x, batch + x.shape[-2:]).reshape(-1, lay.m, lay.k)
    b = np.broadcast_to(y2, batch + y2.shape[-2:]).reshape(-1, lay.k, lay.n)
    return a, b, lambda y: y.reshape(*batch, lay.m, lay.n)


def run_mat_step(step: MatStep, env: dict[str, np.ndarray], precision: str = "fp32") -> np.ndarray:
    """The output tensor of one matrix step, computed tile by tile."""
    op, lay = step.op, step.layer
    a, b, unpack = _operands(step, env)
    grp, n = lay.groups, lay.n
    if precision == "int8":
        if lay.k > quant.MAX_K:
            raise ConfigError(f"layer {lay.name!r}: k={lay.k} could overflow int32 accumulators (max {quant.MAX_K})")
        a, sa = quant.quantise_per_tensor(a)
        if op.weight is not None:
            b, sw = quant.quantise_per_column(b)
        else:
            b, s2 = quant.quantise_per_tensor(b)
            sw = np.full((b.shape[0], n), s2)
        scale = (sa * sw).astype(np.float64)  # (G or 1, N)
        if scale.shape[0] != grp:
            scale = np.broadcast_to(scale, (grp, n))
    else:
        a, b, scale = a.astype(np.float32), b.astype(np.float32), None
    bias = op.bias.reshape(grp, n) if op.bias is not None else None
    out = np.empty((grp, lay.m, n), np.float32)
    acc: np.ndarray | None = None
    for t in step.tiles:
        bg = (0, 1) if b.shape[0] == 1 else (t.g0, t.g1)
        part = a[t.g0:t.g1, t.m0:t.m1, t.k0:t.k1] @ b[bg[0]:bg[1], t.k0:t.k1, t.n0:t.n1]
        acc = part if t.first_k or acc is None else acc + part
        if t.k1 == lay.k:  # last k-split: the epilogue in the output buffer, then the store
            y = acc if scale is None else acc * scale[t.g0:t.g1, None, t.n0:t.n1]
            if bias is not None:
                y = y + bias[t.g0:t.g1, None, t.n0:t.n1]
            out[t.g0:t.g1, t.m0:t.m1, t.n0:t.n1] = _activation(y.astype(np.float32), op)
    return unpack(out)


def emulate(program: Program, inputs: dict[str, np.ndarray], precision: str = "fp32") -> dict[str, np.ndarray]:
    """The model's outputs for ``inputs``, computed by running ``program``."""
    if precision not in ("fp32", "int8"):
        raise ConfigError(f"precision={precision!r} must be 'fp32' or 'int8'")
    g = program.graph
    env: dict[str, np.ndarray] = dict(g.consts)
    for name, (shape, dtype) in g.inputs.items():
        if name not in inputs:
            raise ConfigError(f"missing input {name!r} (shape {shape}, {dtype})")
        x = np.asarray(inputs[name])
        if tuple(x.shape) != tuple(shape):
            raise ConfigError(f"input {name!r} has shape {x.shape}; the program was compiled for {shape}")
        env[name] = x.astype(dtype)
    for step in program.steps:
        if isinstance(step, MatStep):
            env[step.op.output] = run_mat_step(step, env, precision)
        elif isinstance(step, VecStep) and step.node is not None:
            node = step.node
            args = [env[t] if t else None for t in node.inputs]
            for t, v in zip(node.outputs, ops.run(node.op, node.attrs, args, len(node.outputs)), strict=True):
                env[t] = np.asarray(v)
    return {o: env[o] for o in g.outputs}


def example_inputs(g: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic inputs: floats ~ N(0, 1); integer inputs that index a table (token ids) uniform
    over its rows; other integer inputs (masks) 0/1 with 1 four times as likely."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in g.inputs.items():
        if dtype.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dtype)
            continue
        rows = [g.shapes[n.inputs[0]][int(n.attrs.get("axis", 0))] for n in g.nodes
                if n.op == "Gather" and n.inputs[1] == name]
        hi = min(rows) if rows else 2
        vals = rng.integers(0, hi, shape) if rows else (rng.random(shape) < 0.8).astype(np.int64)
        out[name] = vals.astype(dtype)
    return out


def reference(g: Graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime's outputs for the same model and fixed dimensions."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(g.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    res = sess.run(g.outputs, {k: v for k, v in inputs.items() if k in g.inputs})
    return dict(zip(g.outputs, res, strict=True))


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    y64, r64 = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    if y64.shape != r64.shape:
        return float("inf")
    scale = float(np.max(np.abs(r64))) if r64.size else 0.0
    diff = float(np.max(np.abs(y64 - r64))) if r64.size else 0.0
    return diff / scale if scale > 0 else diff


@dataclass
class CheckResult:
    outputs: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    errors: dict[str, float]
    max_rel_err: float
    tolerance: float
    outputs_match: bool


def check(program: Program, precision: str = "fp32", inputs: dict[str, np.ndarray] | None = None,
          seed: int = 0) -> CheckResult:
    """Emulate ``program`` and compare with onnxruntime (fp32 bound 1e-4, int8 bound 0.3: quant.py)."""
    x = inputs if inputs is not None else example_inputs(program.graph, seed)
    outs = emulate(program, x, precision)
    ref = reference(program.graph, x)
    errors = {k: rel_err(outs[k], ref[k]) for k in ref}
    worst = max(errors.values(), default=0.0)
    tol = FP32_TOLERANCE if precision == "fp32" else INT8_TOLERANCE
    log.debug("emulated %s at %s: max relative error %.3g", program.name, precision, worst)
    return CheckResult(outs, ref, errors, worst, tol, bool(worst <= tol))
