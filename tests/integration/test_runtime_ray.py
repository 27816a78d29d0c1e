"""The Ray executor: the same workflows, functions as Ray actors on a local Ray cluster, data through gfaas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_runtime_local import CRASH, FANS, SEQ  # pytest puts this directory on sys.path

from gfaas import workflows as W
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'gfaas[ray]')")


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRuntime]:
    import os

    mp = pytest.MonkeyPatch()
    support = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "support"))
    mp.syspath_prepend(support)
    mp.setenv("PYTHONPATH", support)
    mp.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # 20 function actors on a 2-CPU Ray node: each asks for a sliver of a CPU.
    r = LocalRuntime(RuntimeConfig(executor="ray", scale="small", ray_cpus_per_worker=0.05,
                                   node_capacity_bytes=256 << 20))
    try:
        for text in (SEQ, FANS, CRASH):
            r.deploy(text)
        for name in W.names():
            r.deploy(W.spec_text(name))
        yield r
    finally:
        r.close()
        mp.undo()
    assert not ray.is_initialized(), "the runtime started Ray, so it must shut it down"


def test_workflows_run_on_ray_actors_with_data_through_gfaas(rt: LocalRuntime) -> None:
    x = np.arange(-2, 6, dtype=np.float64)
    res = rt.invoke("seq", {"x": x}, timeout=60)
    assert res.ok, res.error
    np.testing.assert_array_equal(res.outputs["out"], -2 * x)
    assert all("@ray:" in r.worker for r in res.functions)
    res = rt.invoke("fans", {"x": np.arange(6, dtype=np.float32)}, timeout=60)
    assert res.ok, res.error
    np.testing.assert_array_equal(res.outputs["out"], [0, 10, 20, -3, -4, -5])
    from test_runtime_local import objects, wait_for

    # The runtime's own daemon held the data: every invocation is ended and its objects freed there.
    def open_invocations() -> int:
        with rt.nodes.lock:
            return int(rt.nodes.admin.stats()["invocations"])

    wait_for(lambda: objects(rt) == 0 and open_invocations() == 0, what="the invocations to end on the daemon")


def test_dead_actor_fails_its_invocation_and_is_replaced(rt: LocalRuntime) -> None:
    bad = rt.invoke("crashing", {"x": np.array([-1.0])}, timeout=60)
    assert bad.status == "failed" and "died while it held a task" in (bad.error or "")
    good = rt.invoke("crashing", {"x": np.array([2.0])}, timeout=60)
    assert good.ok, good.error
    np.testing.assert_array_equal(good.outputs["out"], [3.0])


@pytest.mark.parametrize("name", W.names())
def test_reference_workflows_on_ray_match_the_reference_executor(rt: LocalRuntime, name: str) -> None:
    """The demo's six workflows (small scale) on Ray actors give run_local's outputs."""
    from outputs import same_output as same  # tests/support (on the path: the rt fixture)

    want = W.run_local(name, seed=5, scale="small")
    res = rt.invoke(name, W.make_inputs(name, seed=5, scale="small"), timeout=120)
    assert res.ok, res.error
    assert set(res.outputs) == set(want["outputs"])
    for key, value in want["outputs"].items():
        assert same(res.outputs[key], value), f"{name}.{key} differs on Ray"
    assert all("@ray:" in r.worker for r in res.functions if not r.skipped)


def test_a_code_package_needs_a_gfaas_nodes_ray_node_and_says_so(rt: LocalRuntime, tmp_path: Path) -> None:
    """A package's functions run sandboxed beside a gfaas node's daemon (ray_executor.SandboxedActor): on
    a Ray node that `gfaas node start --ray-address` did not start, the deploy (which starts a worker to
    check the package) fails naming that command, nothing is deployed, and the runtime serves on (the
    lab's test runs packages on two machines: test_cluster_ray.py)."""
    from test_runtime_code import package, spec

    from gfaas.errors import CodePackageError

    with pytest.raises(CodePackageError, match="was not started by `gfaas node start --ray-address`") as err:
        rt.deploy(spec("raycode"), code=package(tmp_path, 4))
    assert "a handler names" not in str(err.value)
    assert "raycode" not in rt.workflows()


def test_ray_actors_carry_their_logs_like_worker_processes(rt: LocalRuntime) -> None:
    """Prints (Python and fd level, a child process's too) and log records of a Ray actor come back
    with its replies, attributed to their invocation (runtime.logs)."""
    rt.deploy("""
name: raylogs
inputs: {x: null}
outputs: {out: f.y}
functions:
  - {name: f, kind: cpu, handler: "log_handlers:chatty", inputs: {x: input.x}, outputs: {y: null}}
""")
    try:
        res = rt.invoke("raylogs", {"x": np.array([4.0])}, timeout=60)
        assert res.ok, res.error
        got = sorted((r["stream"], r["text"]) for r in rt.logs("raylogs", invocation=res.invocation_id))
        assert got == sorted([("stdout", "print 4"), ("stdout", "fd1 4"), ("stdout", "child 4"),
                              ("stdout", "no newline"), ("stderr", "stderr 4"), ("stderr", "fd2 4"),
                              ("log", "userfn: record 4")])
    finally:
        rt.undeploy("raylogs")
