"""``accelerator: dscs`` in workflow specs, and the drive placement of runtime.accel (the shared policy)."""

from __future__ import annotations

from typing import Any

import pytest

from gfaas.errors import ConfigError, SpecError
from gfaas.policy import accel_sched
from gfaas.runtime import accel
from gfaas.runtime.accel import CPU, DSCS, Decision, DscsDrive, DscsDrives
from gfaas.runtime.spec import loads


def spec(extra: str, model: str = ", model: logreg") -> str:
    return f"""
name: w
inputs: {{x: null}}
outputs: {{y: f.y}}
functions:
  - {{name: f, kind: cpu, handler: "json:dumps"{model}{extra}, inputs: {{x: input.x}}, outputs: {{y: null}}}}
"""


def test_the_field_is_parsed_and_described() -> None:
    s = loads(spec(", accelerator: dscs"))
    assert s.function("f").accelerator == "dscs"
    assert s.describe()["functions"][0]["accelerator"] == "dscs"
    assert loads(spec("")).function("f").accelerator is None
    # the runtime tracks which drive holds each value only for a workflow with a marked function
    assert s.accelerated and not loads(spec("")).accelerated


@pytest.mark.parametrize("value, shown", [("tpu", "'tpu'"), ("DSCS", "'DSCS'"), ("3", "'3'"), ("[dscs]", "['dscs']")])
def test_unknown_accelerators_are_named_with_the_allowed_ones(value: str, shown: str) -> None:
    with pytest.raises(SpecError) as e:
        loads(spec(f", accelerator: {value}" if value != "3" else ", accelerator: '3'"))
    assert str(e.value) == (f"function 'f': accelerator {shown} is not known; allowed: ['dscs'] "
                            "(or leave the field out)")


def test_the_accelerator_needs_a_model() -> None:
    with pytest.raises(SpecError, match=r"function 'f': accelerator 'dscs' runs the function's model, but the "
                                        r"function names no model; add `model: NAME`"):
        loads(spec(", accelerator: dscs", model=""))


def drives(n: int) -> DscsDrives:
    return DscsDrives([DscsDrive(f"d{k}") for k in range(n)])


def test_claim_places_on_an_idle_healthy_home_and_marks_it_busy_until_released() -> None:
    ds = drives(2)
    assert [ds.input_drive(k) for k in range(5)] == [0, 1, 0, 1, 0]
    first = ds.claim(1)
    assert first == Decision(DSCS, 1, "dscs")
    assert [d.busy for d in ds.drives] == [False, True]
    assert ds.claim(1) == Decision(CPU, 1)  # busy: fail-over, and the failed-over call marks nothing
    assert [d.busy for d in ds.drives] == [False, True]
    ds.release(first)
    assert [d.busy for d in ds.drives] == [False, False]
    ds.drives[0].healthy = False
    assert ds.claim(0) == Decision(CPU, 0)
    assert ds.claim(-1) == Decision(CPU, -1)  # data on no drive
    assert drives(0).claim(0) == Decision(CPU, -1) and drives(0).input_drive(3) == -1


def test_claim_asks_the_shared_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    real = accel_sched.place

    def spy(*args: Any) -> str:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(accel.accel_sched, "place", spy)
    ds = drives(3)
    ds.drives[2].healthy = False
    assert ds.claim(2) == Decision(CPU, 2)
    assert calls == [(2, [False, False, False], [True, True, False], 1)]


def test_an_unknown_drive_preset_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="nope"):
        DscsDrives([DscsDrive("d0", "nope")])


def test_result_documents_carry_placement_and_accel_s_of_marked_functions_only() -> None:
    from gfaas.runtime.result import Breakdown, FunctionRecord, InvocationResult
    from gfaas.runtime.wire import result_document, result_from_document

    recs = (FunctionRecord("a", "w0", compute_s=0.5, placement="dscs", drive=1, accel_s=0.25),
            FunctionRecord("b", "w1", compute_s=0.5, placement="cpu", drive=1),
            FunctionRecord("c", "w2", compute_s=0.5))
    res = InvocationResult("i", "w", "done", breakdown=Breakdown(compute_s=1.5, total_s=2.0, accel_s=0.25),
                           functions=recs)
    doc = result_document(res)
    assert doc["breakdown"] == {"queue_s": 0.0, "host_pass_s": 0.0, "fn_pass_s": 0.0, "compute_s": 1.5,
                                "total_s": 2.0, "accel_s": 0.25}
    assert [(f.get("placement"), f.get("drive"), f.get("accel_s")) for f in doc["functions"]] == [
        ("dscs", 1, 0.25), ("cpu", 1, 0.0), (None, None, None)]
    back = result_from_document(doc)
    assert back.breakdown == res.breakdown
    assert back.functions == recs
