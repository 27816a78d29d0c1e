"""ONNX import: fix the dynamic dimensions, fold what only depends on constants and shapes, infer
every tensor's shape, and hand the compiler a flat operator graph.

Dynamic dimensions (``N`` batch, ``L`` sequence length, ``H``/``W`` image size in the zoo) become
numbers first, because tiling needs concrete sizes. The batch comes from ``batch``; the others from
``dims``, else the zoo's default shapes (:func:`gfaas.models.zoo.info`) when the model is a zoo model.
Then sub-graphs that compute only from constants and static shapes (``Shape -> Gather -> Concat ->
Reshape`` chains, a causal mask built by ``ConstantOfShape -> Trilu``) are evaluated once here, as a
compiler would, so that the accelerator's program holds only operators on data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ConfigError
from . import ops

log = logging.getLogger("gfaas.accel")


@dataclass
class Node:
    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Graph:
    """A topologically ordered operator graph with every tensor's shape and dtype known.

    ``consts`` holds initializers and folded tensors; ``model`` is the ONNX model with its dynamic
    dimensions fixed (what onnxruntime runs to check the emulation)."""

    name: str
    nodes: list[Node]
    consts: dict[str, np.ndarray]
    inputs: dict[str, tuple[tuple[int, ...], np.dtype]]
    outputs: list[str]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    model: onnx.ModelProto

    def consumers(self, tensor: str) -> list[Node]:
        return [n for n in self.nodes if tensor in n.inputs]


def _load(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    p = Path(model)
    if p.suffix != ".onnx" or not p.is_file():
        from ..models import zoo

        if str(model) in zoo.names():
            return zoo.build(str(model), "small")
        raise ConfigError(f"model {str(model)!r} is neither an .onnx file nor a zoo model "
                          f"({', '.join(zoo.names())})")
    try:
        return onnx.load(str(p))
    except Exception as e:  # onnx raises DecodeError and others for a corrupt file
        raise ConfigError(f"{p}: not a readable ONNX model ({e})") from None


def _zoo_dims(model: onnx.ModelProto) -> dict[str, int]:
    """Default values of the named dimensions from the zoo's concrete default shapes."""
    props = {p.key: p.value for p in model.metadata_props}
    name, scale = props.get("gfaas.name"), props.get("gfaas.scale", "small")
    from ..models import zoo

    if name not in zoo.names():
        return {}
    inf = zoo.info(name, scale)
    dims: dict[str, int] = {}
    for inp, (shape, _) in inf.dynamic_inputs.items():
        concrete = inf.inputs[inp][0]
        for d, c in zip(shape, concrete, strict=True):
            if isinstance(d, str) and isinstance(c, int):
                dims[d] = c
    return dims


def check_supported(model: onnx.ModelProto) -> None:
    """Raise one ConfigError naming every node whose op type the accelerator cannot run."""
    bad = [(n.op_type, n.name or f"#{i}") for i, n in enumerate(model.graph.node) if n.op_type not in ops.SUPPORTED]
    if bad:
        listed = "; ".join(f"{op} (node {name!r})" for op, name in bad)
        raise ConfigError(f"{len(bad)} node(s) use op types the accelerator does not support: {listed}. "
                          f"Supported: {', '.join(sorted(ops.SUPPORTED))}")


def fix_dims(model: onnx.ModelProto, batch: int = 1, dims: dict[str, int] | None = None) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs have only concrete dimensions."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch={batch!r} must be a positive integer")
    values = {**_zoo_dims(model), **(dims or {})}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name for i in m.graph.initializer}
    for inp in m.graph.input:
        if inp.name in inits:
            continue
        for i, d in enumerate(inp.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            key = d.dim_param
            if i == 0 and key not in (dims or {}):
                v = batch
            elif key in values:
                v = values[key]
            else:
                raise ConfigError(f"input {inp.name!r}: dimension {i} ({key or 'unnamed'!r}) is dynamic; "
                                  f"give it, e.g. dims={{{key or 'dim'!r}: 32}} (--dim {key or 'dim'}=32)")
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"dimension {key!r}={v!r} must be a positive integer")
            d.Clear()
            d.dim_value = v
    # Intermediate shapes recorded with symbolic dims would contradict the fixed ones: infer afresh.
    del m.graph.value_info[:]
    for out in m.graph.output:
        out.type.tensor_type.ClearField("shape")
    return m


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in node.attribute:
        out[a.name] = a.t if a.type == onnx.AttributeProto.TENSOR else onnx.helper.get_attribute_value(a)
    return out


def _np_dtype(elem: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its large initializers turned into typed graph inputs: shape inference needs
    their shapes, not their values (only small ones feed shape computations), and serialising
    hundreds of MB of weights for it would dominate the compile time."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = []
    listed = {i.name for i in m.graph.input}  # older exporters list initializers as inputs too
    for init in m.graph.initializer:
        if int(np.prod(init.dims)) > 64:
            if init.name not in listed:
                m.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type,
                                                                        list(init.dims)))
        else:
            keep.append(init)
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    return m


def load_graph(model: onnx.ModelProto | str | Path, batch: int = 1, dims: dict[str, int] | None = None) -> Graph:
    """Import ``model`` (a ModelProto, an .onnx path or a zoo name) with its dynamic dims fixed."""
    proto = _load(model)
    check_supported(proto)
    fixed = fix_dims(proto, batch, dims)
    try:
        inferred = onnx.shape_inference.infer_shapes(_skeleton(fixed), strict_mode=True, data_prop=True)
    except Exception as e:  # InferenceError and friends
        raise ConfigError(f"shape inference failed: {e}") from None
    g = inferred.graph
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        dtypes[vi.name] = _np_dtype(tt.elem_type)
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    consts = {i.name: numpy_helper.to_array(i) for i in fixed.graph.initializer}
    for k, v in consts.items():
        shapes[k], dtypes[k] = v.shape, v.dtype
    inputs = {i.name: (shapes[i.name], dtypes[i.name]) for i in fixed.graph.input if i.name not in consts}
    nodes: list[Node] = []
    for i, n in enumerate(g.node):
        node = Node(n.name or f"{n.op_type}_{i}", n.op_type, list(n.input), list(n.output), _attrs(n))
        ins = [x for x in node.inputs if x]
        foldable = node.op not in ops.MATRIX_OPS and all(x in consts for x in ins)
        if node.op == "Shape" and node.inputs[0] in shapes:
            foldable = True
            args: list[Any] = [np.empty(shapes[node.inputs[0]], np.float32)]
        else:
            args = [consts.get(x) if x else None for x in node.inputs]
        if foldable:
            for name, val in zip(node.outputs, ops.run(node.op, node.attrs, args, len(node.outputs)), strict=True):
                consts[name] = np.asarray(val)
                shapes[name], dtypes[name] = consts[name].shape, consts[name].dtype
            continue
        nodes.append(node)
    # Shapes data propagation could not see through are known now that constants are folded.
    _fill_shapes(nodes, consts, shapes, dtypes)
    missing = [t for n in nodes for t in n.outputs if t and t not in shapes]
    if missing:
        raise ConfigError(f"could not infer the shape of {', '.join(missing[:5])}; fix more dims")
    outputs = [o.name for o in g.output]
    log.debug("graph %s: %d nodes after folding %d", proto.graph.name, len(nodes), len(g.node) - len(nodes))
    return Graph(proto.graph.name, nodes, consts, inputs, outputs, shapes, dtypes, fixed)


def _fill_shapes(nodes: list[Node], consts: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
                 dtypes: dict[str, np.dtype]) -> None:
    """Shapes onnx's inference left open (a Reshape whose target was computed): rerun inference on
    the folded graph."""
    if all(t in shapes for n in nodes for t in n.outputs if t):
        return
    used = {t for n in nodes for t in n.inputs}
    made = {t for n in nodes for t in n.outputs}
    small = {k for k in used & set(consts) if consts[k].size <= 64}
    g = onnx.helper.make_graph(
        [onnx.helper.make_node(n.op, n.inputs, n.outputs, name=n.name, **_plain(n.attrs)) for n in nodes],
        "folded",
        [onnx.helper.make_tensor_value_info(k, onnx.helper.np_dtype_to_tensor_dtype(dtypes[k]), shapes[k])
         for k in sorted(used - made - small) if k in shapes],
        [],
        [numpy_helper.from_array(consts[k], k) for k in sorted(small)])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])
    inf = onnx.shape_inference.infer_shapes(m, data_prop=True)
    for vi in inf.graph.value_info:
        tt = vi.type.tensor_type
        if all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes.setdefault(vi.name, tuple(int(d.dim_value) for d in tt.shape.dim))
            dtypes.setdefault(vi.name, _np_dtype(tt.elem_type))


def _plain(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
