"""``gfaas demo --gpu``'s plumbing on a modelled GPU (``gpus='null:0'``: placement, both runtimes,
three modes, the output comparison, the results file), and its refusal without a GPU. The numbers
need a CUDA GPU (``make demo-gpu``, docs/gpu.md); here only their structure is checked."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gfaas import demo_gpu
from gfaas.runtime import gpus


def _ns(tmp: Path, **kw: object) -> argparse.Namespace:
    base = {"scale": "small", "requests": 2, "workflows": "social", "gpus": "null:0", "json": True,
            "out": str(tmp / "out"), "results": str(tmp / "demo-gpu.json")}
    return argparse.Namespace(**{**base, **kw})


def test_refuses_without_a_cuda_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo_gpu.run(_ns(tmp_path)) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_three_modes_on_a_modelled_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(demo_gpu, "gpu_name", lambda: "modelled GPU (test)")
    monkeypatch.setattr(gpus, "visible_cuda_gpus", lambda: 1)
    assert demo_gpu.run(_ns(tmp_path)) == 0
    doc = json.loads((tmp_path / "demo-gpu.json").read_text())
    assert doc == json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["device"] == "modelled GPU (test)" and doc["workflows"] == ["social"]
    assert set(doc["stats"]) == set(demo_gpu.MODES)
    for mode in demo_gpu.MODES:
        row = doc["stats"][mode]["social"]
        assert row["requests"] == 2 and row["failed"] == 0 and row["pass_ms"] > 0
    r = doc["ratios"]["social"]
    assert r["redis_over_device"] == pytest.approx(doc["stats"]["redis"]["social"]["pass_ms"]
                                                   / doc["stats"]["gfaas-device"]["social"]["pass_ms"])
    assert doc["outputs_close"] and not doc["problems"]
    assert doc["provenance"]["commit"] and doc["target"]["met"] == {}  # video and driving did not run
    assert json.loads(capsys.readouterr().out) == doc


def _res(ok: bool = True, **outputs: np.ndarray) -> SimpleNamespace:
    return SimpleNamespace(ok=ok, outputs=outputs, error=None if ok else "boom")


def test_output_comparison_tells_identical_close_and_different() -> None:
    a = np.array([1.0, 2.0], np.float32)
    same = {"gfaas-device": {"w": [_res(x=a)]}, "redis": {"w": [_res(x=a.copy())]}, "gfaas-host": {"w": [_res(x=a)]}}
    assert demo_gpu.compare_outputs(same) == (True, True, [])
    near = {**same, "redis": {"w": [_res(x=a + 1e-7)]}}
    assert demo_gpu.compare_outputs(near)[:2] == (False, True)
    far = {**same, "gfaas-host": {"w": [_res(x=a + 1)]}}
    identical, close, problems = demo_gpu.compare_outputs(far)
    assert (identical, close) == (False, False) and problems == ["w.x via gfaas-host differs from gfaas-device"]
    failed = {**same, "redis": {"w": [_res(ok=False)]}}
    assert demo_gpu.compare_outputs(failed)[2] == ["w request 0 via redis failed: boom"]
