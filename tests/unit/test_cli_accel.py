"""``gfaas accel compile`` and ``gfaas accel run``: JSON documents, options and errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gfaas.accel.arch import preset
from gfaas.accel.compiler import MatStep, compile_model
from gfaas.cli import main
from gfaas.models import zoo


def _out(capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    return json.loads(capsys.readouterr().out)


def test_compile_json_lists_layers_and_stats(capsys: pytest.CaptureFixture[str]) -> None:
    """compile --json: every layer with name/op (matrix: m, k, n, groups), stats consistent with the library."""
    assert main(["accel", "compile", "yolo", "--array", "32x16", "--dataflow", "ws", "--batch", "2", "--json"]) == 0
    doc = _out(capsys)
    assert (doc["config"]["rows"], doc["config"]["cols"], doc["config"]["dataflow"], doc["batch"]) == (32, 16, "ws", 2)
    prog = compile_model(zoo.build("yolo", "small"), preset("dscs").with_(rows=32, cols=16, dataflow="ws"), batch=2)
    assert doc["stats"] == prog.stats()
    mats = [r for r in doc["layers"] if r["unit"] == "matrix"]
    want = [s.layer for s in prog.steps if isinstance(s, MatStep)]
    assert [(r["name"], r["op"], r["m"], r["k"], r["n"], r["groups"]) for r in mats] == \
        [(w.name, w.op, w.m, w.k, w.n, w.groups) for w in want]
    assert sum(r["tiles"] for r in mats) == doc["stats"]["tiles"]


def test_run_json_fp32_matches(capsys: pytest.CaptureFixture[str]) -> None:
    """run --precision fp32 --json: outputs match onnxruntime within 1e-4; layers named in order."""
    assert main(["accel", "run", "bert_base", "--precision", "fp32", "--dim", "L=8", "--json"]) == 0
    doc = _out(capsys)
    assert doc["outputs_match"] is True and 0 < doc["max_rel_err"] <= 1e-4 and doc["precision"] == "fp32"
    assert set(doc["errors"]) == {"hidden", "pooled", "logits"}
    assert {k: doc["layers"][0][k] for k in ("name", "op")} == {"name": "word_emb", "op": "Gather"}
    # The timing model's totals are the per-layer sums; seconds are cycles at the clock.
    assert doc["cycles"] == doc["compute_cycles"] + doc["stall_cycles"] > 0
    assert sum(r["compute_cycles"] for r in doc["layers"]) == doc["compute_cycles"]
    assert sum(r["stall_cycles"] for r in doc["layers"]) == doc["stall_cycles"]
    assert doc["seconds"] == pytest.approx(doc["cycles"] / 1e9)  # dscs preset: 1 GHz
    assert 0 < doc["utilization"] <= 1 and doc["energy_j"] == pytest.approx(sum(doc["energy_breakdown_j"].values()))
    assert all(set(r) == {"name", "op", "compute_cycles", "stall_cycles"} for r in doc["layers"])


def test_run_defaults_to_the_configs_int8(capsys: pytest.CaptureFixture[str]) -> None:
    """The presets are int8: run without --precision emulates int8 and reports its bound."""
    assert main(["accel", "run", "logreg", "--json"]) == 0
    doc = _out(capsys)
    assert doc["precision"] == "int8" and doc["tolerance"] == 0.3 and doc["outputs_match"] is True


def test_onnx_file_and_readable_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An .onnx path compiles; without --json a table with the layer and a summary line is printed."""
    w = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "tiny",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    assert main(["accel", "run", str(path), "--batch", "3", "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "proj" in out and "MatMul" in out and "batch 3" in out
    assert "outputs match onnxruntime" in out


def test_errors_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad --array, an unknown model and an unsupported op exit 1 with the reason on stderr."""
    assert main(["accel", "compile", "logreg", "--array", "8by8"]) == 1
    assert "--array '8by8': write ROWSxCOLS" in capsys.readouterr().err
    assert main(["accel", "compile", "nosuch"]) == 1
    assert "MODEL 'nosuch' is neither an .onnx file nor a zoo model" in capsys.readouterr().err
    g = helper.make_graph([helper.make_node("Celu", ["x"], ["y"], name="c1")], "bad",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    assert main(["accel", "run", str(path)]) == 1
    assert "Celu (node 'c1')" in capsys.readouterr().err
    assert main(["accel", "compile", "logreg", "--dim", "L"]) == 1
    assert "--dim 'L': write NAME=VALUE" in capsys.readouterr().err


def test_config_file_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--config FILE (YAML over a preset), then --array/--dataflow/--precision on top of it."""
    cfg = tmp_path / "drive.yaml"
    cfg.write_text("base: dscs\nname: mydrive\nofmap_sram: 256KiB\n")
    assert main(["accel", "compile", "logreg", "--config", str(cfg), "--array", "16x8", "--dataflow", "is",
                 "--precision", "fp32", "--json"]) == 0
    c = _out(capsys)["config"]
    assert (c["name"], c["ofmap_sram"], c["rows"], c["cols"], c["dataflow"], c["precision"]) == \
        ("mydrive", 256 * 1024, 16, 8, "is", "fp32")
