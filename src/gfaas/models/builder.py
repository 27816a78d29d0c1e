"""Graph-building helpers: a small ONNX graph builder with seeded weights, and the layers the zoo
shares (conv + batch norm, linear, layer norm, GELU, multi-head attention).

A :class:`GraphBuilder` made with ``rng=None`` records parameter *shapes* only and allocates no
weights, so that :func:`gfaas.models.param_count` of GPT-2 costs milliseconds, not half a gigabyte:
the same model-definition code runs in both modes, so the count cannot drift from the built graph.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Opset 17 is the first with LayerNormalization; ORT >= 1.18 (the floor in pyproject) runs it fully.
OPSET = 17
# IR 8 is what opset 17 shipped with (onnx 1.12); a newer IR would lock out older onnxruntime wheels.
IR_VERSION = 8

# Init gains: gain^2 = 1 / E[act(z)^2] for z ~ N(0, 1), so that a conv fed with act(z) gives unit
# variance again (He et al. 2015 derive 2 for ReLU; the same argument gives the others, with E[.]
# computed numerically: SiLU 0.3553, LeakyReLU(0.1) 0.5044).
RELU_GAIN = math.sqrt(2.0)
SILU_GAIN = 1.0 / math.sqrt(0.3553)
LEAKY_GAIN = 1.0 / math.sqrt(0.5044)

_DTYPES = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}

Dim = int | str


@dataclass
class GraphBuilder:
    """Accumulates nodes and initializers; ``rng=None`` is the shapes-only (counting) mode."""

    rng: np.random.Generator | None
    # BatchNorm running statistics by layer name (from a calibration pass); absent layers get 0/1.
    bn_stats: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    # Calibration mode: every BatchNorm normalises with its input's own batch statistics (training
    # mode) and exposes them as graph outputs ``<name>.batch_mean`` / ``<name>.batch_var``.
    calibrating: bool = False
    bn_layers: dict[str, int] = field(default_factory=dict)
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    param_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _used: set[str] = field(default_factory=set)
    _consts: dict[tuple[str, bytes, tuple[int, ...]], str] = field(default_factory=dict)

    # ---- names and tensors ----------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        """A tensor name not used yet (``base``, else ``base_1``, ``base_2``, ...)."""
        name, i = base, 0
        while name in self._used:
            i += 1
            name = f"{base}_{i}"
        self._used.add(name)
        return name

    def param(self, name: str, shape: Sequence[int], std: float | None = None, fill: float = 0.0) -> str:
        """A trainable weight: normal(0, std) when ``std`` is given, else constant ``fill``.

        Only parameters count towards :func:`param_count`; buffers (:meth:`const`) do not, which is
        how PyTorch's ``parameters()`` (the published counts) treats BatchNorm running statistics.
        """
        shape = tuple(int(s) for s in shape)
        if name in self.param_shapes or name in self._used:
            raise ValueError(f"duplicate parameter name {name!r}")
        self._used.add(name)
        self.param_shapes[name] = shape
        if self.rng is not None:
            if std is None:
                arr = np.full(shape, fill, dtype=np.float32)
            else:
                arr = self.rng.standard_normal(shape, dtype=np.float32)
                arr *= np.float32(std)
            self.initializers.append(numpy_helper.from_array(arr, name))
        return name

    def const(self, base: str, value: np.ndarray | Sequence[int] | Sequence[float], share: bool = False) -> str:
        """A non-trainable constant (shapes, grids, anchors, running statistics); always materialised,
        so keep it small. ``share``: reuse an equal constant made earlier with ``share`` (scalars and
        shapes recur in every layer; one initializer each is enough)."""
        arr = np.asarray(value)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        key = (arr.dtype.str, arr.tobytes(), arr.shape) if share else None
        if key is not None and key in self._consts:
            return self._consts[key]
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(arr, name))
        if key is not None:
            self._consts[key] = name
        return name

    def ints(self, base: str, *values: int) -> str:
        return self.const(base, np.asarray(values, dtype=np.int64), share=True)

    def scalar(self, base: str, value: float) -> str:
        return self.const(base, np.asarray(value, dtype=np.float32), share=True)

    def op(self, op_type: str, inputs: Sequence[str], name: str | None = None, n_out: int = 1,
           **attrs: object) -> str:
        """Append a node with one output and return the output's name."""
        return self.op_multi(op_type, inputs, name, n_out, **attrs)[0]

    def op_multi(self, op_type: str, inputs: Sequence[str], name: str | None = None, n_out: int = 1,
                 **attrs: object) -> list[str]:
        base = name or op_type.lower()
        outs = [self.fresh(base if n_out == 1 else f"{base}_{i}") for i in range(n_out)]
        node = helper.make_node(op_type, list(inputs), outs, name=outs[0])
        node.attribute.extend(helper.make_attribute(k, v) for k, v in sorted(attrs.items()))
        self.nodes.append(node)
        return outs

    def rename(self, tensor: str, name: str) -> str:
        """Expose ``tensor`` under a public ``name`` (graph outputs get the documented names)."""
        self._used.add(name)
        self.nodes.append(helper.make_node("Identity", [tensor], [name], name=name))
        return name

    def n_params(self) -> int:
        return sum(math.prod(s) for s in self.param_shapes.values())

    def to_model(self, graph_name: str, inputs: dict[str, tuple[tuple[Dim, ...], str]],
                 outputs: dict[str, tuple[tuple[Dim, ...], str]], doc: str = "") -> onnx.ModelProto:
        if self.rng is None:
            raise ValueError("a shapes-only GraphBuilder (rng=None) cannot produce a model")
        graph = helper.make_graph(
            self.nodes, graph_name,
            [helper.make_tensor_value_info(k, _DTYPES[d], list(s)) for k, (s, d) in inputs.items()],
            [helper.make_tensor_value_info(k, _DTYPES[d], list(s)) for k, (s, d) in outputs.items()],
            initializer=self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="gfaas.models", doc_string=doc)
        model.ir_version = IR_VERSION
        return model

    # ---- layers ---------------------------------------------------------------------------------
    def conv(self, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
             bias: bool = False, pad: int | None = None, std: float | None = None, gain: float = RELU_GAIN) -> str:
        """2-D convolution with weights normal(0, gain / sqrt(fan_in)) (He init for the default gain)
        unless ``std`` is given; symmetric padding ``k // 2`` (PyTorch's convention for odd kernels)
        unless ``pad`` is given."""
        fan_in = cin // groups * k * k
        w = self.param(f"{name}.weight", (cout, cin // groups, k, k),
                       std=std if std is not None else gain / math.sqrt(fan_in))
        ins = [x, w]
        if bias:
            ins.append(self.param(f"{name}.bias", (cout,)))
        p = k // 2 if pad is None else pad
        return self.op("Conv", ins, name, kernel_shape=[k, k], strides=[stride, stride], pads=[p, p, p, p],
                       group=groups)

    def batchnorm(self, x: str, name: str, c: int, gamma: float = 1.0, eps: float = 1e-5) -> str:
        """Inference BatchNorm over NCHW: gamma/beta are parameters; the running mean/var are buffers,
        taken from ``bn_stats`` when given (see :mod:`gfaas.models.calibrate`), else 0 and 1."""
        scale = self.param(f"{name}.weight", (c,), fill=gamma)
        beta = self.param(f"{name}.bias", (c,))
        self.bn_layers[name] = c
        if self.calibrating:
            axes = [0, 2, 3]
            m4 = self.op("ReduceMean", [x], f"{name}.mean4", axes=axes, keepdims=1)
            d = self.op("Sub", [x, m4], f"{name}.centred")
            v4 = self.op("ReduceMean", [self.op("Mul", [d, d], f"{name}.sq")], f"{name}.var4", axes=axes, keepdims=1)
            flat = self.ints("flat_c", -1)
            mean = self.op("Reshape", [m4, flat], f"{name}.batch_mean")
            var = self.op("Reshape", [v4, flat], f"{name}.batch_var")
        elif self.bn_stats is not None and name in self.bn_stats:
            m, v = self.bn_stats[name]
            mean = self.const(f"{name}.running_mean", np.asarray(m, np.float32).reshape(c))
            var = self.const(f"{name}.running_var", np.asarray(v, np.float32).reshape(c))
        else:
            mean = self.const(f"{name}.running_mean", np.zeros(c, np.float32))
            var = self.const(f"{name}.running_var", np.ones(c, np.float32))
        return self.op("BatchNormalization", [x, scale, beta, mean, var], name, epsilon=eps)

    def linear(self, x: str, name: str, cin: int, cout: int, std: float | None = None, bias: bool = True) -> str:
        """``x @ W + b`` with W stored [in, out] (MatMul broadcasts over any leading dims); weights
        normal(0, 1/sqrt(fan_in)) unless ``std`` is given, so the output variance matches the input's."""
        w = self.param(f"{name}.weight", (cin, cout), std=std if std is not None else 1.0 / math.sqrt(cin))
        y = self.op("MatMul", [x, w], name)
        if bias:
            y = self.op("Add", [y, self.param(f"{name}.bias", (cout,))], f"{name}.add")
        return y

    def layernorm(self, x: str, name: str, c: int, eps: float = 1e-5) -> str:
        g = self.param(f"{name}.weight", (c,), fill=1.0)
        b = self.param(f"{name}.bias", (c,))
        return self.op("LayerNormalization", [x, g, b], name, axis=-1, epsilon=eps)

    def gelu(self, x: str, name: str) -> str:
        """Exact GELU, ``0.5 x (1 + erf(x / sqrt 2))`` (BERT, ViT); opset 17 has no Gelu op."""
        e = self.op("Erf", [self.op("Mul", [x, self.scalar("inv_sqrt2", 1.0 / math.sqrt(2.0))], f"{name}.s")],
                    f"{name}.erf")
        e1 = self.op("Add", [e, self.scalar("one", 1.0)], f"{name}.p1")
        return self.op("Mul", [self.op("Mul", [x, e1], f"{name}.xm"), self.scalar("half", 0.5)], name)

    def gelu_tanh(self, x: str, name: str) -> str:
        """GPT-2's GELU, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
        x3 = self.op("Mul", [self.op("Mul", [x, x], f"{name}.x2"), x], f"{name}.x3")
        inner = self.op("Add", [x, self.op("Mul", [x3, self.scalar("c044715", 0.044715)], f"{name}.c")],
                        f"{name}.in")
        t = self.op("Tanh", [self.op("Mul", [inner, self.scalar("sqrt2pi", math.sqrt(2.0 / math.pi))],
                                     f"{name}.sc")], f"{name}.tanh")
        t1 = self.op("Add", [t, self.scalar("one", 1.0)], f"{name}.p1")
        return self.op("Mul", [self.op("Mul", [x, t1], f"{name}.xm"), self.scalar("half", 0.5)], name)

    def swish(self, x: str, name: str) -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x], f"{name}.sig")], name)

    def attention(self, x: str, name: str, hidden: int, heads: int, mask_add: str | None,
                  std: float | None = None, out_std: float | None = None) -> str:
        """Multi-head self-attention over ``x`` [N, L, hidden]; ``mask_add`` (broadcastable to
        [N, heads, L, L]) is added to the scaled scores before the softmax (0 keeps, large negative
        drops). Reshapes use 0 ("copy this dim") so N and L stay symbolic without Shape ops."""
        d = hidden // heads
        split = self.ints("heads_shape", 0, 0, heads, d)

        def heads_of(t: str, tag: str, perm: list[int]) -> str:
            return self.op("Transpose", [self.op("Reshape", [t, split], f"{name}.{tag}.r")], f"{name}.{tag}.t",
                           perm=perm)

        q = heads_of(self.linear(x, f"{name}.query", hidden, hidden, std), "q", [0, 2, 1, 3])
        k = heads_of(self.linear(x, f"{name}.key", hidden, hidden, std), "k", [0, 2, 3, 1])
        v = heads_of(self.linear(x, f"{name}.value", hidden, hidden, std), "v", [0, 2, 1, 3])
        s = self.op("Mul", [self.op("MatMul", [q, k], f"{name}.qk"), self.scalar("inv_sqrt_d", 1.0 / math.sqrt(d))],
                    f"{name}.scores")
        if mask_add is not None:
            s = self.op("Add", [s, mask_add], f"{name}.masked")
        p = self.op("Softmax", [s], f"{name}.probs", axis=-1)
        ctx = self.op("Transpose", [self.op("MatMul", [p, v], f"{name}.ctx")], f"{name}.ctx.t", perm=[0, 2, 1, 3])
        ctx = self.op("Reshape", [ctx, self.ints("merge_shape", 0, 0, hidden)], f"{name}.ctx.r")
        return self.linear(ctx, f"{name}.output", hidden, hidden, out_std if out_std is not None else std)
