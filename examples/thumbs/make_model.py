"""Make the thumbs example's model and a photo to try it on: ``python make_model.py``.

Writes ``package/models/classifier.onnx``, a small CNN (conv 3x3 -> ReLU -> global average pool ->
linear, 10 classes) with seeded random weights, and ``photo.npy``, a seeded 240 x 320 RGB image. It
stands in for exporting a model of your own (``torch.onnx.export(net, example, "classifier.onnx",
input_names=["x"], output_names=["logits"])``): any ONNX file with float32 or int64 inputs will do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent


def classifier(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.5).astype(np.float32), "conv_w")
    b = numpy_helper.from_array(np.zeros(16, np.float32), "conv_b")
    fc = numpy_helper.from_array((rng.standard_normal((16, 10)) * 0.5).astype(np.float32), "fc_w")
    fcb = numpy_helper.from_array((rng.standard_normal(10) * 0.1).astype(np.float32), "fc_b")
    nodes = [helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"])]
    graph = helper.make_graph(nodes, "thumbs-classifier",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                              [w, b, fc, fcb])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="gfaas-example")
    model.ir_version = 8  # readable by every onnxruntime gfaas supports
    onnx.checker.check_model(model)
    return model


def main() -> None:
    out = HERE / "package" / "models" / "classifier.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(classifier(), out)
    photo = np.random.default_rng(1).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    photo[:, :160] //= 2  # a darker left half, so the picture is not uniform noise
    np.save(HERE / "photo.npy", photo)
    print(f"wrote {out.relative_to(HERE)} ({out.stat().st_size:,} bytes) and photo.npy (240x320 RGB)")


if __name__ == "__main__":
    main()
