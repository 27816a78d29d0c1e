"""What ``gfaas serve`` starts ends with it, even when it is killed with SIGKILL and cannot clean up: its
node daemon (a lifeline pipe, gfaas.lifeline), the Redis server of the baseline (supervised on the
same lifeline) and its warm workers (their control socket closes)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gfaas import GatewayClient
from gfaas.proctree import descendants

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from serve_proc import Served, alive, env_with  # noqa: E402

pytestmark = pytest.mark.timeout(180)

SUPPORT = str(Path(__file__).resolve().parents[1] / "support")
SPEC = """
name: twice
inputs: {x: {dtype: float64, shape: [-1]}}
outputs: {y: f.y}
functions:
  - {name: f, kind: cpu, handler: "rt_handlers:double", inputs: {x: input.x}, outputs: {y: null, n_pos: {shape: []}}}
"""


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_sigkilled_gfaas_serve_leaves_no_process_behind(tmp_path: Path) -> None:
    spec = tmp_path / "twice.yaml"
    spec.write_text(SPEC)
    env = env_with(GFAAS_RUN_DIR=str(tmp_path / "run"), PYTHONPATH=SUPPORT)
    with Served(["--port", "0", "--workflows", "none", "--spec", str(spec), "--allow-handlers", "rt_handlers",
                 "--state-dir", str(tmp_path / "gw")], env=env) as srv:
        assert srv.proc is not None
        with GatewayClient(srv.url, token_file=srv.token_file) as gw:
            for transport in ("gfaas", "redis"):  # the Redis baseline starts its server on first use
                res = gw.invoke("twice", {"x": np.arange(3.0)}, transport=transport, timeout=60)
                assert res.ok, res.error
                np.testing.assert_array_equal(res.outputs["y"], [0.0, 2.0, 4.0])
        tree = [p for p in descendants(srv.proc.pid) if p != srv.proc.pid]
        names = {p: cmdline(p) for p in tree}
        kinds = {"daemon": "gfaas.dataplane.node_main", "worker template": "gfaas.runtime.forkserver",
                 "redis": "server"}
        for kind, word in kinds.items():
            assert any(word in c for c in names.values()), f"no {kind} among {names}"
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait()
        deadline = time.monotonic() + 20
        while any(alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = {p: names[p] for p in tree if alive(p)}
        assert not left, f"still running after gfaas serve was killed: {left}"
