"""Small values ride in the runtime's task and reply messages; large ones stay on the node's data plane.

An invocation of small values sends the node daemon nothing at all (counted by a daemon on a thread
of this process); a large output makes its lazy task ask for the data plane (NeedData), which opens
the invocation on the node and binds the worker's connection for that task only; large request
inputs are stored at submit; ``inline_max_bytes=0`` and the Redis baseline carry nothing. Outputs
match whichever way they travelled."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from gfaas.dataplane import protocol as P
from gfaas.runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("rt_handlers")]

GEN = """
name: gen
inputs: {n: {dtype: int64, shape: []}, extra: null}
outputs: {total: red.total, x: gen.x}
functions:
  - {name: gen, kind: cpu, handler: "gfaas.workflows.tiny:gen", inputs: {n: input.n},
     outputs: {x: {dtype: float32, shape: [-1]}}}
  - {name: red, kind: cpu, handler: "rt_handlers:total_of", inputs: {x: gen.x, extra: input.extra},
     outputs: {total: {shape: []}}}
"""


@pytest.fixture
def counted(make_config: Any, thread_daemon: Any) -> Iterator[tuple[Any, collections.Counter[str]]]:
    """A node daemon on a thread of this process, counting every request it handles by type."""
    seen: collections.Counter[str] = collections.Counter()
    cfg = make_config(capacity_bytes=64 << 20)
    with thread_daemon(cfg) as d:
        real = d._handle

        def handle(conn: Any, data: bytes) -> None:
            try:
                seen[type(P.decode_request(data)).__name__] += 1
            except Exception:  # noqa: BLE001 - counted as what it is: not a message
                seen["?"] += 1
            real(conn, data)

        d._handle = handle
        yield cfg, seen


def _rt(cfg: Any, **kw: Any) -> LocalRuntime:
    return LocalRuntime(RuntimeConfig(nodes=(NodeEndpoint("n0", cfg.socket_path, cfg.state_dir),), sandbox="none",
                                      queue_hints=False, **kw))


def _inputs(n: int, extra: int = 4) -> dict[str, np.ndarray]:
    return {"n": np.asarray(n, dtype=np.int64), "extra": np.ones(extra)}


def _expect(n: int, extra: int = 4) -> float:
    return float(np.arange(n, dtype=np.float64).sum() + extra)


def test_small_values_never_reach_the_node_daemon(counted: Any) -> None:
    """Inputs, the intermediate and the results all under inline_max_bytes: 20 invocations, and the
    daemon handles no request at all after the runtime's start (not an open, a bind or an end)."""
    cfg, seen = counted
    with _rt(cfg) as rt:
        rt.deploy(GEN)
        rt.invoke("gen", _inputs(256), timeout=30)
        before = dict(seen)
        for _ in range(20):
            res = rt.invoke("gen", _inputs(256), timeout=30)
            assert res.ok, res.error
            assert float(res.outputs["total"]) == _expect(256)
            np.testing.assert_array_equal(res.outputs["x"], np.arange(256, dtype=np.float32))
            assert res.outputs["x"].flags.writeable  # the result's own copy
        after = dict(seen)
    assert after == before, {k: after.get(k, 0) - before.get(k, 0) for k in after}


def test_a_large_output_asks_for_the_data_plane_and_is_passed_by_reference(counted: Any) -> None:
    """gen's array is 400 KB, over the 64 KiB carried: its task asks for the data plane, the invocation is
    opened on the node once, red reads the array from shared memory, and the invocation's data is freed."""
    cfg, seen = counted
    n = 100_000
    with _rt(cfg) as rt:
        rt.deploy(GEN)
        before = dict(seen)
        res = rt.invoke("gen", _inputs(n), timeout=30)
        assert res.ok, res.error
        assert float(res.outputs["total"]) == pytest.approx(_expect(n), rel=1e-6)
        np.testing.assert_array_equal(res.outputs["x"], np.arange(n, dtype=np.float32))
        got = {k: seen.get(k, 0) - before.get(k, 0) for k in seen}
        assert got.get("OpenInvocation", 0) == 1, got
        assert got.get("Bind", 0) >= 2, got  # gen's (asked for) and red's (its input is stored)
        stats = rt.node_stats()["n0"]
        import time

        deadline = time.monotonic() + 10
        while stats["invocations"] and time.monotonic() < deadline:  # the ender frees it in the background
            time.sleep(0.05)
            stats = rt.node_stats()["n0"]
        assert stats["invocations"] == 0 and stats["objects"] == 0, stats


def test_large_request_inputs_are_stored_small_ones_carried(counted: Any) -> None:
    cfg, seen = counted
    with _rt(cfg) as rt:
        rt.deploy(GEN)
        before = dict(seen)
        res = rt.invoke("gen", _inputs(256, extra=20_000), timeout=30)  # extra: 160 KB
        assert res.ok, res.error and float(res.outputs["total"]) == _expect(256, 20_000)
        got = {k: seen.get(k, 0) - before.get(k, 0) for k in seen}
        assert got.get("OpenInvocation", 0) == 1, got


@pytest.mark.parametrize("kw", [{"inline_max_bytes": 0}, {"transport": "redis"}], ids=["inline-off", "redis"])
def test_nothing_is_carried_with_inline_off_or_on_the_redis_baseline(counted: Any, kw: dict[str, Any]) -> None:
    cfg, seen = counted
    with _rt(cfg, **kw) as rt:
        rt.deploy(GEN)
        before = dict(seen)
        res = rt.invoke("gen", _inputs(256), timeout=30)
        assert res.ok, res.error
        assert float(res.outputs["total"]) == _expect(256)
        got = {k: seen.get(k, 0) - before.get(k, 0) for k in seen}
        assert got.get("OpenInvocation", 0) == (1 if "inline_max_bytes" in kw else 0), got


def test_inline_max_bytes_is_checked() -> None:
    from gfaas.errors import ConfigError

    for bad in (-1, 1 << 30, 1.5, True):
        with pytest.raises(ConfigError, match="inline_max_bytes=.* must be a whole number of bytes in"):
            RuntimeConfig(inline_max_bytes=bad)  # type: ignore[arg-type]
    assert RuntimeConfig().inline_max_bytes == 64 * 1024 and RuntimeConfig(inline_max_bytes=0).inline_max_bytes == 0


def test_handlers_see_the_same_reference_api_for_carried_values(rt_handlers: str) -> None:
    """A handler reads a carried input through ctx.get like a stored one: a read-only array."""
    spec = """
name: ro
inputs: {x: null}
outputs: {w: f.writable}
functions:
  - {name: f, kind: cpu, handler: "rt_handlers:writable", inputs: {x: input.x}, outputs: {writable: {shape: []}}}
"""
    with LocalRuntime(RuntimeConfig(sandbox="none", queue_hints=False)) as rt:
        rt.deploy(spec)
        res = rt.invoke("ro", {"x": np.arange(3.0)}, timeout=30)
    assert res.ok, res.error
    assert float(res.outputs["w"]) == 0.0
