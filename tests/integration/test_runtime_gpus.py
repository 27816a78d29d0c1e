"""GPU functions in the runtime on a node with modelled GPUs (``gpus='null:0,1'``): the node reports
its GPUs, ``kind: gpu`` functions are placed on them (in turn without a topology), compute stays on
the CPU (modelled GPUs hold no bytes) and outputs are those of a CPU-only runtime. Device passing on
real GPUs is checked by tests/gpu/test_runtime_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from gfaas.errors import ConfigError
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

SPEC = """
name: gpus
inputs: {x: {dtype: float32, shape: [-1]}}
outputs: {out: d.y, a_gpu: a.gpu, a_cuda: a.cuda, b_gpu: b.gpu, b_cuda: b.cuda, c_gpu: c.gpu, c_cuda: c.cuda}
functions:
  - {name: a, kind: cpu, handler: "gpu_handlers:where", inputs: {x: input.x}, outputs: {y: null, gpu: {shape: []}, cuda: {shape: []}}}
  - {name: b, kind: gpu, handler: "gpu_handlers:where", inputs: {x: a.y}, outputs: {y: null, gpu: {shape: []}, cuda: {shape: []}}}
  - {name: c, kind: gpu, handler: "gpu_handlers:where", inputs: {x: b.y}, outputs: {y: null, gpu: {shape: []}, cuda: {shape: []}}}
  - {name: d, kind: gpu, handler: "gpu_handlers:on_device", inputs: {x: c.y}, outputs: {y: null}}
"""


@pytest.fixture
def handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    support = os.path.join(os.path.dirname(__file__), "..", "support")
    monkeypatch.syspath_prepend(support)


def _run(gpus: str) -> tuple[LocalRuntime, dict[str, int], np.ndarray, dict[str, str]]:
    rt = LocalRuntime(RuntimeConfig(executor="inproc", gpus=gpus, sandbox="none", queue_hints=False))
    try:
        rt.deploy(SPEC)
        x = np.arange(5, dtype=np.float32)
        r = rt.invoke("gpus", {"x": x})
        scalars = {k.replace("_", "."): int(v) for k, v in r.outputs.items() if k != "out"}
        return rt, scalars, np.asarray(r.outputs["out"]), rt.placement("gpus")
    finally:
        rt.close()


def test_gpu_functions_are_placed_on_the_nodes_gpus_in_turn(handlers: None) -> None:
    rt, scalars, out, placement = _run("null:0,1")
    assert placement == {"b": "gpu0", "c": "gpu1", "d": "gpu0"}
    # Each function saw its GPU; the CPU function none; modelled GPUs compute on the CPU.
    assert scalars == {"a.gpu": -1, "a.cuda": 0, "b.gpu": 0, "b.cuda": 0, "c.gpu": 1, "c.cuda": 0}
    np.testing.assert_array_equal(out, np.arange(5, dtype=np.float32) + 3)


def test_one_gpu_takes_every_gpu_function(handlers: None) -> None:
    _, scalars, out, placement = _run("null:3")
    assert placement == {"b": "gpu3", "c": "gpu3", "d": "gpu3"}
    assert scalars["b.gpu"] == scalars["c.gpu"] == 3
    np.testing.assert_array_equal(out, np.arange(5, dtype=np.float32) + 3)


def test_without_gpus_functions_run_as_before(handlers: None) -> None:
    for gpus in ("none", "auto"):  # auto: this machine's CUDA GPUs, none on a CPU-only one
        _, scalars, out, placement = _run(gpus)
        if gpus == "auto" and placement:
            pytest.skip("this machine has a CUDA GPU")
        assert placement == {}
        assert scalars["b.gpu"] == scalars["c.gpu"] == -1 and scalars["b.cuda"] == 0
        np.testing.assert_array_equal(out, np.arange(5, dtype=np.float32) + 3)


def test_the_node_reports_its_gpus() -> None:
    with LocalRuntime(RuntimeConfig(executor="inproc", gpus="null:0,1", sandbox="none", queue_hints=False)) as rt:
        admin = rt.nodes.admins["rt0"]
        assert admin.devices == (0, 1) and admin.device_kind == "null"
    with LocalRuntime(RuntimeConfig(executor="inproc", gpus="none", sandbox="none", queue_hints=False)) as rt:
        assert rt.nodes.admins["rt0"].devices == () and rt.nodes.admins["rt0"].device_kind == ""


@pytest.mark.parametrize(("kw", "match"), [
    ({"gpus": "tpu:0"}, r"gpus='tpu:0': .*unknown kind 'tpu'.*'auto'"),
    ({"gpus": "cuda:0,0"}, r"ordinals must be distinct"),
    ({"gpu_passing": "pcie"}, r"gpu_passing='pcie' is not 'device' or 'host'"),
])
def test_bad_gpu_settings_are_refused(kw: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RuntimeConfig(**kw)  # type: ignore[arg-type]



@pytest.mark.parametrize("name", ["video", "traffic"])
def test_several_cuda_gpus_are_shared_out_by_the_policy_on_the_detected_topology(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node reporting several CUDA GPUs: the runtime places a workflow's GPU functions with the
    policy on the machine's detected topology, by the reference workflow's measured edge sizes, as the
    simulator and a configured ``topology`` do. (Modelled GPUs made to report ``cuda``, and a DGX-V100
    standing in for what nvidia-smi would say: no GPU is needed to check the decision.)"""
    from gfaas import workflows as W
    from gfaas.runtime import placement
    from gfaas.runtime.spec import loads
    from gfaas.topology.io import resolve
    from gfaas.workflows.measured import edge_sizes

    v100 = resolve("dgx-v100")
    real = placement.place_gpu_functions
    calls: list[tuple[str, list[str], object]] = []

    def spy(spec, topo, free, sizes=None):  # type: ignore[no-untyped-def]
        calls.append((spec.name, list(free), sizes))
        return real(spec, topo, free, sizes)

    monkeypatch.setattr(placement, "place_gpu_functions", spy)
    gpus = [f"gpu{k}" for k in range(8)]
    with LocalRuntime(RuntimeConfig(executor="inproc", gpus="null:0,1,2,3,4,5,6,7", sandbox="none",
                                    queue_hints=False), edge_sizes=W.measured.edges) as rt:
        rt.nodes.admins["rt0"].device_kind = "cuda"  # what a node with CUDA GPUs reports
        monkeypatch.setattr(rt.deployments, "_detected_topology", lambda: v100)
        spec = loads(W.spec_text(name), check_handlers=False)
        with rt.deployments._lock:
            rt.deployments._place(spec)
        assert calls == [(name, gpus, edge_sizes()[name])]
        assert rt.deployments._gpus[name] == real(spec, v100, gpus, edge_sizes()[name])
