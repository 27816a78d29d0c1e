"""Functions that hang: a call past its function's ``timeout_s`` kills and replaces the worker and fails
the invocation naming the function and the timeout; a queued call fails at its invocation's deadline,
not when a worker would have reached it."""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_runtime_local import wait_for  # pytest puts this directory on sys.path

from gfaas.errors import ConfigError
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

pytestmark = pytest.mark.usefixtures("rt_handlers")


def sleeper(name: str, timeout: str = "", scaling: str = "{max: 1}") -> str:
    t = f", timeout_s: {timeout}" if timeout else ""
    return f"""
name: {name}
inputs: {{x: null, seconds: {{shape: []}}}}
outputs: {{out: f.y}}
functions:
  - {{name: f, kind: cpu, handler: "rt_handlers:sleep_for", inputs: {{x: input.x, seconds: input.seconds}},
     outputs: {{y: null}}, scaling: {scaling}{t}}}
"""


def call(seconds: float) -> dict[str, np.ndarray]:
    return {"x": np.arange(3.0), "seconds": np.float64(seconds)}


def test_a_call_past_its_timeout_kills_and_replaces_the_worker() -> None:
    """timeout_s: 0.5 and a handler that sleeps 60 s: the call fails after about 0.5 s naming the function
    and its timeout, the worker process is gone, and the next call runs on a fresh worker."""
    with LocalRuntime(RuntimeConfig(queue_hints=False)) as rt:
        rt.deploy(sleeper("hang", timeout="0.5"))
        assert rt.describe("hang")["functions"][0]["timeout_s"] == 0.5
        pool = rt.deployments.pools["hang/f"]
        first = pool.slots[0]
        t0 = time.monotonic()
        res = rt.invoke("hang", call(60.0), timeout=30)
        took = time.monotonic() - t0
        assert res.status == "failed"
        assert "function 'f' ran longer than its timeout_s=0.5 s" in res.error
        assert f"its worker {first.name} was killed and is replaced" in res.error
        assert res.failure is not None and res.failure.error == "TaskTimedOut" and res.failure.function == "f"
        assert 0.5 <= took < 20, took
        assert not first.alive()
        ok = rt.invoke("hang", call(0.0), timeout=60)
        assert ok.ok, ok.error
        np.testing.assert_array_equal(ok.outputs["out"], np.arange(3.0))
        assert ok.functions[0].worker != first.name


def test_the_runtime_default_applies_to_functions_without_timeout_s() -> None:
    """No timeout_s in the spec: RuntimeConfig.function_timeout_s is the bound (300 s unless configured)."""
    assert RuntimeConfig().function_timeout_s == 300.0
    with LocalRuntime(RuntimeConfig(queue_hints=False, function_timeout_s=0.4)) as rt:
        rt.deploy(sleeper("dflt"))
        assert rt.describe("dflt")["functions"][0]["timeout_s"] is None
        res = rt.invoke("dflt", call(60.0), timeout=30)
        assert res.status == "failed" and "timeout_s=0.4 s" in res.error


@pytest.mark.parametrize("bad", [0, -1.0, 0.0, 1e9])
def test_a_bad_runtime_default_is_refused(bad: float) -> None:
    with pytest.raises(ConfigError, match=f"function_timeout_s must be in \\(0, 86400\\] seconds, got {bad}"):
        RuntimeConfig(function_timeout_s=bad)


def test_a_queued_call_fails_at_its_deadline_not_when_dequeued() -> None:
    """One worker busy for 4 s; a second invocation with deadline_s=0.5 waits behind it and fails as
    expired about 0.5 s later, while the first is still running, without ever running."""
    with LocalRuntime(RuntimeConfig(queue_hints=False)) as rt:
        rt.deploy(sleeper("line", scaling="{max: 1, min: 1}"))
        first = rt.submit("line", call(4.0))
        wait_for(lambda: rt.status(first) == "running", what="the first call to start")
        t0 = time.monotonic()
        second = rt.submit("line", call(0.0), deadline_s=0.5)
        res = rt.result(second, timeout=30)
        waited = time.monotonic() - t0
        assert res.status == "failed"
        assert res.error == "expired: f was still queued when the invocation's deadline passed (it was not run)"
        assert rt.status(first) == "running", "the expiry came only when the worker was free"
        assert 0.5 <= waited < 3.5, waited
        assert rt.scaling_status("line")["functions"]["f"]["expired"] == 1
        assert rt.queue_depths() == {"line/f": 0}
        assert rt.result(first, timeout=30).ok
