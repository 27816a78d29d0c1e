"""Functions marked ``accelerator: dscs`` in the local runtime (runtime.accel): they run on the simulated
drive that holds their inputs through the emulated accelerator (outputs computed by the emulator, the
timing model's seconds in the breakdown), fail over to the CPU path when the drive is busy, unhealthy
or absent, and chained marked functions stay on the drive."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import pytest

from gfaas import models
from gfaas.accel import compile_model, estimate, preset
from gfaas.accel.emulate import FP32_TOLERANCE, emulate, rel_err
from gfaas.models import cache
from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.runtime.result import InvocationResult

H = "accel_handlers"


def chain(name: str, accelerator: str) -> str:
    """Two logreg functions in sequence, both marked with ``accelerator`` ("" for none)."""
    mark = f", accelerator: {accelerator}" if accelerator else ""
    return f"""
name: {name}
inputs: {{x: {{dtype: float32, shape: [-1, 32]}}}}
outputs: {{p: b.p, first: a.p}}
functions:
  - {{name: a, kind: cpu, handler: "{H}:score", model: logreg{mark}, inputs: {{x: input.x}}, outputs: {{p: null}}}}
  - {{name: b, kind: cpu, handler: "{H}:rescore", model: logreg{mark}, inputs: {{p: a.p}}, outputs: {{p: null}}}}
"""


X = np.random.default_rng(7).standard_normal((4, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def support() -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    path = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "support"))
    mp.syspath_prepend(path)
    mp.setenv("PYTHONPATH", path)
    yield
    mp.undo()


def runtime(drives: int) -> LocalRuntime:
    rt = LocalRuntime(RuntimeConfig(executor="inproc", dscs_drives=drives, node_capacity_bytes=64 << 20,
                                    sandbox="none"))
    rt.deploy(chain("marked", "dscs"))
    rt.deploy(chain("plain", ""))
    rt.deploy(chain("plain", "").replace("name: plain", "name: mixed").replace(
        'rescore", model: logreg', 'rescore", model: logreg, accelerator: dscs'))
    return rt


@pytest.fixture(scope="module")
def rt(support: None) -> Iterator[LocalRuntime]:
    r = runtime(2)
    try:
        yield r
    finally:
        r.close()


def placements(res: InvocationResult) -> list[tuple[str, str, int]]:
    return [(r.function, r.placement, r.drive) for r in res.functions]


def emulated(x: np.ndarray) -> np.ndarray:
    """logreg (small) compiled for the dscs preset and run by the emulator: the accelerator's outputs."""
    prog = compile_model(str(cache.path("logreg", "small")), preset("dscs"), len(x))
    return emulate(prog, {"features": x}, "fp32")["prob"]


def test_marked_chain_runs_on_the_drive_with_emulated_outputs_and_modelled_latency(rt: LocalRuntime) -> None:
    for d in rt.drives.drives:
        d.busy, d.healthy = False, True
    plain = rt.invoke("plain", {"x": X}, timeout=60)
    res = rt.invoke("marked", {"x": X}, timeout=60)
    assert plain.ok and res.ok, (plain.error, res.error)
    # Both functions on the drive that holds the invocation's input (and then a's output).
    drive = res.functions[0].drive
    assert placements(res) == [("a", "dscs", drive), ("b", "dscs", drive)]
    assert [(r.placement, r.drive, r.accel_s) for r in plain.functions] == [("", -1, 0.0), ("", -1, 0.0)]
    # Real outputs: exactly the emulator's on the compiled program, and within fp32's bound of onnxruntime.
    first = emulated(X)
    assert np.array_equal(res.outputs["first"], first)
    assert np.array_equal(res.outputs["p"], emulated(np.repeat(first, 32, axis=1)))
    for k in ("first", "p"):
        assert rel_err(res.outputs[k], plain.outputs[k]) <= FP32_TOLERANCE
    # Modelled latency: the timing model's seconds for one batch of 4, per function and summed.
    secs = estimate("logreg", preset("dscs"), 4, "small").seconds
    assert secs > 0
    assert [r.accel_s for r in res.functions] == [secs, secs]
    assert res.breakdown.accel_s == 2 * secs
    assert res.breakdown.as_dict()["accel_s"] == 2 * secs
    assert "accel_s" not in plain.breakdown.as_dict()
    assert not any(d.busy for d in rt.drives.drives)  # released after each function


def test_inputs_go_to_drives_in_turn_and_chains_follow_them(rt: LocalRuntime) -> None:
    for d in rt.drives.drives:
        d.busy, d.healthy = False, True
    drives = [rt.invoke("marked", {"x": X}, timeout=60).functions[0].drive for _ in range(2)]
    assert sorted(drives) == [0, 1]
    res = [rt.invoke("marked", {"x": X}, timeout=60) for _ in range(2)]
    assert [placements(r) for r in res] == [[("a", "dscs", d), ("b", "dscs", d)] for d in drives]


def test_after_an_unmarked_function_the_marked_one_runs_on_the_drive_of_the_request(rt: LocalRuntime) -> None:
    for d in rt.drives.drives:
        d.busy, d.healthy = False, True
    drives = []
    for _ in range(2):
        res = rt.invoke("mixed", {"x": X}, timeout=60)
        assert res.ok, res.error
        assert [r.placement for r in res.functions] == ["", "dscs"]
        assert res.functions[0].drive == -1 and res.breakdown.accel_s == res.functions[1].accel_s > 0
        drives.append(res.functions[1].drive)
    assert sorted(drives) == [0, 1]  # a's output stays where the request's input was: drives in turn


@pytest.mark.parametrize("state", ["busy", "unhealthy"])
def test_a_busy_or_unhealthy_drive_fails_over_to_the_cpu(rt: LocalRuntime, state: str) -> None:
    for d in rt.drives.drives:  # both drives, so the invocation's home is affected whichever it is
        d.busy, d.healthy = state == "busy", state != "unhealthy"
    try:
        plain = rt.invoke("plain", {"x": X}, timeout=60)
        res = rt.invoke("marked", {"x": X}, timeout=60)
    finally:
        for d in rt.drives.drives:
            d.busy, d.healthy = False, True
    assert res.ok, res.error
    drive = res.functions[0].drive
    assert drive in (0, 1)
    assert placements(res) == [("a", "cpu", drive), ("b", "cpu", drive)]
    assert [r.accel_s for r in res.functions] == [0.0, 0.0]
    assert res.breakdown.accel_s == 0.0 and "accel_s" not in res.breakdown.as_dict()
    for k in ("first", "p"):  # the normal path: onnxruntime, the same as the unmarked workflow
        assert np.array_equal(res.outputs[k], plain.outputs[k])


def test_without_drives_marked_functions_run_on_the_cpu(support: None) -> None:
    with runtime(0) as r:
        res = r.invoke("marked", {"x": X}, timeout=60)
        plain = r.invoke("plain", {"x": X}, timeout=60)
    assert res.ok, res.error
    assert placements(res) == [("a", "cpu", -1), ("b", "cpu", -1)]
    assert res.breakdown.accel_s == 0.0
    assert np.array_equal(res.outputs["p"], plain.outputs["p"])


CLASSIFY = f"""
name: classify
inputs: {{img: {{dtype: float32, shape: [-1, 3, 64, 64]}}}}
outputs: {{logits: f.logits}}
functions:
  - {{name: f, kind: cpu, handler: "{H}:classify", model: resnet50, accelerator: dscs, inputs: {{img: input.img}},
     outputs: {{logits: null}}}}
"""


def test_a_conv_model_in_a_worker_process_runs_on_the_drive(support: None) -> None:
    img = np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype(np.float32)
    with LocalRuntime(RuntimeConfig(executor="process", node_capacity_bytes=64 << 20, sandbox="none")) as r:
        r.deploy(CLASSIFY)
        res = r.invoke("classify", {"img": img}, timeout=120)
    assert res.ok, res.error
    assert placements(res) == [("f", "dscs", 0)]
    assert res.breakdown.accel_s == estimate("resnet50", preset("dscs"), 1, "small").seconds
    prog = compile_model(str(cache.path("resnet50", "small")), preset("dscs"), 1)
    # Another process's BLAS may sum in another order: equal to this process's emulation up to rounding,
    # and within the fp32 bound of onnxruntime (what the CPU path runs).
    assert rel_err(res.outputs["logits"], emulate(prog, {"image": img}, "fp32")["logits"]) <= 1e-6
    ref = models.load("resnet50", "small")(image=img)["logits"]
    assert rel_err(res.outputs["logits"], ref) <= FP32_TOLERANCE


HELD = f"""
name: held
inputs: {{x: {{dtype: float32, shape: [-1, 32]}}}}
outputs: {{p: a.p}}
functions:
  - {{name: a, kind: cpu, handler: "{H}:held_score", model: logreg, accelerator: dscs, inputs: {{x: input.x}},
     outputs: {{p: null}}}}
"""


def test_a_drive_busy_with_one_invocation_sends_the_next_to_the_cpu(support: None) -> None:
    import accel_handlers  # type: ignore[import-not-found]

    accel_handlers.GATE.clear()
    accel_handlers.CALLS.clear()
    with LocalRuntime(RuntimeConfig(executor="inproc", dscs_drives=1, workers_per_function=2,
                                    node_capacity_bytes=64 << 20, sandbox="none")) as r:
        r.deploy(HELD)
        first = r.submit("held", {"x": X})
        deadline = time.monotonic() + 30
        while not (accel_handlers.CALLS and r.drives.drives[0].busy):  # the first holds the only drive
            assert time.monotonic() < deadline, "the first invocation never started"
            time.sleep(0.01)
        second = r.invoke("held", {"x": X}, timeout=60)  # runs while the first still holds the drive
        accel_handlers.GATE.set()
        res = r.result(first, timeout=60)
    assert res.ok and second.ok, (res.error, second.error)
    calls = list(accel_handlers.CALLS)
    assert calls == [first, second.invocation_id]
    assert placements(res) == [("a", "dscs", 0)]
    assert placements(second) == [("a", "cpu", 0)]
    assert res.breakdown.accel_s == estimate("logreg", preset("dscs"), 4, "small").seconds
    assert second.breakdown.accel_s == 0.0
    assert rel_err(res.outputs["p"], second.outputs["p"]) <= FP32_TOLERANCE
