"""GFAAS_WORKER_CORE reaches the runtime's workers (worker_native): a worker runs its common tasks on
the native path unless the switch says ``python``, forked or started afresh, sandboxed or not."""

from __future__ import annotations

import numpy as np
import pytest

from gfaas.native import native_class
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("rt_handlers"),
              pytest.mark.skipif(native_class("WorkerCore") is None, reason="gfaas_native is not built")]

SPEC = """
name: which
inputs: {x: null}
outputs: {native: w.native}
functions:
  - {name: w, kind: cpu, handler: "native_handlers:which", inputs: {x: input.x},
     outputs: {native: {dtype: int64, shape: []}}}
"""


@pytest.mark.parametrize("core", ["", "python", "native"])
def test_switch_reaches_the_worker(core: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if core:
        monkeypatch.setenv("GFAAS_WORKER_CORE", core)
    else:
        monkeypatch.delenv("GFAAS_WORKER_CORE", raising=False)
    with LocalRuntime(RuntimeConfig(sandbox="none", queue_hints=False)) as rt:
        rt.deploy(SPEC)
        for _ in range(3):
            res = rt.invoke("which", {"x": np.ones(4)}, timeout=60)
            assert res.status == "done", res.error
            assert int(res.outputs["native"]) == (core != "python")
