"""The six reference workflows on the real runtime (worker processes, node daemon, both transports)
give the outputs of the in-process reference executor ``gfaas.workflows.run_local``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gfaas import workflows as W
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
from outputs import same_output  # noqa: E402


@pytest.fixture(scope="module")
def rt() -> Iterator[LocalRuntime]:
    with LocalRuntime(RuntimeConfig(scale="small")) as r:
        for name in W.names():
            r.deploy(W.spec_text(name))
        yield r


@pytest.fixture(scope="module")
def reference() -> dict[str, dict[str, Any]]:
    return {name: W.run_local(name, seed=3, scale="small") for name in W.names()}


@pytest.mark.parametrize("transport", ["gfaas", "redis"])
@pytest.mark.parametrize("name", W.names())
def test_workflow_matches_the_reference_executor(rt: LocalRuntime, reference: dict[str, dict[str, Any]],
                                                 name: str, transport: str) -> None:
    ref = reference[name]
    res = rt.invoke(name, W.make_inputs(name, seed=3, scale="small"), timeout=120, transport=transport)
    assert res.ok, res.error
    assert set(res.outputs) == set(ref["outputs"])
    for key, want in ref["outputs"].items():
        assert same_output(res.outputs[key], want), f"{name}.{key} differs ({transport})"
    ran = [f.function for f in res.functions if not f.skipped]
    assert sorted(ran) == sorted(ref["ran"])
    assert res.scalars == pytest.approx(ref["scalars"])
    b = res.breakdown
    assert b.host_pass_s > 0 and b.compute_s > 0
    if len(ran) > 1:
        assert b.fn_pass_s > 0
