"""The runtime on a real GPU: the zoo's models by the torch engine against onnxruntime, and the six
reference workflows with device passing (inputs delivered onto the GPU, model outputs left in the
node's GPU pool) giving the reference executor's outputs. Run with ``make test-gpu``; skipped, with
the reason, without a CUDA GPU, torch or onnx2torch."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the GPU image has it; else pip install 'gfaas[torch]')")
pytest.importorskip("onnx2torch", reason="needs onnx2torch: carry its wheel (docs/gpu.md)")
pytest.importorskip("onnx", reason="needs onnx (the zoo builds its graphs with it): carry its wheel (docs/gpu.md)")

from gfaas import models  # noqa: E402
from gfaas import workflows as W  # noqa: E402
from gfaas.dataplane.device_array import DeviceArray  # noqa: E402
from gfaas.runtime.local import LocalRuntime, RuntimeConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
from outputs import same_output  # noqa: E402


@pytest.mark.parametrize("name", models.names())
def test_zoo_on_the_gpu_matches_onnxruntime(name: str) -> None:
    ref = models.load(name)
    gpu = models.load(name, device="cuda:0")
    assert gpu.engine == "torch"
    feeds = ref.example_inputs(batch=2, seed=5)
    want = ref(**feeds)
    out = gpu.run_device(**feeds)
    for k, w in want.items():
        assert isinstance(out[k], DeviceArray) and out[k].tensor.is_cuda
        got = np.asarray(out[k])
        assert got.shape == w.shape and got.dtype == w.dtype
        assert float(np.max(np.abs(got - w))) <= 1e-3 * (float(np.max(np.abs(w))) or 1.0), (name, k)


@pytest.fixture(scope="module")
def reference() -> dict[str, dict[str, Any]]:
    return {name: W.run_local(name, seed=3, scale="small") for name in W.names()}


def _runtime(passing: str) -> LocalRuntime:
    rt = LocalRuntime(RuntimeConfig(scale="small", gpus="cuda:0", gpu_passing=passing))  # type: ignore[arg-type]
    for name in W.names():
        rt.deploy(W.spec_text(name))
    return rt


@pytest.fixture(scope="module")
def device_rt() -> Iterator[LocalRuntime]:
    with _runtime("device") as rt:
        yield rt


@pytest.mark.parametrize("name", W.names())
def test_workflows_on_the_gpu_match_the_reference(device_rt: LocalRuntime, reference: dict[str, dict[str, Any]],
                                                  name: str) -> None:
    res = device_rt.invoke(name, W.make_inputs(name, seed=3, scale="small"), timeout=300)
    assert res.ok, res.error
    for key, want in reference[name]["outputs"].items():
        assert same_output(res.outputs[key], want, rtol=1e-3, atol=1e-4), f"{name}.{key} differs"


def test_device_passing_kept_data_on_the_gpu(device_rt: LocalRuntime) -> None:
    for name in ("driving", "video", "yelp"):
        assert device_rt.invoke(name, W.make_inputs(name, seed=4, scale="small"), timeout=300).ok
    st = next(iter(device_rt.node_stats().values()))
    assert st["device_objects"] > 0  # segment's logits went into the GPU pool
    assert st["deliveries_to_device"] > 0  # crops and token rows were delivered onto the GPU
    assert st["deliveries_to_host"] > 0  # colour (a CPU function) read the logits from the GPU


def test_host_passing_gives_the_same_outputs(device_rt: LocalRuntime) -> None:
    with _runtime("host") as host_rt:
        for name in W.names():
            inputs = W.make_inputs(name, seed=3, scale="small")
            a, b = device_rt.invoke(name, inputs, timeout=300), host_rt.invoke(name, inputs, timeout=300)
            assert a.ok and b.ok, (a.error, b.error)
            for key in a.outputs:
                np.testing.assert_array_equal(np.asarray(a.outputs[key]), np.asarray(b.outputs[key]), err_msg=name)
        st = next(iter(host_rt.node_stats().values()))
        assert st["device_objects"] == 0 and st["deliveries_to_device"] == 0
