"""GPU functions under the Ray executor: a ``kind: gpu`` function's actor asks Ray for the GPUs its spec
declares (a whole one by default, 0.5 to share one) and computes on the GPU Ray assigned it. Run on a
local Ray that models two GPUs (``ray.init(num_gpus=2)``: Ray accepts that without GPUs) beside a node
with modelled GPUs (``gpus='null:0,1'``): the same requests and assignments, the CPU computes. The
handler reports what its actor got, from Ray and from its context."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from gfaas.runtime.local import LocalRuntime, RuntimeConfig

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'gfaas[ray]')")

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = "outputs: {y: null, ray_gpu: {shape: []}, share: {shape: []}, visible: {shape: []}, gpu: {shape: []}, cuda: {shape: []}}"
WHOLE = f"""
name: raygpu
inputs: {{x: null}}
outputs: {{y: g.y, c_ray_gpu: c.ray_gpu, c_share: c.share, c_gpu: c.gpu, g_ray_gpu: g.ray_gpu, g_share: g.share,
          g_visible: g.visible, g_gpu: g.gpu, g_cuda: g.cuda}}
functions:
  - {{name: c, kind: cpu, handler: "test_ray_gpus:report", inputs: {{x: input.x}}, {REPORT}}}
  - {{name: g, kind: gpu, handler: "test_ray_gpus:report", inputs: {{x: c.y}}, {REPORT}}}
"""
HALVES = f"""
name: rayhalves
inputs: {{x: null}}
outputs: {{y: h2.y, h1_ray_gpu: h1.ray_gpu, h1_share: h1.share, h1_gpu: h1.gpu,
          h2_ray_gpu: h2.ray_gpu, h2_share: h2.share, h2_gpu: h2.gpu}}
functions:
  - {{name: h1, kind: gpu, handler: "test_ray_gpus:report", inputs: {{x: input.x}}, resources: {{gpus: 0.5}}, {REPORT}}}
  - {{name: h2, kind: gpu, handler: "test_ray_gpus:report", inputs: {{x: h1.y}}, resources: {{gpus: 0.5}}, {REPORT}}}
"""


def report(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """y = x + 1, and what this function's actor got: Ray's GPU id (-1: none), the GPU share Ray
    reserved for it, its CUDA_VISIBLE_DEVICES (-1: unset or empty), and the GPU and device its context names."""
    import ray as r

    ids = r.get_gpu_ids()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return {"y": ctx.get(inputs["x"]) + 1, "ray_gpu": np.int64(int(ids[0]) if ids else -1),
            "share": np.float64(r.get_runtime_context().get_assigned_resources().get("GPU", 0.0)),
            "visible": np.int64(int(visible) if visible.isdigit() else -1),
            "gpu": np.int64(int(ctx.gpu[3:]) if ctx.gpu else -1), "cuda": np.int64(ctx.device.startswith("cuda"))}


class Holder:
    """An actor that only holds the GPU it asked for."""

    def ready(self) -> list[Any]:
        import ray as r

        return list(r.get_gpu_ids())


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Ray reports free resources a moment after an actor starts or stops."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def free_gpus() -> float:
    return float(ray.available_resources().get("GPU", 0.0))


@pytest.fixture(scope="module")
def rt() -> Iterator[LocalRuntime]:
    mp = pytest.MonkeyPatch()
    path = os.pathsep.join([HERE, os.path.join(HERE, "..", "support")])  # this module holds the handler
    mp.syspath_prepend(HERE)
    mp.setenv("PYTHONPATH", path)
    mp.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # The runtime joins this Ray (ensure_ray: already started), which models 2 GPUs on any machine.
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        r = LocalRuntime(RuntimeConfig(executor="ray", gpus="null:0,1", scale="small", ray_cpus_per_worker=0.05,
                                       node_capacity_bytes=128 << 20))
        try:
            yield r
        finally:
            r.close()
        assert ray.is_initialized(), "the runtime joined a Ray it did not start: that one stays up"
    finally:
        ray.shutdown()
        mp.undo()


def _invoke(rt: LocalRuntime, workflow: str) -> dict[str, float]:
    res = rt.invoke(workflow, {"x": np.arange(4, dtype=np.float64)}, timeout=60)
    assert res.ok, res.error
    np.testing.assert_array_equal(res.outputs["y"], np.arange(4) + 2)
    assert all("@ray:" in f.worker for f in res.functions)
    return {k: float(v) for k, v in res.outputs.items() if k != "y"}


def test_a_gpu_functions_actor_asks_for_a_gpu_and_computes_on_the_one_it_got(rt: LocalRuntime) -> None:
    # Ray's GPU 0 is taken, so Ray must give the function GPU 1 while the runtime placed it on gpu0 (its
    # only GPU function): the GPU it names is the one Ray assigned, not the placement.
    holder = ray.remote(num_cpus=0, num_gpus=1)(Holder).remote()
    try:
        assert ray.get(holder.ready.remote(), timeout=30) == [0]
        rt.deploy(WHOLE)
        assert rt.placement("raygpu") == {"g": "gpu0"}
        try:
            got = _invoke(rt, "raygpu")
            # The CPU function asked for no GPU and names none.
            assert (got["c_ray_gpu"], got["c_share"], got["c_gpu"]) == (-1, 0.0, -1)
            # The GPU function asked for a whole GPU (the default), Ray made GPU 1 the actor's only visible
            # GPU, and its context names it (the daemon's ordinal, Ray's id here); modelled: the CPU computes.
            assert (got["g_share"], got["g_ray_gpu"], got["g_visible"], got["g_gpu"], got["g_cuda"]) == (1, 1, 1, 1, 0)
            wait_for(lambda: free_gpus() == 0.0, "Ray to count the GPU function's actor's GPU as taken")
        finally:
            rt.undeploy("raygpu")
        wait_for(lambda: free_gpus() == 1.0, "the GPU to come back once the workflow is undeployed")
    finally:
        ray.kill(holder)
    wait_for(lambda: free_gpus() == 2.0, "every GPU to be free")


def test_two_functions_asking_for_half_a_gpu_share_one(rt: LocalRuntime) -> None:
    wait_for(lambda: free_gpus() == 2.0, "every GPU to be free")
    rt.deploy(HALVES)
    try:
        got = _invoke(rt, "rayhalves")
        assert got["h1_share"] == got["h2_share"] == 0.5
        assert got["h1_ray_gpu"] in (0, 1)
        assert got["h1_ray_gpu"] == got["h2_ray_gpu"] == got["h1_gpu"] == got["h2_gpu"]  # one GPU, both named it
        wait_for(lambda: free_gpus() == 1.0, "Ray to count one GPU taken by the two halves")
    finally:
        rt.undeploy("rayhalves")
    wait_for(lambda: free_gpus() == 2.0, "the GPU to come back once the workflow is undeployed")
