"""What a function's Ray actor asks Ray for (``num_gpus``, from its spec) and which GPU it then names
(Ray's id mapped to the node daemon's ordinal): pure, no Ray. The same logic on a running Ray with
modelled GPUs: tests/integration/test_ray_gpus.py."""

from __future__ import annotations

import pytest

from gfaas.errors import ConfigError, SpecError
from gfaas.runtime.gpus import ray_gpu_ordinal, ray_num_gpus
from gfaas.runtime.ray_executor import on_assigned_gpu
from gfaas.runtime.spec import loads
from gfaas.runtime.worker import Init

_FN = '  - {{name: {name}, kind: {kind}, handler: "m:h", inputs: {{x: {src}}}, outputs: {{y: null}}{extra}}}\n'


def _spec(*fns: tuple[str, str, str]) -> str:
    """A chain of functions (name, kind, extra fields) reading one input; the last one's y is the output."""
    lines, src = [], "input.x"
    for name, kind, extra in fns:
        lines.append(_FN.format(name=name, kind=kind, src=src, extra=extra))
        src = f"{name}.y"
    return f"name: wf\ninputs: {{x: null}}\noutputs: {{out: {src}}}\nfunctions:\n{''.join(lines)}"


def test_num_gpus_comes_from_the_spec() -> None:
    spec = loads(_spec(("cpu_fn", "cpu", ""),
                       ("whole", "gpu", ""),
                       ("half", "gpu", ", resources: {gpus: 0.5}"),
                       ("quarter", "gpu", ", resources: {cpus: 1, gpus: 0.25}"),
                       ("no_share", "gpu", ", resources: {cpus: 2}"),
                       ("one", "gpu", ", resources: {gpus: 1}")), check_handlers=False)
    got = {f.name: ray_num_gpus(f) for f in spec.functions}
    assert got == {"cpu_fn": 0.0, "whole": 1.0, "half": 0.5, "quarter": 0.25, "no_share": 1.0, "one": 1.0}
    assert all(type(v) is float for v in got.values())


def test_a_share_below_rays_grain_still_asks_for_a_gpu() -> None:
    spec = loads(_spec(("tiny", "gpu", ", resources: {gpus: 0.00001}")), check_handlers=False)
    assert ray_num_gpus(spec.functions[0]) == 0.0001


@pytest.mark.parametrize("bad", ["2", "8", "-0.5", "half", "true", "[1]"])
def test_a_bad_gpus_value_is_refused_by_the_spec_naming_it_and_the_fix(bad: str) -> None:
    with pytest.raises(SpecError) as err:
        loads(_spec(("g", "gpu", f", resources: {{gpus: {bad}}}")), check_handlers=False)
    msg = str(err.value)
    assert msg.startswith("function 'g': resources.gpus = ")
    assert "0 <= gpus <= 1" in msg and "give the share of its GPU a worker reserves" in msg
    shown = {"true": "True", "[1]": "[1]", "half": "'half'"}.get(bad, bad)
    assert f"resources.gpus = {shown}:" in msg


@pytest.mark.parametrize(("ray_id", "visible", "want"), [
    (0, (), 0),
    (1, (), 1),
    ("3", (), 3),  # Ray's ids are strings when the node's list was set; ints otherwise
    ("2", ("2", "3"), 0),  # the node started with CUDA_VISIBLE_DEVICES=2,3: the daemon calls GPU 2 ordinal 0
    ("3", ("2", "3"), 1),
    ("GPU-b1e", ("GPU-a0d", "GPU-b1e"), 1),  # UUIDs in the list
])
def test_rays_gpu_id_maps_to_the_node_daemons_ordinal(ray_id: int | str, visible: tuple[str, ...],
                                                      want: int) -> None:
    assert ray_gpu_ordinal(ray_id, visible) == want


def test_a_ray_gpu_outside_the_nodes_list_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"Ray assigned GPU '5', which is not in this node's CUDA_VISIBLE_DEVICES "
                                          r"2,3; start the node daemon and its Ray node with the same"):
        ray_gpu_ordinal("5", ("2", "3"))
    with pytest.raises(ConfigError, match=r"GPU 'GPU-x'.* \(unset\)"):
        ray_gpu_ordinal("GPU-x")


def _init(device: str, gpu: str) -> Init:
    return Init("wf", "f", "", device=device, gpu=gpu)


def test_the_actor_names_the_gpu_ray_assigned_not_the_one_placed() -> None:
    # Modelled GPUs: placement only, the CPU computes; the GPU named is Ray's.
    got = on_assigned_gpu(_init("cpu", "gpu0"), [1])
    assert (got.device, got.gpu, got.gpu_passing) == ("cpu", "gpu1", "device")
    # CUDA: the actor computes on the daemon's number of its GPU (it is given the node's numbering back),
    # so device passing stays on whichever GPU Ray picked.
    got = on_assigned_gpu(_init("cuda:1", "gpu1"), ["0"])
    assert (got.device, got.gpu, got.gpu_passing) == ("cuda:0", "gpu0", "device")
    got = on_assigned_gpu(_init("cuda:0", "gpu0"), ["3"], ("2", "3"))
    assert (got.device, got.gpu, got.gpu_passing) == ("cuda:1", "gpu1", "device")
    # No GPU assigned (a CPU-only Ray cluster): the CPU, and no GPU named.
    got = on_assigned_gpu(_init("cuda:1", "gpu1"), [])
    assert (got.device, got.gpu) == ("cpu", "")
    cpu = _init("cpu", "")
    assert on_assigned_gpu(cpu, []) is cpu


def test_a_cuda_actor_gets_the_nodes_gpu_numbering_back() -> None:
    """Ray narrows CUDA_VISIBLE_DEVICES to the assigned GPU; the actor is given the node's list back
    (or none, where the node had none), so cuda:K is the daemon's GPU K."""
    from gfaas.runtime.ray_executor import node_numbering

    env = {"CUDA_VISIBLE_DEVICES": "3", "OTHER": "x"}
    node_numbering(env, ["2", "3"])
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3", "OTHER": "x"}
    node_numbering(env, [])
    assert env == {"OTHER": "x"}
