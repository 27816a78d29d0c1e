"""The zoo's graphs run by torch (how GPU functions run their models), checked against onnxruntime.

torch runs the same ONNX graphs on the CPU as on a GPU, so these tests check the conversion and the
feed handling wherever torch is installed; ``tests/gpu/test_torch_models.py`` repeats the oracle check
on a GPU. Without torch (the default install), only the missing-dependency error is checked.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from gfaas import models
from gfaas.errors import ConfigError, DependencyMissing

TORCH_REASON = "needs torch and onnx2torch: pip install 'gfaas[torch]'"


def test_missing_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # an import of torch now fails, as without it
    with pytest.raises(DependencyMissing, match=r"gfaas\[torch\]"):
        models.load("logreg", engine="torch")


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(ConfigError, match="engine 'tensorrt'"):
        models.load("logreg", engine="tensorrt")


def test_shared_weights_need_onnxruntime() -> None:
    with pytest.raises(ConfigError, match="shared=False"):
        models.load("logreg", engine="torch", shared=True)


@pytest.fixture(scope="module")
def torch():  # type: ignore[no-untyped-def]
    pytest.importorskip("onnx2torch", reason=TORCH_REASON)
    return pytest.importorskip("torch", reason=TORCH_REASON)


@pytest.mark.parametrize("name", models.names())
def test_torch_outputs_match_onnxruntime(torch, name: str) -> None:  # type: ignore[no-untyped-def]
    ref = models.load(name)
    got = models.load(name, engine="torch")
    assert got.engine == "torch" and ref.engine == "onnxruntime"
    feeds = ref.example_inputs(batch=2, seed=3)
    want, out = ref(**feeds), got(**feeds)
    assert list(out) == list(want)
    for k in want:
        assert out[k].dtype == want[k].dtype and out[k].shape == want[k].shape
        scale = float(np.max(np.abs(want[k]))) or 1.0
        assert float(np.max(np.abs(out[k] - want[k]))) <= 1e-4 * scale, (name, k)


def test_device_outputs_stay_tensors_and_read_as_numpy(torch) -> None:  # type: ignore[no-untyped-def]
    from gfaas.dataplane.device_array import DeviceArray

    m = models.load("resnet50", engine="torch")
    feeds = m.example_inputs()
    dev = m.run_device(**feeds)
    logits = dev["logits"]
    assert isinstance(logits, DeviceArray) and isinstance(logits.tensor, torch.Tensor)
    assert logits.shape == (1, 1000) and logits.dtype == np.float32 and logits.ndim == 2
    np.testing.assert_array_equal(np.asarray(logits), m(**feeds)["logits"])
    # A device output fed back in is used where it is: no copy of its storage.
    image = DeviceArray(torch.from_numpy(feeds["image"]))
    assert m.session.tensor(image).data_ptr() == image.tensor.data_ptr()
    np.testing.assert_array_equal(np.asarray(m.run_device(image=image)["logits"]), np.asarray(logits))


def test_device_feeds_are_checked_like_host_feeds(torch) -> None:  # type: ignore[no-untyped-def]
    m = models.load("bert_base", engine="torch")
    feeds = m.example_inputs()
    with pytest.raises(ConfigError, match="dtype int32, expected int64"):
        m(input_ids=torch.from_numpy(feeds["input_ids"]).int(), attention_mask=torch.from_numpy(feeds["attention_mask"]))
    bad = feeds["input_ids"].copy()
    bad[0, 1] = m.info.vocab_size
    with pytest.raises(ConfigError, match=f"token id {m.info.vocab_size} is outside the vocabulary"):
        m(input_ids=torch.from_numpy(bad), attention_mask=torch.from_numpy(feeds["attention_mask"]))
    mask = feeds["attention_mask"].copy()
    mask[0, 0] = 2
    with pytest.raises(ConfigError, match="attention_mask must hold only 0"):
        m(input_ids=torch.from_numpy(feeds["input_ids"]), attention_mask=torch.from_numpy(mask))


@pytest.mark.parametrize(("upper", "k"), [(0, None), (1, None), (0, 1), (1, -1)])
def test_trilu_converter_matches_numpy(torch, upper: int, k: int | None) -> None:  # type: ignore[no-untyped-def]
    import onnx
    import onnx2torch
    from onnx import TensorProto, helper, numpy_helper

    from gfaas.models import torch_engine

    torch_engine._import()
    inputs = ["x"] + (["k"] if k is not None else [])
    inits = [numpy_helper.from_array(np.array(k, np.int64), "k")] if k is not None else []
    g = helper.make_graph([helper.make_node("Trilu", inputs, ["y"], upper=upper)], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.arange(20, dtype=np.float32).reshape(4, 5) + 1
    y = onnx2torch.convert(onnx.load_from_string(model.SerializeToString()))(torch.from_numpy(x)).numpy()
    want = (np.triu if upper else np.tril)(x, k or 0)
    np.testing.assert_array_equal(y, want)


def test_a_users_onnx_file_runs_on_the_torch_engine_too(torch) -> None:  # type: ignore[no-untyped-def]
    from gfaas.models.files import load_file

    path = models.path("resnet50")  # any ONNX file: a zoo graph here
    ref, got = load_file(path), load_file(path, engine="torch")
    assert (ref.engine, got.engine, got.info.scale) == ("onnxruntime", "torch", "file")
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64), dtype=np.float32)
    want = ref(image=x)["logits"]
    assert float(np.max(np.abs(got(image=x)["logits"] - want))) <= 1e-4 * float(np.max(np.abs(want)))
