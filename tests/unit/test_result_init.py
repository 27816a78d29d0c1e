"""The result records' one-call ``__init__`` (runtime.result._one_call_init) behaves as the dataclass's
own: same signature and defaults, fresh factory values, frozen, and ``dataclasses.replace`` works."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import numpy as np
import pytest

from gfaas.runtime.result import Breakdown, Failure, FunctionRecord, InvocationResult

CLASSES = [Breakdown, FunctionRecord, InvocationResult]


@pytest.mark.parametrize("cls", CLASSES)
def test_signature_is_the_fields(cls: type) -> None:
    params = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        if f.default is not dataclasses.MISSING:
            assert p.default == f.default
        elif f.default_factory is dataclasses.MISSING:
            assert p.default is inspect.Parameter.empty  # required


def test_positional_keyword_and_defaults_agree() -> None:
    a = FunctionRecord("gen", "w1", 0.1, 0.2, 0.3, 0.4, False, 0.5, 0.6, "dscs", 2, 0.7, 0.8)
    b = FunctionRecord(function="gen", worker="w1", queued_s=0.1, get_s=0.2, compute_s=0.3, put_s=0.4,
                       slo_s=0.5, deadline_s=0.6, placement="dscs", drive=2, accel_s=0.7, cold_start_s=0.8)
    assert a == b and hash(a) == hash(b)
    assert (a.drive, a.cold_start_s, a.placement) == (2, 0.8, "dscs")
    d = FunctionRecord("red")
    assert (d.worker, d.skipped, d.drive, d.accel_s) == ("", False, -1, 0.0)
    with pytest.raises(TypeError):
        FunctionRecord()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        FunctionRecord("gen", nonsense=1)  # type: ignore[call-arg]


def test_factories_give_fresh_values_and_passed_ones_are_kept() -> None:
    a, b = InvocationResult("i", "w", "done"), InvocationResult("i", "w", "done")
    assert a.outputs == {} and a.outputs is not b.outputs and a.scalars is not b.scalars
    assert a.breakdown == Breakdown() and a.functions == () and a.failure is None
    out = {"y": np.zeros(2)}
    c = InvocationResult("i", "w", "failed", out, {"f.s": 1.0}, "boom", Breakdown(total_s=1.0), (), Failure("f"))
    assert c.outputs is out and c.breakdown.total_s == 1.0 and c.failure == Failure("f") and not c.ok


@pytest.mark.parametrize("cls", [Breakdown, FunctionRecord])
def test_frozen_replace_and_pickle(cls: type) -> None:
    r = cls("gen") if cls is FunctionRecord else cls(0.5)
    first = dataclasses.fields(cls)[1].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(r, first, 1)
    r2 = dataclasses.replace(r, **{first: type(getattr(r, first))()})
    assert r2 is not r and dataclasses.asdict(r2)[first] == type(getattr(r, first))()
    assert pickle.loads(pickle.dumps(r)) == r


def test_refuses_what_it_would_skip() -> None:
    """A later __post_init__ (a check) would be skipped silently by the one-call init: refused instead."""
    from gfaas.runtime.result import _one_call_init

    @dataclasses.dataclass(frozen=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            assert self.x >= 0

    with pytest.raises(TypeError, match="__post_init__"):
        _one_call_init(Checked)
