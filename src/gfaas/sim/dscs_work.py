"""How much work one inference of a zoo model is: multiply-accumulates and parameter bytes.

Just totals for the platform rooflines of :mod:`gfaas.sim.dscs` (the accelerator's own compiler does the
per-layer work). The zoo's definition code runs in its shapes-only mode (no weights are drawn, so GPT-2
costs milliseconds, not 0.5 GB), its parameters become typed graph inputs, the symbolic dims are fixed
(batch, and the zoo defaults for sequence length and image size) and ONNX shape inference gives every
tensor's shape. MACs are counted on Conv (output elements x input channels per group x kernel area),
Gemm and MatMul (output elements x the contracted dimension); elementwise and normalisation work is
not counted (it rides on the memory traffic of the roofline).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper, shape_inference

from ..errors import ConfigError
from ..models import zoo
from ..models.builder import IR_VERSION, OPSET

__all__ = ["Work", "graph_work", "zoo_work"]

_DT = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}
_ITEM: dict[int, int] = {TensorProto.FLOAT: 4, TensorProto.INT64: 8, TensorProto.INT32: 4, TensorProto.UINT8: 1}


@dataclass(frozen=True)
class Work:
    """One inference: ``macs`` multiply-accumulates, ``params`` weights, ``in_bytes``/``out_bytes`` of the
    graph inputs and outputs at fp32/int64 (what a function reads and writes as objects)."""

    model: str
    batch: int
    macs: int
    params: int
    in_bytes: int
    out_bytes: int

    @property
    def flops(self) -> int:
        return 2 * self.macs

    def weight_bytes(self, bytes_per_param: float = 4.0) -> float:
        return self.params * bytes_per_param


def _shape(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    dims = vi.type.tensor_type.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        return None
    return tuple(int(d.dim_value) for d in dims)


def graph_work(model: onnx.ModelProto, name: str = "", batch: int = 1) -> Work:
    """MACs and parameters of an ONNX model whose input shapes are all fixed (shape inference runs here).

    ``params`` counts every float initializer element (weights and small constants such as batch-norm
    statistics: all bytes the device reads) plus graph inputs named ``param:*`` (see :func:`zoo_work`).
    """
    inferred = shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        s = _shape(vi)
        if s is not None:
            shapes[vi.name] = s
    for init in g.initializer:
        shapes[init.name] = tuple(init.dims)
    macs = 0
    for node in g.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        out = shapes.get(node.output[0])
        a = shapes.get(node.input[0])
        b = shapes.get(node.input[1])
        if out is None or a is None or b is None:
            raise ConfigError(f"{name or g.name}: shape inference left {node.op_type} node {node.name!r} without "
                              "shapes; fix every dynamic dim of the inputs first")
        if node.op_type == "Conv":
            macs += math.prod(out) * math.prod(b[1:])
        elif node.op_type == "Gemm":
            trans_a = next((at.i for at in node.attribute if at.name == "transA"), 0)
            macs += math.prod(out) * (a[0] if trans_a else a[-1])
        else:
            macs += math.prod(out) * a[-1]
    params = sum(math.prod(i.dims) for i in g.initializer if i.data_type == TensorProto.FLOAT)
    params += sum(math.prod(shapes[i.name]) for i in g.input
                  if i.type.tensor_type.elem_type == TensorProto.FLOAT and i.name.startswith("param:"))
    data_inputs = [i for i in g.input if not i.name.startswith("param:")
                   and i.name not in {x.name for x in g.initializer}]

    def nbytes(vis: list[onnx.ValueInfoProto]) -> int:
        return sum(math.prod(shapes[v.name]) * _ITEM.get(v.type.tensor_type.elem_type, 4) for v in vis)

    return Work(name or g.name, batch, int(macs), int(params), nbytes(data_inputs), nbytes(list(g.output)))


@functools.cache
def zoo_work(name: str, batch: int = 1) -> Work:
    """:class:`Work` of zoo model ``name`` at scale ``full`` and ``batch`` (cached per process).

    The graph is the zoo's own definition (shapes-only mode); its parameters enter as graph inputs
    named ``param:<name>`` with their shapes, so nothing of the weights is allocated.
    """
    zoo.check_name(name)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch={batch!r}: give a whole number >= 1")
    b, sig = zoo.define_shapes(name, "full")
    rename = {p: f"param:{p}" for p in b.param_shapes}
    nodes = []
    for n in b.nodes:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        m.input[:] = [rename.get(x, x) for x in n.input]
        nodes.append(m)
    inputs = [helper.make_tensor_value_info(k, _DT[d], list(sig.concrete((s, d), batch)[0]))
              for k, (s, d) in sig.inputs.items()]
    inputs += [helper.make_tensor_value_info(rename[p], TensorProto.FLOAT, list(s)) for p, s in b.param_shapes.items()]
    outputs = [helper.make_tensor_value_info(k, _DT[d], list(sig.concrete((s, d), batch)[0]))
               for k, (s, d) in sig.outputs.items()]
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return graph_work(model, name, batch)
