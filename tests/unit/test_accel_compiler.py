"""The accelerator compiler: ONNX import, fusion, GEMM shapes, tiling into the scratchpads, DRAM accounting."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from gfaas.accel.arch import AccelConfig, preset
from gfaas.accel.compiler import MatStep, Program, VecStep, choose_tile, compile_model
from gfaas.accel.emulate import check
from gfaas.accel.graph import load_graph
from gfaas.errors import ConfigError
from gfaas.models import zoo

F = TensorProto.FLOAT


@pytest.fixture(scope="module")
def small() -> dict[str, onnx.ModelProto]:
    return {n: zoo.build(n, "small") for n in zoo.names()}


def _raw_macs(model: onnx.ModelProto, batch: int) -> int:
    """MACs of every Conv/MatMul/Gemm from the ONNX graph's own inferred shapes (independent of the compiler)."""
    g = load_graph(model, batch)
    total = 0
    for n in g.nodes:
        if n.op == "Conv":
            w = g.consts[n.inputs[1]]
            total += int(np.prod(g.shapes[n.outputs[0]])) * int(np.prod(w.shape[1:]))
        elif n.op in ("MatMul", "Gemm"):
            k = g.shapes[n.inputs[0]][-1]
            total += int(np.prod(g.shapes[n.outputs[0]])) * k
    return total


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_compiles_to_gemms_of_the_graphs_shapes(name: str, small: dict[str, onnx.ModelProto]) -> None:
    """Every small zoo model compiles (batch 2); its matrix layers' MACs equal the graph's, and each conv layer's
    m, k, n follow from its (padded) geometry."""
    prog = compile_model(small[name], preset("dscs"), batch=2)
    mats = [s.layer for s in prog.steps if isinstance(s, MatStep)]
    assert sum(lay.macs for lay in mats) == _raw_macs(small[name], 2)
    for lay in mats:
        if lay.conv is not None:
            c = lay.conv
            oh = (c.ifmap_h - c.filter_h) // c.stride + 1
            ow = (c.ifmap_w - c.filter_w) // c.stride + 1
            assert lay.m == 2 * oh * ow
            assert lay.k * lay.groups == c.filter_h * c.filter_w * c.channels
            assert lay.n * lay.groups == c.filters
            assert lay.weight_bytes == c.filters * lay.k  # int8: one byte each


def test_resnet_stem_layer(small: dict[str, onnx.ModelProto]) -> None:
    """resnet50's 7x7/2 stem (pad 3) on 64x64 at batch 4: one fused Conv+BN+ReLU, ifmap padded to 70x70."""
    prog = compile_model(small["resnet50"], preset("dscs").with_(precision="fp32"), batch=4)
    step = prog.steps[0]
    assert isinstance(step, MatStep)
    assert (step.layer.m, step.layer.k, step.layer.n, step.layer.groups) == (4 * 32 * 32, 7 * 7 * 3, 8, 1)
    assert (step.layer.conv.ifmap_h, step.layer.conv.ifmap_w, step.layer.conv.stride) == (70, 70, 2)
    assert step.op.fused == ["bn1", "relu"]
    assert (step.layer.input_bytes, step.layer.output_bytes) == (4 * 3 * 64 * 64 * 4, 4 * 8 * 32 * 32 * 4)
    assert not any(isinstance(s, VecStep) and s.layer.op == "BatchNormalization" for s in prog.steps)


def test_attention_matmuls_are_grouped_per_head(small: dict[str, onnx.ModelProto]) -> None:
    """bert (4 heads of 16) at batch 2, L=16: QK^T and PV are 8 GEMMs of 16x16x16; projections fold bias."""
    prog = compile_model(small["bert_base"], preset("dscs"), batch=2, dims={"L": 16})
    mats = {s.layer.name: s for s in prog.steps if isinstance(s, MatStep)}
    qk, ctx = mats["encoder.layer.0.attention.qk"].layer, mats["encoder.layer.0.attention.ctx"].layer
    assert (qk.m, qk.k, qk.n, qk.groups) == (16, 16, 16, 8) == (ctx.m, ctx.k, ctx.n, ctx.groups)
    q = mats["encoder.layer.0.attention.query"]
    assert (q.layer.m, q.layer.k, q.layer.n) == (32, 64, 64) and q.op.bias is not None
    assert mats["pooler.dense"].op.act == "Tanh"


def test_gemm_transb_head(small: dict[str, onnx.ModelProto]) -> None:
    """gpt2's tied LM head is a Gemm with transB: 32 tokens x 64 -> 1000 vocabulary."""
    prog = compile_model(small["gpt2_small"], preset("dscs"))
    (head,) = [s.layer for s in prog.steps if isinstance(s, MatStep) and s.layer.op == "Gemm"]
    assert (head.m, head.k, head.n) == (32, 64, 1000)


def test_swish_and_bn_fused_in_efficientnet(small: dict[str, onnx.ModelProto]) -> None:
    """EfficientNet's conv+BN+swish blocks become single matrix steps with a fused Swish (no BN left)."""
    prog = compile_model(small["efficientnet_b0"], preset("dscs"))
    acts = [s.op.act for s in prog.steps if isinstance(s, MatStep)]
    assert acts.count("Swish") >= 10
    assert all(s.layer.op != "BatchNormalization" for s in prog.steps)
    fused_vec = [s for s in prog.steps if isinstance(s, VecStep) and s.fused]
    assert len(fused_vec) == sum(1 for a in acts if a) and all(s.layer.bytes_in == 0 for s in fused_vec)


def _depthwise(channels: int) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((channels, 1, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="dw", group=channels, pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "dw", [helper.make_tensor_value_info("x", F, [1, channels, 4, 4])],
                          [helper.make_tensor_value_info("y", F, None)], [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_depthwise_conv_with_1152_groups() -> None:
    """A 1152-group depthwise conv (EfficientNet's largest) is 1152 GEMMs of 16x9x1, tiled over the groups,
    and computes onnxruntime's result."""
    cfg = AccelConfig(rows=16, cols=16, ifmap_sram=16 * 1024, filter_sram=16 * 1024, ofmap_sram=16 * 1024,
                      precision="fp32")
    prog = compile_model(_depthwise(1152), cfg)
    step = prog.steps[0]
    assert isinstance(step, MatStep)
    assert (step.layer.m, step.layer.k, step.layer.n, step.layer.groups) == (16, 9, 1, 1152)
    assert 1 < len({(t.g0, t.g1) for t in step.tiles}) < 1152
    assert check(prog, "fp32").max_rel_err <= 1e-5


CONFIGS = [AccelConfig(rows=r, cols=c, dataflow=df, ifmap_sram=i, filter_sram=w, ofmap_sram=o, precision=p)
           for (r, c), df, (i, w, o), p in itertools.product(
               [(8, 8), (4, 16)], ["os", "ws", "is"], [(2048, 4096, 1024), (65536, 65536, 65536)], ["int8", "fp32"])]


def _check_tiling(prog: Program) -> None:
    cfg = prog.config
    for s in prog.steps:
        if not isinstance(s, MatStep):
            continue
        lay, eb = s.layer, cfg.element_bytes
        tg, pm, pk, pn = s.padded
        # Double buffering: one tile's padded footprint fits half of each scratchpad.
        assert tg * pm * pk * eb <= cfg.ifmap_sram // 2
        assert tg * pk * pn * eb <= cfg.filter_sram // 2
        assert tg * pm * pn * 4 <= cfg.ofmap_sram // 2
        # Padding to the array: the dims mapped onto rows/columns are whole multiples of them.
        grain = {"os": (cfg.rows, 1, cfg.cols), "ws": (1, cfg.rows, cfg.cols), "is": (cfg.cols, cfg.rows, 1)}
        assert all(p % gr == 0 and p >= t for p, gr, t in zip((pm, pk, pn), grain[cfg.dataflow], s.tile[1:],
                                                              strict=True))
        # The tiles are exactly the grid of the (g, m, k, n) iteration space, each box once.
        axes = [sorted({(t.g0, t.g1) for t in s.tiles}), sorted({(t.m0, t.m1) for t in s.tiles}),
                sorted({(t.k0, t.k1) for t in s.tiles}), sorted({(t.n0, t.n1) for t in s.tiles})]
        for ranges, total in zip(axes, (lay.groups, lay.m, lay.k, lay.n), strict=True):
            assert ranges[0][0] == 0 and ranges[-1][1] == total
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        boxes = {(t.g0, t.m0, t.k0, t.n0) for t in s.tiles}
        assert len(boxes) == len(s.tiles) == int(np.prod([len(a) for a in axes]))
        # k is innermost: each output block's k-splits are consecutive, so partial sums stay on chip.
        for a, b in itertools.pairwise(s.tiles):
            if b.k0 != 0:
                assert (a.g0, a.m0, a.n0, a.k1) == (b.g0, b.m0, b.n0, b.k0)
        # Outputs are stored exactly once, at their element size.
        assert sum(t.store for t in s.tiles) == lay.groups * lay.m * lay.n * eb
        # Every weight is loaded at least once (a block is skipped only while still buffered).
        assert sum(t.load_weight for t in s.tiles) >= lay.groups * lay.k * lay.n * eb


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.rows}x{c.cols}-{c.dataflow}-{c.ifmap_sram}-{c.precision}")
def test_tiles_fit_half_scratchpads_and_cover_each_layer_once(cfg: AccelConfig,
                                                               small: dict[str, onnx.ModelProto]) -> None:
    """For three dataflows, two arrays, two scratchpad sizes and both precisions, yolo's and bert's tiles fit
    double-buffered, are padded to the array, partition the work and store each output once."""
    for name in ("yolo", "bert_base"):
        _check_tiling(compile_model(small[name], cfg))


def test_weight_stationary_loads_each_weight_once_when_k_fits() -> None:
    """Weight-stationary with m innermost: weights cross DRAM exactly once; output-stationary reloads
    them for every m tile when n is split."""
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 48)).astype(np.float32)
    node = helper.make_node("MatMul", ["a", "w"], ["y"], name="mm")
    g = helper.make_graph([node], "mm", [helper.make_tensor_value_info("a", F, a.shape)],
                          [helper.make_tensor_value_info("y", F, None)], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cfg = AccelConfig(rows=8, cols=8, ifmap_sram=1024, filter_sram=2048, ofmap_sram=2048, precision="int8")
    ws = compile_model(model, cfg.with_(dataflow="ws")).steps[0]
    os_ = compile_model(model, cfg.with_(dataflow="os")).steps[0]
    assert isinstance(ws, MatStep) and isinstance(os_, MatStep)
    assert len({(t.k0, t.k1) for t in ws.tiles}) == 1
    assert sum(t.load_weight for t in ws.tiles) == 32 * 48
    m_tiles, n_tiles = len({t.m0 for t in os_.tiles}), len({t.n0 for t in os_.tiles})
    assert n_tiles > 1 and m_tiles > 1
    assert sum(t.load_weight for t in os_.tiles) == 32 * 48 * m_tiles


def test_choose_tile_shrinks_to_fit() -> None:
    """A layer far larger than the scratchpads gets a tile that fits; one that fits whole is one tile."""
    cfg = AccelConfig(rows=8, cols=8, ifmap_sram=4096, filter_sram=4096, ofmap_sram=4096)
    tg, tm, tk, tn = choose_tile(3, 1000, 700, 500, cfg, 1)
    assert tg == 1 and tm * tk <= 2048 and tk * -(-tn // 8) * 8 <= 2048 and -(-tm // 8) * 8 * -(-tn // 8) * 8 * 4 <= 2048
    assert choose_tile(1, 8, 16, 8, preset("dscs"), 1) == (1, 8, 16, 8)


def _model_with(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(nodes[-1].output[0], F, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_unsupported_ops_are_all_named_with_their_nodes() -> None:
    """Every unsupported node is listed, by op type and node name, in one error."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("HardSwish", ["a"], ["b"], name="hs1"),
             helper.make_node("Relu", ["b"], ["c"], name="ok2"),
             helper.make_node("Celu", ["c"], ["d"], name="the_celu")]
    model = _model_with(nodes, [helper.make_tensor_value_info("x", F, [2, 3])])
    with pytest.raises(ConfigError) as e:
        compile_model(model, preset("dscs"))
    msg = str(e.value)
    assert msg.startswith("2 node(s) use op types the accelerator does not support: "
                          "HardSwish (node 'hs1'); Celu (node 'the_celu').")
    assert "Supported: Add, BatchNormalization," in msg


def test_dynamic_dims_are_fixed_or_named() -> None:
    """A non-zoo model's dynamic sequence length must be given; batch comes from batch=."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r")]
    model = _model_with(nodes, [helper.make_tensor_value_info("x", F, ["N", "L", 8])])
    with pytest.raises(ConfigError, match=r"input 'x': dimension 1 \('L'\) is dynamic; give it, e.g. dims=\{'L': 32\}"):
        compile_model(model, preset("dscs"))
    prog = compile_model(model, preset("dscs"), batch=3, dims={"L": 5})
    assert prog.graph.inputs["x"][0] == (3, 5, 8)
    assert prog.layers[0].elements == 3 * 5 * 8 and prog.layers[0].ops == 1


def test_zoo_dims_default_from_the_zoo(small: dict[str, onnx.ModelProto]) -> None:
    """fcn's dynamic H, W default to the zoo's 64x64 and can be overridden."""
    assert compile_model(small["fcn"], preset("dscs")).graph.inputs["image"][0] == (1, 3, 64, 64)
    prog = compile_model(small["fcn"], preset("dscs"), batch=2, dims={"H": 32, "W": 48})
    assert prog.graph.inputs["image"][0] == (2, 3, 32, 48)
    assert prog.graph.shapes["logits"] == (2, 21, 32, 48)


def test_vector_costs_follow_the_table(small: dict[str, onnx.ModelProto]) -> None:
    """MaxPool costs kh*kw per output, GlobalAveragePool h*w+1, views nothing, moves only DRAM bytes."""
    prog = compile_model(small["resnet50"], preset("dscs"))
    vec = {s.layer.op: s.layer for s in prog.steps if isinstance(s, VecStep)}
    assert vec["MaxPool"].ops == 9 and vec["MaxPool"].elements == 8 * 16 * 16
    gap = vec["GlobalAveragePool"]
    assert gap.ops == 2 * 2 + 1
    assert (vec["Flatten"].elements, vec["Flatten"].ops, vec["Flatten"].bytes_in) == (0, 0, 0)
    yolo = compile_model(small["yolo"], preset("dscs"))
    tr = next(s.layer for s in yolo.steps if s.layer.op == "Transpose")
    assert tr.ops == 0 and tr.bytes_in == tr.bytes_out == tr.elements  # int8: one byte each


def test_shape_subgraphs_are_folded(small: dict[str, onnx.ModelProto]) -> None:
    """gpt2's Shape/ConstantOfShape/Trilu mask and vit's Shape chain are evaluated at compile time."""
    for name in ("gpt2_small", "vit_b16", "fcn"):
        ops = {s.layer.op for s in compile_model(small[name], preset("dscs")).steps}
        assert not ops & {"Shape", "ConstantOfShape", "Trilu"}, name


def test_initializers_listed_as_inputs_still_compile() -> None:
    """Older exporters list weights among the graph inputs too; they are constants, not inputs."""
    w = np.random.default_rng(2).standard_normal((100, 3)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "old",
                          [helper.make_tensor_value_info("x", F, [2, 100]), helper.make_tensor_value_info("w", F, [100, 3])],
                          [helper.make_tensor_value_info("y", F, None)], [numpy_helper.from_array(w, "w")])
    prog = compile_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                         preset("dscs").with_(precision="fp32"))
    assert list(prog.graph.inputs) == ["x"]
    assert check(prog, "fp32").max_rel_err <= 1e-5


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(1, 5000), st.integers(1, 5000), st.integers(1, 3000),
       st.sampled_from(["os", "ws", "is"]), st.integers(2, 8), st.integers(2, 8), st.integers(10, 16),
       st.integers(10, 16), st.integers(10, 16), st.sampled_from([1, 4]))
def test_choose_tile_always_fits(g: int, m: int, k: int, n: int, df: str, lr: int, lc: int, li: int, lw: int,
                                 lo: int, eb: int) -> None:
    """Any layer on any array and scratchpads gets a tile within its sides whose padded footprint fits half
    of each scratchpad, or, when not even one padded fold of the array fits, an error saying which buffer."""
    cfg = AccelConfig(rows=2**lr, cols=2**lc, dataflow=df, ifmap_sram=2**li, filter_sram=2**lw,  # type: ignore[arg-type]
                      ofmap_sram=2**lo)
    gm, gk, gn = {"os": (cfg.rows, 1, cfg.cols), "ws": (1, cfg.rows, cfg.cols), "is": (cfg.cols, cfg.rows, 1)}[df]
    if gm * gk * eb > cfg.ifmap_sram // 2 or gk * gn * eb > cfg.filter_sram // 2 or gm * gn * 4 > cfg.ofmap_sram // 2:
        with pytest.raises(ConfigError, match=r"fold needs \d+ bytes of (ifmap|filter|ofmap)_sram, more than half"):
            choose_tile(g, m, k, n, cfg, eb)
        return
    tg, tm, tk, tn = choose_tile(g, m, k, n, cfg, eb)
    assert 1 <= tg <= g and 1 <= tm <= m and 1 <= tk <= k and 1 <= tn <= n
    pm, pk, pn = (-(-tm // gm) * gm, -(-tk // gk) * gk, -(-tn // gn) * gn)
    assert tg * pm * pk * eb <= cfg.ifmap_sram // 2
    assert tg * pk * pn * eb <= cfg.filter_sram // 2
    assert tg * pm * pn * 4 <= cfg.ofmap_sram // 2
