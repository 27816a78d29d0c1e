"""Tiling: fused operators -> the accelerator's program.

Every matrix operator is ``groups`` GEMMs ``(m x k) @ (k x n)`` (a convolution through im2col). Its
work is cut into tiles ``(g, m, k, n)`` such that one tile's inputs fit half the input scratchpad,
its weights half the weight scratchpad and its partial sums (4-byte accumulators) half the output
scratchpad: the other halves hold the next tile's transfer (double buffering). Tile sides are padded
to the array: the dimension that streams across the array's rows/columns is rounded up to a
multiple of them (output-stationary: m on rows, n on columns; weight-stationary: k on rows, n on
columns; input-stationary: k on rows, m on columns), because the array works on whole folds.

Loop order: k innermost (partial sums stay in the output buffer until the last k-split, then are
stored once); for output- and input-stationary, m outside n (an input block is reused across the
n tiles), for weight-stationary n outside m (a weight block is reused across the m tiles). A tile's
DRAM load of a block is skipped when the previous tile loaded the same block (it is still in the
buffer).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..errors import ConfigError
from .arch import AccelConfig
from .fuse import MatOp, VecOp, fuse
from .graph import Graph, Node, load_graph
from .layers import ConvGeom, MatLayer, VecLayer

#: Bytes of one partial sum in the output buffer (int32 for int8 inputs, fp32 for fp32).
ACC_BYTES = 4

#: Vector-unit lane operations per output element, and why. Transcendentals are evaluated as a
#: range reduction plus a short minimax polynomial by Horner's rule (one fused multiply-add per
#: degree), the usual way SIMD units without a special-function unit do it.
VEC_OPS: dict[str, tuple[int, str]] = {
    "Relu": (1, "one max"),
    "LeakyRelu": (2, "a multiply and a select"),
    "Exp": (4, "range reduction (1) + degree-3 polynomial (3)"),
    "Sigmoid": (6, "exp (4) + add + reciprocal"),
    "Tanh": (6, "2 sigmoid(2x) - 1 shares sigmoid's cost"),
    "Swish": (7, "sigmoid (6) + multiply"),
    "Erf": (6, "degree-5 minimax polynomial and a sign select"),
    "Add": (1, "one add"), "Sub": (1, "one subtract"), "Mul": (1, "one multiply"),
    "Softmax": (7, "max-reduce, subtract, exp (4), sum-reduce; the divide is a multiply by one reciprocal"),
    "LayerNormalization": (6, "mean, subtract, square-accumulate, multiply by rsqrt, scale, shift"),
    "BatchNormalization": (2, "one scale and one shift (unfused: not after a Conv)"),
    "Trilu": (1, "one select against the diagonal"),
    "Cast": (1, "one conversion"),
    "Resize": (0, "nearest: an address computation the DMA does; linear adds 3 per axis (2 mul, 1 add)"),
    "MaxPool": (0, "kh*kw compares, added per layer from the kernel"),
    "GlobalAveragePool": (0, "h*w adds + one multiply per output, added per layer"),
}
#: Views: the same bytes under another shape; nothing moves.
VIEW_OPS = frozenset({"Reshape", "Flatten", "Identity", "Unsqueeze", "Shape", "Constant"})
#: Data movement: no arithmetic, but the tensor goes through DRAM once in and once out.
MOVE_OPS = frozenset({"Transpose", "Concat", "Split", "Slice", "Gather", "Expand", "ConstantOfShape"})


@dataclass(frozen=True)
class Tile:
    """One tile operation: groups [g0, g1) x rows [m0, m1) x reduction [k0, k1) x columns [n0, n1),
    with the DRAM bytes it loads (inputs, weights) and stores (outputs, on the last k-split)."""

    g0: int
    g1: int
    m0: int
    m1: int
    k0: int
    k1: int
    n0: int
    n1: int
    load_input: int
    load_weight: int
    store: int

    @property
    def first_k(self) -> bool:
        return self.k0 == 0


@dataclass
class MatStep:
    layer: MatLayer
    op: MatOp
    #: Tile sides (groups, m, k, n) as chosen, and padded to the array.
    tile: tuple[int, int, int, int]
    padded: tuple[int, int, int, int]
    tiles: list[Tile]


@dataclass
class VecStep:
    layer: VecLayer
    node: Node | None
    #: True for an activation fused into the preceding matrix step (it runs in that step's epilogue).
    fused: bool = False


Step = MatStep | VecStep


@dataclass
class Program:
    name: str
    config: AccelConfig
    batch: int
    graph: Graph
    steps: list[Step]

    @property
    def layers(self) -> list[MatLayer | VecLayer]:
        return [s.layer for s in self.steps]

    def stats(self) -> dict[str, Any]:
        mats = [s for s in self.steps if isinstance(s, MatStep)]
        tiles = [t for s in mats for t in s.tiles]
        vec = [s.layer for s in self.steps if isinstance(s, VecStep)]
        return {
            "layers": len(self.steps), "matrix_layers": len(mats), "vector_layers": len(vec),
            "tiles": len(tiles), "macs": sum(s.layer.macs for s in mats),
            "vector_ops": sum(v.elements * v.ops for v in vec),
            "weight_bytes": sum(s.layer.weight_bytes for s in mats),
            "dram_load_bytes": sum(t.load_input + t.load_weight for t in tiles) + sum(v.bytes_in for v in vec),
            "dram_store_bytes": sum(t.store for t in tiles) + sum(v.bytes_out for v in vec),
        }


def compile_model(model: onnx.ModelProto | str | Path | Graph, cfg: AccelConfig, batch: int = 1,
                  dims: dict[str, int] | None = None) -> Program:
    """Compile ``model`` (ModelProto, .onnx path, zoo name, or an already loaded Graph) for ``cfg``."""
    g = model if isinstance(model, Graph) else load_graph(model, batch, dims)
    steps: list[Step] = []
    for op in fuse(g):
        if isinstance(op, VecOp):
            steps.append(VecStep(vec_layer(g, op.node, cfg), op.node))
            continue
        steps.append(mat_step(g, op, cfg))
        if op.act is not None:
            n = int(np.prod(g.shapes[op.output]))
            steps.append(VecStep(VecLayer(f"{op.name}/{op.act}", op.act, n, VEC_OPS[op.act][0]), None, fused=True))
    return Program(g.name, cfg, batch, g, steps)


def _ebytes(g: Graph, t: str, cfg: AccelConfig) -> int:
    """Bytes of tensor ``t`` on the accelerator: data at the config's precision, indices as stored."""
    n = int(np.prod(g.shapes[t])) if t in g.shapes else 0
    dt = g.dtypes.get(t, np.dtype(np.float32))
    return n * (cfg.element_bytes if dt.kind == "f" else dt.itemsize)


def vec_layer(g: Graph, node: Node, cfg: AccelConfig) -> VecLayer:
    outs = [t for t in node.outputs if t]
    elements = sum(int(np.prod(g.shapes[t])) for t in outs)
    data_in = [t for t in node.inputs if t and t not in g.consts]
    if node.op in VIEW_OPS:
        return VecLayer(node.name, node.op, 0, 0)
    if node.op in MOVE_OPS:
        src = data_in[:1] if node.op in ("Gather", "Slice", "Expand") else data_in
        if node.op == "Gather":  # reads only the gathered rows, plus the indices
            b_in = sum(_ebytes(g, t, cfg) for t in outs) + sum(_ebytes(g, t, cfg) for t in data_in[1:])
        else:
            b_in = sum(_ebytes(g, t, cfg) for t in src)
        return VecLayer(node.name, node.op, elements, 0, b_in, sum(_ebytes(g, t, cfg) for t in outs))
    ops_per = VEC_OPS[node.op][0]
    if node.op == "MaxPool":
        ops_per = int(np.prod(node.attrs["kernel_shape"]))
    elif node.op == "GlobalAveragePool":
        ops_per = int(np.prod(g.shapes[node.inputs[0]][2:])) + 1
    elif node.op == "Resize":
        mode = node.attrs.get("mode", b"nearest")
        nsp = sum(1 for a, b in zip(g.shapes[node.inputs[0]], g.shapes[outs[0]], strict=True) if a != b)
        ops_per = 3 * nsp if mode in (b"linear", "linear") else 0
    b_in = sum(_ebytes(g, t, cfg) for t in data_in)
    return VecLayer(node.name, node.op, elements, ops_per, b_in, sum(_ebytes(g, t, cfg) for t in outs))


def gemm_shape(g: Graph, op: MatOp) -> tuple[int, int, int, int, ConvGeom | None]:
    """(groups, m, k, n, conv geometry) of a fused matrix operator."""
    a_shape = g.shapes[op.a]
    if op.op == "Conv":
        assert op.weight is not None
        f, cg, kh, kw = op.weight.shape
        grp = op.conv["group"]
        nb, c, h, w = a_shape
        if c != cg * grp:
            raise ConfigError(f"Conv {op.name!r}: {c} input channels but weights for {cg} x group {grp}")
        pt, pl, pb, pr = op.conv["pads"]
        sh, sw = op.conv["strides"]
        dh, dw = op.conv["dilations"]
        oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
        ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
        geom = ConvGeom(h + pt + pb, w + pl + pr, kh, kw, c, f, sh) if sh == sw else None
        return grp, nb * oh * ow, cg * kh * kw, f // grp, geom
    if op.weight is not None:
        k, n = op.weight.shape
        if a_shape[-1] != k:
            raise ConfigError(f"{op.op} {op.name!r}: input {a_shape} does not match weights {op.weight.shape}")
        return 1, int(np.prod(a_shape[:-1])), k, n, None
    assert op.b is not None
    b_shape = g.shapes[op.b]
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise ConfigError(f"MatMul {op.name!r}: 1-D operands {a_shape} x {b_shape} are not supported")
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    return int(np.prod(batch)), a_shape[-2], a_shape[-1], b_shape[-1], None


def _grain(cfg: AccelConfig) -> tuple[int, int, int]:
    """Padding granules of (m, k, n) for the dataflow (see the module docstring)."""
    if cfg.dataflow == "os":
        return cfg.rows, 1, cfg.cols
    if cfg.dataflow == "ws":
        return 1, cfg.rows, cfg.cols
    return cfg.cols, cfg.rows, 1


def _pad(v: int, grain: int) -> int:
    return -(-v // grain) * grain


def choose_tile(groups: int, m: int, k: int, n: int, cfg: AccelConfig, eb: int) -> tuple[int, int, int, int]:
    """Largest tile (g, m, k, n), halving the biggest offender, whose padded footprint fits half of
    each scratchpad."""
    gm, gk, gn = _grain(cfg)
    tg, tm, tk, tn = groups, m, k, n
    half_i, half_w, half_o = cfg.ifmap_sram // 2, cfg.filter_sram // 2, cfg.ofmap_sram // 2
    # The smallest tile is one padded fold of the array; if that does not fit, nothing does.
    for what, need, half in (("ifmap_sram", gm * gk * eb, half_i), ("filter_sram", gk * gn * eb, half_w),
                             ("ofmap_sram", gm * gn * ACC_BYTES, half_o)):
        if need > half:
            raise ConfigError(f"{cfg.name!r}: one {cfg.rows}x{cfg.cols} {cfg.dataflow} fold needs {need} bytes of "
                              f"{what}, more than half of its {2 * half} (double buffering); give {what} >= "
                              f"{2 * need} or use a smaller array")

    def fits() -> tuple[bool, bool, bool]:
        pm, pk, pn = _pad(tm, gm), _pad(tk, gk), _pad(tn, gn)
        return (tg * pm * pk * eb <= half_i, tg * pk * pn * eb <= half_w, tg * pm * pn * ACC_BYTES <= half_o)

    def halve(v: int) -> int:
        return max(1, -(-v // 2))

    while not all(ok := fits()):
        if tg > 1:
            tg = halve(tg)
            continue
        fi, fw, fo = ok
        # Shrink the larger of the two sides the over-full buffer holds.
        pair = ("m", "k") if not fi else ("k", "n") if not fw else ("m", "n")
        sides = {"m": tm, "k": tk, "n": tn}
        side = max(pair, key=lambda s: sides[s])
        if sides[side] == 1:
            side = pair[0] if side == pair[1] else pair[1]
        if sides[side] == 1:  # pragma: no cover - the fold check above rules this out
            raise ConfigError(f"no tile fits the scratchpads of {cfg.name!r}")
        if side == "m":
            tm = halve(tm)
        elif side == "k":
            tk = halve(tk)
        else:
            tn = halve(tn)
    return tg, tm, tk, tn


def _ranges(total: int, step: int) -> list[tuple[int, int]]:
    return [(s, min(s + step, total)) for s in range(0, total, step)]


def mat_step(g: Graph, op: MatOp, cfg: AccelConfig) -> MatStep:
    groups, m, k, n, geom = gemm_shape(g, op)
    eb = cfg.element_bytes
    w_elems = int(op.weight.size) if op.weight is not None else int(np.prod(g.shapes[op.b or ""]))
    layer = MatLayer(op.name, op.op, m, k, n, groups, geom, weight_bytes=w_elems * eb,
                     input_bytes=int(np.prod(g.shapes[op.a])) * eb,
                     output_bytes=int(np.prod(g.shapes[op.output])) * eb)
    tg, tm, tk, tn = choose_tile(groups, m, k, n, cfg, eb)
    gm, gk, gn = _grain(cfg)
    tiles = list(_tiles(op, g, groups, m, k, n, (tg, tm, tk, tn), cfg))
    return MatStep(layer, op, (tg, tm, tk, tn), (tg, _pad(tm, gm), _pad(tk, gk), _pad(tn, gn)), tiles)


def _conv_input_bytes(g: Graph, op: MatOp, gs: int, m0: int, m1: int, k0: int, k1: int, eb: int) -> int:
    """Bytes of the ifmap a conv tile reads: the input rows under output pixels [m0, m1) for the
    channels in [k0, k1), not the im2col matrix (which repeats each pixel kh*kw times)."""
    assert op.weight is not None
    _, _, kh, kw = op.weight.shape
    nb, c, h, w = g.shapes[op.a]
    pt, pl, pb, pr = op.conv["pads"]
    sh = op.conv["strides"][0]
    dh = op.conv["dilations"][0]
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (g.shapes[op.output][3])
    out_rows = min(nb * oh, (m1 - m0 + ow - 1) // ow + 1)
    in_rows = min(nb * (h + pt + pb), (out_rows - 1) * sh + dh * (kh - 1) + 1)
    chans = min(c // op.conv["group"], -(-(k1 - k0) // (kh * kw)) + 1)
    return min(gs * (m1 - m0) * (k1 - k0) * eb, gs * in_rows * (w + pl + pr) * chans * eb)


def _tiles(op: MatOp, g: Graph, groups: int, m: int, k: int, n: int, t: tuple[int, int, int, int],
           cfg: AccelConfig) -> Iterable[Tile]:
    tg, tm, tk, tn = t
    eb = cfg.element_bytes
    last_a: tuple[int, ...] | None = None
    last_w: tuple[int, ...] | None = None
    for g0, g1 in _ranges(groups, tg):
        outer, inner = (_ranges(n, tn), _ranges(m, tm)) if cfg.dataflow == "ws" else (_ranges(m, tm), _ranges(n, tn))
        for o0, o1 in outer:
            for i0, i1 in inner:
                (m0, m1), (n0, n1) = ((i0, i1), (o0, o1)) if cfg.dataflow == "ws" else ((o0, o1), (i0, i1))
                for k0, k1 in _ranges(k, tk):
                    gs = g1 - g0
                    a_key, w_key = (g0, m0, k0), (g0, k0, n0)
                    if a_key == last_a:
                        la = 0
                    elif op.op == "Conv":
                        la = _conv_input_bytes(g, op, gs, m0, m1, k0, k1, eb)
                    else:
                        la = gs * (m1 - m0) * (k1 - k0) * eb
                    lw = 0 if w_key == last_w else gs * (k1 - k0) * (n1 - n0) * eb
                    last_a, last_w = a_key, w_key
                    st = gs * (m1 - m0) * (n1 - n0) * eb if k1 == k else 0
                    yield Tile(g0, g1, m0, m1, k0, k1, n0, n1, la, lw, st)
