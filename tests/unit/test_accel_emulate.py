"""Functional emulation of compiled accelerator programs against onnxruntime and numpy oracles."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gfaas.accel import quant
from gfaas.accel.arch import AccelConfig, preset
from gfaas.accel.compiler import MatStep, compile_model
from gfaas.accel.emulate import FP32_TOLERANCE, INT8_TOLERANCE, check, emulate, example_inputs, rel_err
from gfaas.models import zoo

F, I64 = TensorProto.FLOAT, TensorProto.INT64
#: Scratchpads of 1 KiB and a 4x4 array: every matrix layer is cut into many tiles and k-splits.
TINY = AccelConfig(rows=4, cols=4, vector_lanes=4, ifmap_sram=1024, filter_sram=1024, ofmap_sram=1024,
                   precision="fp32")
ISSUE_OPS = {"Conv", "BatchNormalization", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Exp", "Mul", "Add",
             "Sub", "MatMul", "Gemm", "Softmax", "LayerNormalization", "MaxPool", "GlobalAveragePool", "Flatten",
             "Reshape", "Transpose", "Concat", "Split", "Slice", "Gather", "Expand", "Shape", "Cast", "Unsqueeze",
             "Trilu", "ConstantOfShape", "Resize", "Identity"}

_rng = np.random.default_rng(7)


def _r(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


def _i(*vals: Any) -> np.ndarray:
    return np.array(vals, dtype=np.int64)


# op, runtime inputs, constant inputs (None = omitted optional input), attrs, output dtypes, extra nodes
CASES: dict[str, tuple[str, dict[str, np.ndarray], dict[str, np.ndarray | None], dict[str, Any], list[int]]] = {
    "Conv_grouped_strided": ("Conv", {"x": _r(1, 4, 7, 7)}, {"w": _r(6, 2, 3, 3), "b": _r(6)},
                             {"group": 2, "strides": [2, 2], "pads": [1, 0, 1, 2]}, [F]),
    "Conv_depthwise": ("Conv", {"x": _r(1, 8, 5, 5)}, {"w": _r(8, 1, 3, 3)}, {"group": 8, "pads": [1, 1, 1, 1]}, [F]),
    "Conv_patch16": ("Conv", {"x": _r(2, 3, 32, 32)}, {"w": _r(5, 3, 16, 16), "b": _r(5)},
                     {"strides": [16, 16]}, [F]),
    "BatchNormalization": ("BatchNormalization", {"x": _r(1, 3, 4, 4)},
                           {"s": _r(3), "b": _r(3), "m": _r(3), "v": np.abs(_r(3)) + 0.5}, {}, [F]),
    "Identity": ("Identity", {"x": _r(2, 3)}, {}, {}, [F]),
    "Relu": ("Relu", {"x": _r(2, 3, 4)}, {}, {}, [F]),
    "LeakyRelu": ("LeakyRelu", {"x": _r(2, 3, 4)}, {}, {"alpha": 0.2}, [F]),
    "Sigmoid": ("Sigmoid", {"x": _r(2, 3, 4)}, {}, {}, [F]),
    "Tanh": ("Tanh", {"x": _r(2, 3, 4)}, {}, {}, [F]),
    "Erf": ("Erf", {"x": _r(2, 3, 4)}, {}, {}, [F]),
    "Exp": ("Exp", {"x": _r(2, 3, 4)}, {}, {}, [F]),
    "Mul": ("Mul", {"x": _r(2, 3, 4), "y": _r(3, 4)}, {}, {}, [F]),
    "Add": ("Add", {"x": _r(2, 3, 4), "y": _r(1, 4)}, {}, {}, [F]),
    "Sub": ("Sub", {"x": _r(2, 1, 4), "y": _r(3, 1)}, {}, {}, [F]),
    "MatMul_batched4d": ("MatMul", {"a": _r(2, 3, 5, 7), "b": _r(2, 3, 7, 4)}, {}, {}, [F]),
    "MatMul_weights": ("MatMul", {"a": _r(3, 5, 9)}, {"w": _r(9, 6)}, {}, [F]),
    "Gemm_transB": ("Gemm", {"a": _r(5, 7)}, {"w": _r(4, 7), "c": _r(4)},
                    {"transB": 1, "alpha": 0.5, "beta": 2.0}, [F]),
    "Softmax": ("Softmax", {"x": _r(2, 3, 4)}, {}, {"axis": 1}, [F]),
    "LayerNormalization": ("LayerNormalization", {"x": _r(2, 3, 8)}, {"s": _r(8), "b": _r(8)},
                           {"epsilon": 1e-5}, [F]),
    "MaxPool": ("MaxPool", {"x": _r(1, 2, 7, 7)}, {}, {"kernel_shape": [3, 3], "strides": [2, 2],
                                                      "pads": [1, 1, 1, 1]}, [F]),
    "GlobalAveragePool": ("GlobalAveragePool", {"x": _r(1, 3, 4, 5)}, {}, {}, [F]),
    "Flatten": ("Flatten", {"x": _r(2, 3, 4)}, {}, {"axis": 2}, [F]),
    "Reshape": ("Reshape", {"x": _r(2, 3, 4)}, {"s": _i(0, -1)}, {}, [F]),
    "Transpose": ("Transpose", {"x": _r(2, 3, 4)}, {}, {"perm": [2, 0, 1]}, [F]),
    "Concat": ("Concat", {"x": _r(2, 3), "y": _r(2, 5)}, {}, {"axis": 1}, [F]),
    "Split": ("Split", {"x": _r(2, 6)}, {"s": _i(2, 4)}, {"axis": 1}, [F, F]),
    "Slice": ("Slice", {"x": _r(4, 6)}, {"st": _i(1, -4), "en": _i(3, 100), "ax": _i(0, 1), "sp": _i(1, 2)}, {}, [F]),
    "Gather": ("Gather", {"ids": _i([0, 4], [3, 2])}, {"table": _r(5, 4)}, {}, [F]),
    "Expand": ("Expand", {"x": _r(3, 1)}, {"s": _i(2, 3, 4)}, {}, [F]),
    "Shape": ("Shape", {"x": _r(2, 3, 4)}, {}, {"start": 1}, [I64]),
    "Cast": ("Cast", {"x": _i([1, 0, 3])}, {}, {"to": F}, [F]),
    "Unsqueeze": ("Unsqueeze", {"x": _r(2, 3)}, {"a": _i(0, 3)}, {}, [F]),
    "Trilu": ("Trilu", {"x": _r(4, 5)}, {"k": np.array(1, np.int64)}, {"upper": 0}, [F]),
    "ConstantOfShape": ("ConstantOfShape", {}, {"s": _i(2, 3)},
                        {"value": numpy_helper.from_array(np.array([1.5], np.float32))}, [F]),
    "Resize_nearest": ("Resize", {"x": _r(1, 2, 3, 4)}, {"roi": None, "sc": np.array([1, 1, 2, 2], np.float32)},
                       {"mode": "nearest"}, [F]),
    "Resize_linear": ("Resize", {"x": _r(1, 2, 3, 4)}, {"roi": None, "sc": None, "sz": _i(1, 2, 5, 7)},
                      {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}, [F]),
}


def single_node_model(op: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray | None],
                      attrs: dict[str, Any], out_types: list[int]) -> onnx.ModelProto:
    names = list(inputs) + [k if v is not None else "" for k, v in consts.items()]
    # Runtime inputs first, then constants, in the order the op takes them (Gather: data before ids).
    if op == "Gather":
        names = ["table", "ids"]
    outs = [f"y{i}" for i in range(len(out_types))]
    node = helper.make_node(op, names, outs, name=f"the_{op.lower()}", **attrs)
    g = helper.make_graph(
        [node], "t",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types, strict=True)],
        [numpy_helper.from_array(v, k) for k, v in consts.items() if v is not None])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_every_issue_op_has_a_case() -> None:
    """The per-op oracle below covers all 32 op types the zoo uses (the issue's 31 names and Identity)."""
    assert {c[0] for c in CASES.values()} >= ISSUE_OPS
    assert len(ISSUE_OPS) == 32


@pytest.mark.parametrize("case", sorted(CASES))
def test_single_op_matches_onnxruntime(case: str) -> None:
    """Each supported op, as a one-node graph compiled for a tiny array, gives onnxruntime's output."""
    op, inputs, consts, attrs, outs = CASES[case]
    prog = compile_model(single_node_model(op, inputs, consts, attrs, outs), TINY)
    res = check(prog, "fp32", inputs=inputs)
    assert set(res.outputs) == {f"y{i}" for i in range(len(outs))}
    for name, y in res.outputs.items():
        assert y.shape == res.reference[name].shape, name
        assert y.dtype == res.reference[name].dtype, name
    assert res.max_rel_err <= 1e-5, res.errors


SMALL_ZOO = ["resnet50", "yolo", "fcn", "efficientnet_b0", "vit_b16", "bert_base", "gpt2_small", "logreg"]


@pytest.fixture(scope="module")
def zoo_models() -> dict[str, onnx.ModelProto]:
    return {n: zoo.build(n, "small") for n in SMALL_ZOO}


@pytest.mark.parametrize("name", SMALL_ZOO)
def test_zoo_fp32_matches_onnxruntime_through_many_tiles(name: str, zoo_models: dict[str, onnx.ModelProto]) -> None:
    """All eight small zoo models, compiled for 4 KiB scratchpads on an 8x8 weight-stationary array (hundreds
    of tiles and k-splits), match onnxruntime within 1e-4."""
    cfg = AccelConfig(rows=8, cols=8, dataflow="ws", ifmap_sram=4096, filter_sram=4096, ofmap_sram=4096,
                      precision="fp32")
    prog = compile_model(zoo_models[name], cfg)
    assert name == "logreg" or prog.stats()["tiles"] > 100
    res = check(prog, "fp32")
    assert res.outputs_match and res.max_rel_err <= FP32_TOLERANCE == 1e-4, res.errors


@pytest.mark.parametrize("name", ["resnet50", "bert_base", "yolo"])
def test_zoo_int8_within_the_stated_bound(name: str, zoo_models: dict[str, onnx.ModelProto]) -> None:
    """int8 emulation stays within the stated model-level bound, and is not fp32 in disguise."""
    prog = compile_model(zoo_models[name], preset("dscs"))
    res = check(prog, "int8")
    assert res.max_rel_err <= INT8_TOLERANCE == 0.3 and res.outputs_match
    assert res.max_rel_err > 1e-3  # quantisation really happened


def _matmul_program(a: np.ndarray, w: np.ndarray, cfg: AccelConfig):  # type: ignore[no-untyped-def]
    model = single_node_model("MatMul", {"a": a}, {"w": w}, {}, [F])
    return compile_model(model, cfg)


def test_k_split_accumulation_equals_numpy() -> None:
    """A 37x300 @ 300x45 product cut into k-splits accumulates to numpy's float64 product."""
    a, w = _r(37, 300), _r(300, 45)
    prog = _matmul_program(a, w, TINY)
    step = prog.steps[0]
    assert isinstance(step, MatStep)
    ksplits = {(t.k0, t.k1) for t in step.tiles}
    assert len(ksplits) > 2 and sum(k1 - k0 for k0, k1 in ksplits) == 300
    y = emulate(prog, {"a": a})["y0"]
    assert rel_err(y, a.astype(np.float64) @ w.astype(np.float64)) < 1e-5


@pytest.mark.parametrize("bug", ["shift_k", "shift_n", "drop_k_split", "shift_m"])
def test_a_tiling_bug_changes_the_outputs(bug: str) -> None:
    """Emulation really reads each tile's offsets: corrupting one tile's range makes the output wrong."""
    a, w = _r(37, 300), _r(300, 45)
    prog = _matmul_program(a, w, TINY)
    step = prog.steps[0]
    assert isinstance(step, MatStep)
    good = emulate(prog, {"a": a})["y0"]
    tiles = list(step.tiles)
    i = next(j for j, t in enumerate(tiles) if t.k0 > 0 and t.n0 > 0 and t.m0 > 0)
    t = tiles[i]
    if bug == "shift_k":
        tiles[i] = dataclasses.replace(t, k0=t.k0 - 1, k1=t.k1 - 1)
    elif bug == "shift_n":
        tiles[i] = dataclasses.replace(t, n0=t.n0 - 1, n1=t.n1 - 1)
    elif bug == "drop_k_split":
        del tiles[i]
    else:
        tiles[i] = dataclasses.replace(t, m0=t.m0 - 1, m1=t.m1 - 1)
    step.tiles = tiles
    bad = emulate(prog, {"a": a})["y0"]
    assert rel_err(bad, good) > 1e-3


def test_int8_layer_error_within_the_analytic_bound() -> None:
    """One int8 matrix layer's error never exceeds k * (|a| s_w / 2 + |w| s_a / 2 + s_a s_w / 4)."""
    for seed in range(5):
        rng = np.random.default_rng(seed)
        a = rng.standard_normal((20, 64)).astype(np.float32) * rng.uniform(0.1, 10)
        w = rng.standard_normal((64, 12)).astype(np.float32)
        prog = _matmul_program(a, w, TINY.with_(precision="int8"))
        y8 = emulate(prog, {"a": a}, "int8")["y0"]
        exact = a.astype(np.float64) @ w
        err = float(np.max(np.abs(y8 - exact)))
        assert 0 < err <= quant.layer_error_bound(a, w, 64)


def test_int8_accumulation_is_integer_exact() -> None:
    """int8 results are exactly (sum of int8 x int8 products) x s_a x s_w per column, over all k-splits."""
    a, w = _r(9, 150), _r(150, 7)
    prog = _matmul_program(a, w, TINY.with_(precision="int8"))
    y8 = emulate(prog, {"a": a}, "int8")["y0"]
    qa, sa = quant.quantise_per_tensor(a)
    qw, sw = quant.quantise_per_column(w[None])
    expect = (qa @ qw[0]) * sa * sw[0]
    np.testing.assert_allclose(y8, expect.astype(np.float32), rtol=1e-6, atol=1e-6)


def test_example_inputs_index_within_the_table(zoo_models: dict[str, onnx.ModelProto]) -> None:
    """Token ids stay within the embedding table; masks are 0/1."""
    prog = compile_model(zoo_models["bert_base"], preset("dscs"))
    x = example_inputs(prog.graph, seed=3)
    assert x["input_ids"].dtype == np.int64 and x["input_ids"].min() >= 0 and x["input_ids"].max() < 1000
    assert set(np.unique(x["attention_mask"])) <= {0, 1}


def test_wrong_input_shape_is_named() -> None:
    """An input of another shape than compiled for is refused with both shapes."""
    prog = _matmul_program(_r(3, 4), _r(4, 2), TINY)
    with pytest.raises(Exception, match=r"input 'a' has shape \(5, 4\); the program was compiled for \(3, 4\)"):
        emulate(prog, {"a": _r(5, 4)})
