"""Workflows and compute profiles: shapes, sizes and the anchor table they are scaled from."""

from __future__ import annotations

import pytest

from gfaas.errors import ConfigError
from gfaas.sim.profiles import RESNET50_V100_MS, Profile
from gfaas.sim.workflows import WORKFLOWS, DataEdge, Function, Workflow, workflow


def test_every_workflow_is_a_dag_with_known_models() -> None:
    prof = Profile()
    for name in WORKFLOWS:
        wf = workflow(name)
        assert len(wf.topological_order()) == len(wf.functions)
        for f in wf.functions:
            t = prof.seconds(f.model, "V100-16GB" if f.kind == "gpu" else None, f.batch)
            assert 0 < t < 1.0, (name, f.name, t)


def test_patterns_match_the_papers() -> None:
    assert workflow("video").pattern == "fan-in" and len(workflow("video").preds("recognise")) == 4
    assert workflow("image").pattern == "fan-out + fan-in" and len(workflow("image").succs("denoise")) == 3
    assert dict(workflow("traffic").conditions) == {("detect", "num_persons"): 0.6, ("detect", "num_vehicles"): 0.8}


def test_resnet50_reproduces_its_anchor_and_others_scale_by_flops() -> None:
    prof = Profile()
    for batch, ms in RESNET50_V100_MS:
        assert prof.gpu_ms("resnet50", "V100-16GB", batch) == pytest.approx(ms)
    # resnet101 has 7.8/4.1 the FLOPs: batch 8 costs what 15.2 ResNet-50 samples cost (interpolated).
    expected = 11.5 + (16.07 - 11.5) * (8 * 7.8 / 4.1 - 8) / 8
    assert prof.gpu_ms("resnet101", "V100-16GB", 8) == pytest.approx(expected)
    assert prof.gpu_ms("resnet50", "A100-40GB", 8) == pytest.approx(11.5 / 2.56)


def test_cycles_and_bad_names_are_refused() -> None:
    f = [Function("a", "gpu", "resnet50"), Function("b", "gpu", "resnet50")]
    with pytest.raises(ConfigError, match="cycle"):
        Workflow("loop", "sequence", tuple(f), (DataEdge("a", "b", 1), DataEdge("b", "a", 1)))
    with pytest.raises(ConfigError, match="'c'"):
        Workflow("bad", "sequence", tuple(f), (DataEdge("a", "c", 1),))
    with pytest.raises(ConfigError, match="nope"):
        workflow("nope")
    with pytest.raises(ConfigError, match="tpu"):
        Profile().gpu_ms("resnet50", "tpu", 1)
