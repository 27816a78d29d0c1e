"""The six reference workflows with their models run by the torch engine, as on a GPU, against the
onnxruntime reference executor (skipped without torch).

A CPU-only machine has no CUDA device, so the GPU functions' models run on torch's CPU device
here: model outputs are :class:`~gfaas.dataplane.device_array.DeviceArray` (``run_device``), which
the handlers join, pass on and read exactly as on a GPU; only where the bytes sit differs.
tests/gpu/test_runtime_gpu.py runs the same workflows on a real GPU with device passing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gfaas import models
from gfaas import workflows as W
from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.runtime.spec import loads

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
from outputs import same_output  # noqa: E402

pytest.importorskip("onnx2torch", reason="needs torch and onnx2torch: pip install 'gfaas[torch]'")
pytest.importorskip("torch", reason="needs torch and onnx2torch: pip install 'gfaas[torch]'")


@pytest.fixture(scope="module")
def reference() -> dict[str, dict[str, Any]]:
    return {name: W.run_local(name, seed=3, scale="small") for name in W.names()}  # onnxruntime


@pytest.fixture(scope="module")
def rt(reference: dict[str, dict[str, Any]]) -> Iterator[LocalRuntime]:
    mp = pytest.MonkeyPatch()
    real = models.load
    mp.setattr(models, "load", lambda *a, **kw: real(*a, **{**kw, "engine": "torch"}))
    try:
        with LocalRuntime(RuntimeConfig(scale="small", executor="inproc", sandbox="none", gpus="none")) as r:
            for name in W.names():
                r.deploy(W.spec_text(name))
            yield r
    finally:
        mp.undo()


@pytest.mark.parametrize("name", W.names())
def test_torch_engine_matches_the_onnxruntime_reference(rt: LocalRuntime, reference: dict[str, dict[str, Any]],
                                                        name: str) -> None:
    ref = reference[name]
    res = rt.invoke(name, W.make_inputs(name, seed=3, scale="small"), timeout=120)
    assert res.ok, res.error
    gpu_fns = {f.name for f in loads(W.spec_text(name)).functions if f.kind == "gpu" and f.model}
    assert gpu_fns and all(rt.deployments.pools[f"{name}/{f}"].slots[0]._host.model.engine == "torch" for f in gpu_fns)
    for key, want in ref["outputs"].items():
        # two engines: float rounding differs, not the result
        assert same_output(res.outputs[key], want, rtol=1e-3, atol=1e-4), f"{name}.{key} differs"
