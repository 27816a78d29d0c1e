"""Operator fusion: each Conv / Gemm / MatMul becomes one matrix-unit operator that carries what the
output buffer can apply before the result leaves the chip.

* A BatchNormalization right after a Conv (always the case in the zoo) is folded into the Conv's
  weights and bias: ``W' = W * g/sqrt(v+eps)`` per output channel, ``b' = (b - mean) * g/sqrt(v+eps)
  + beta``; inference-mode BN is affine, so this is exact up to rounding.
* An Add of a constant per-column vector after a MatMul becomes its bias (Gemm's C likewise).
* One activation after that (Relu, LeakyRelu, Sigmoid, Tanh, and swish ``x * sigmoid(x)``) runs on
  the vector unit reading the output buffer, so it costs no DRAM round trip.

A fused step only absorbs a node whose input has no other reader and is no graph output: otherwise
the intermediate value must still exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from .graph import Graph, Node

ACTIVATIONS = ("Relu", "LeakyRelu", "Sigmoid", "Tanh")


@dataclass
class MatOp:
    """A fused matrix-unit operator. ``weight`` is a constant operand: for Conv (F, C/g, kh, kw)
    with BN folded, for Gemm/MatMul (K, N) (Gemm's transB and alpha already applied). ``b`` names the
    second operand of a MatMul of two activations (attention's Q.K^T and P.V); ``weight`` is then None."""

    name: str
    op: str
    a: str
    output: str
    weight: np.ndarray | None = None
    b: str | None = None
    bias: np.ndarray | None = None
    act: str | None = None
    alpha: float = 0.01
    conv: dict[str, Any] = field(default_factory=dict)
    fused: list[str] = field(default_factory=list)


@dataclass
class VecOp:
    node: Node


Op = MatOp | VecOp


def _sole_reader(g: Graph, readers: dict[str, list[Node]], t: str) -> Node | None:
    rs = readers.get(t, [])
    return rs[0] if len(rs) == 1 and t not in g.outputs else None


def fuse(g: Graph) -> list[Op]:
    """The graph's nodes as fused operators, in execution order."""
    readers: dict[str, list[Node]] = {}
    for n in g.nodes:
        for t in set(n.inputs):
            readers.setdefault(t, []).append(n)
    absorbed: set[int] = set()
    out: list[Op] = []
    for node in g.nodes:
        if id(node) in absorbed:
            continue
        if node.op not in ("Conv", "Gemm", "MatMul"):
            out.append(VecOp(node))
            continue
        mop = _matop(g, node)
        # BN fold (Conv only: its per-channel affine acts on the output channels).
        nxt = _sole_reader(g, readers, mop.output)
        if nxt is not None and nxt.op == "BatchNormalization" and mop.op == "Conv" \
                and all(x in g.consts for x in nxt.inputs[1:5]):
            s, beta, mean, var = (g.consts[x].astype(np.float64) for x in nxt.inputs[1:5])
            inv = s / np.sqrt(var + float(nxt.attrs.get("epsilon", 1e-5)))
            assert mop.weight is not None
            mop.weight = (mop.weight * inv.reshape(-1, 1, 1, 1)).astype(np.float32)
            b0 = mop.bias if mop.bias is not None else np.zeros_like(inv)
            mop.bias = ((b0 - mean) * inv + beta).astype(np.float32)
            _absorb(mop, nxt, absorbed)
            nxt = _sole_reader(g, readers, mop.output)
        # Bias: Add of a constant that broadcasts along the output's channel / column axis only.
        if nxt is not None and nxt.op == "Add" and mop.bias is None:
            other = nxt.inputs[1] if nxt.inputs[0] == mop.output else nxt.inputs[0]
            vec = _bias_vector(g, mop, other)
            if vec is not None:
                mop.bias = vec
                _absorb(mop, nxt, absorbed)
                nxt = _sole_reader(g, readers, mop.output)
        if nxt is not None and nxt.op in ACTIVATIONS:
            mop.act, mop.alpha = nxt.op, float(nxt.attrs.get("alpha", 0.01))
            _absorb(mop, nxt, absorbed)
        elif mop.output not in g.outputs:
            _try_swish(g, readers, mop, absorbed)
        out.append(mop)
    return out


def _absorb(mop: MatOp, node: Node, absorbed: set[int]) -> None:
    absorbed.add(id(node))
    mop.fused.append(node.name)
    mop.output = node.outputs[0]


def _try_swish(g: Graph, readers: dict[str, list[Node]], mop: MatOp, absorbed: set[int]) -> None:
    """x * sigmoid(x) (EfficientNet's swish): the Sigmoid and the Mul both read x, the Mul also the Sigmoid."""
    rs = readers.get(mop.output, [])
    sig = [r for r in rs if r.op == "Sigmoid"]
    if len(rs) != 2 or len(sig) != 1:
        return
    mul = next(r for r in rs if r is not sig[0])
    s = sig[0].outputs[0]
    if mul.op != "Mul" or sorted(mul.inputs) != sorted([mop.output, s]) or _sole_reader(g, readers, s) is not mul:
        return
    absorbed.update((id(sig[0]), id(mul)))
    mop.act = "Swish"
    mop.fused += [sig[0].name, mul.name]
    mop.output = mul.outputs[0]


def _bias_vector(g: Graph, mop: MatOp, other: str) -> np.ndarray | None:
    if other not in g.consts or mop.b is not None:
        return None
    c = g.consts[other]
    if mop.op == "Conv":
        assert mop.weight is not None
        f = mop.weight.shape[0]
        ok = c.size == f and (c.ndim == 3 and c.shape == (f, 1, 1) or c.ndim == 4 and c.shape == (1, f, 1, 1))
    else:
        n = g.shapes[mop.output][-1]
        ok = c.size == n and c.shape[-1] == n
    return c.reshape(-1).astype(np.float32) if ok else None


def _matop(g: Graph, node: Node) -> MatOp:
    at = node.attrs
    if node.op == "Conv":
        if node.inputs[1] not in g.consts:
            raise ConfigError(f"Conv {node.name!r}: weights {node.inputs[1]!r} are not a constant")
        w = g.consts[node.inputs[1]].astype(np.float32)
        if w.ndim != 4:
            raise ConfigError(f"Conv {node.name!r}: only 2-D convolutions are supported (weights {w.shape})")
        bias = g.consts[node.inputs[2]].astype(np.float32) if len(node.inputs) > 2 and node.inputs[2] else None
        if at.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise ConfigError(f"Conv {node.name!r}: auto_pad={at['auto_pad']!r} unsupported; use explicit pads")
        conv = {"strides": list(at.get("strides", [1, 1])), "pads": list(at.get("pads", [0, 0, 0, 0])),
                "dilations": list(at.get("dilations", [1, 1])), "group": int(at.get("group", 1)),
                "kernel": list(w.shape[2:])}
        return MatOp(node.name, "Conv", node.inputs[0], node.outputs[0], weight=w, bias=bias, conv=conv)
    if node.op == "Gemm":
        if at.get("transA", 0):
            raise ConfigError(f"Gemm {node.name!r}: transA=1 is not supported")
        if node.inputs[1] not in g.consts:
            raise ConfigError(f"Gemm {node.name!r}: B {node.inputs[1]!r} must be a constant")
        w = g.consts[node.inputs[1]].astype(np.float32)
        w = (w.T if at.get("transB", 0) else w) * np.float32(at.get("alpha", 1.0))
        c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        bias = None
        if c is not None:
            cv = g.consts.get(c)
            if cv is None or cv.size != w.shape[1]:
                raise ConfigError(f"Gemm {node.name!r}: C must be a constant of {w.shape[1]} values")
            bias = (cv.reshape(-1) * np.float32(at.get("beta", 1.0))).astype(np.float32)
        return MatOp(node.name, "Gemm", node.inputs[0], node.outputs[0], weight=np.ascontiguousarray(w), bias=bias)
    a, b = node.inputs
    if b in g.consts and g.consts[b].ndim == 2:
        return MatOp(node.name, "MatMul", a, node.outputs[0], weight=g.consts[b].astype(np.float32))
    return MatOp(node.name, "MatMul", a, node.outputs[0], b=b)
