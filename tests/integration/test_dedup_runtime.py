"""Page merging through the node daemon and the workflow runtime: shared weights per sharing domain,
hints relayed by the runtime (never chosen by function code), KSM restored after a killed daemon,
and ``gfaas dedup status``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gfaas
from gfaas.dataplane import protocol as P
from gfaas.dataplane.channel import Channel
from gfaas.dataplane.local import LocalNode
from gfaas.dedup.ksm import KsmSysfs
from gfaas.dedup.procstat import ksm_stat
from gfaas.errors import AuthenticationError, ProtocolError
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

H = "dedup_handlers"
IMG = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)


def twins(name: str) -> str:
    """Two functions of one workflow on the same model."""
    return f"""
name: {name}
inputs: {{img: {{dtype: float32, shape: [-1, 3, -1, -1]}}}}
outputs: {{f: f.y, g: g.y, pf: f.pid, pg: g.pid}}
functions:
  - {{name: f, kind: cpu, handler: "{H}:classify", model: resnet50, inputs: {{img: input.img}},
      outputs: {{y: null, pid: {{shape: []}}}}}}
  - {{name: g, kind: cpu, handler: "{H}:classify", model: resnet50, inputs: {{img: input.img}},
      outputs: {{y: null, pid: {{shape: []}}}}}}
"""


def hinting(name: str) -> str:
    """Two functions whose handlers build the same table and hint it with ctx.merge."""
    return f"""
name: {name}
inputs: {{x: null}}
outputs: {{a: a.marked, b: b.marked, pa: a.pid, pb: b.pid}}
functions:
  - {{name: a, kind: cpu, handler: "{H}:hint_table", inputs: {{x: input.x}},
      outputs: {{marked: {{shape: []}}, pid: {{shape: []}}, y: null}}}}
  - {{name: b, kind: cpu, handler: "{H}:hint_table", inputs: {{x: input.x}},
      outputs: {{marked: {{shape: []}}, pid: {{shape: []}}, y: null}}}}
"""


pytestmark = pytest.mark.usefixtures("rt_handlers")  # tests/support on the path (dedup_handlers.py)


@pytest.fixture
def ksm_restored() -> Iterator[KsmSysfs]:
    """Root and a writable KSM, whose settings are put back whatever the test does."""
    ksm = KsmSysfs()
    if os.geteuid() != 0 or not ksm.writable():
        pytest.skip("needs root and a writable /sys/kernel/mm/ksm")
    holder = _ksm_owner()
    if holder:
        pytest.skip(f"another gfaas node daemon owns KSM on this machine ({holder}); the test's daemon could not")
    saved = ksm.read_settings()
    try:
        yield ksm
    finally:
        ksm.write_settings(saved)


def _ksm_owner() -> str:
    """The pid of a node daemon holding the machine's KSM lock now ("" when free)."""
    import fcntl

    from gfaas.dedup.node import DEFAULT_LOCK_DIR

    path = os.path.join(DEFAULT_LOCK_DIR, "ksm.lock")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return ""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return "pid " + Path(path).read_text().strip()
    finally:
        os.close(fd)  # releases it if taken
    return ""


def _reference_logits() -> np.ndarray:
    from gfaas import models

    m = models.load("resnet50", scale="small", threads=1)
    return m(image=IMG)["logits"]


def _rt(**kw: Any) -> LocalRuntime:
    return LocalRuntime(RuntimeConfig(node_capacity_bytes=64 << 20, **kw))


@pytest.mark.timeout(300)
def test_shared_weights_are_one_copy_per_sharing_domain() -> None:
    """dedup='shared': workers of one domain map one store file (one copy saved per extra mapper);
    two workflows are two domains by default, and one with dedup_domain; outputs are unchanged."""
    want = _reference_logits()
    with _rt(dedup="shared") as rt:
        for wf in ("ra", "rb"):
            rt.deploy(twins(wf))
        outs = [rt.invoke(wf, {"img": IMG}, timeout=120).outputs for wf in ("ra", "rb")]
        rep = rt.memory_report()
        store = rt.dedup.store_dir
        assert store is not None
        domains = sorted(p.name for p in store.iterdir())
    for o in outs:
        np.testing.assert_allclose(o["f"], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(o["f"], o["g"])
        assert int(o["pf"]) != int(o["pg"])  # two worker processes
    assert domains == ["ra", "rb"]
    sh = rep["shared"]
    assert sh["files"] == 2 and sh["mappings"] == 4
    assert sh["saved_bytes"] == sh["bytes"]  # each domain's file is mapped twice: one copy saved per domain
    assert not store.exists()  # removed with the runtime
    with _rt(dedup="shared", dedup_domain="team") as rt:
        for wf in ("ra", "rb"):
            rt.deploy(twins(wf))
            rt.invoke(wf, {"img": IMG}, timeout=120)
        sh = rt.memory_report()["shared"]
    assert sh["files"] == 1 and sh["mappings"] == 4 and sh["saved_bytes"] == 3 * sh["bytes"]


@pytest.mark.timeout(300)
def test_ctx_merge_is_relayed_merged_and_a_second_domain_is_refused(ksm_restored: KsmSysfs) -> None:
    """ctx.merge marks the table's pages once the node admitted the workflow's domain; the node
    merges the two workers' identical tables by a burst, then restores KSM; a second workflow
    (another domain) is refused while the first holds KSM (its pages are never marked), and its
    invocation still succeeds."""
    before = ksm_restored.read_settings()
    with _rt(dedup="merge") as rt:
        rt.deploy(hinting("m1"))
        r = rt.invoke("m1", {"x": np.zeros(4)}, timeout=120).outputs
        assert int(r["a"]) == int(r["b"]) == 8 << 20  # the table is page-aligned: every byte marked
        pids = {int(r["pa"]), int(r["pb"])}
        deadline = time.monotonic() + 30
        while True:
            rep = rt.memory_report()["nodes"]["rt0"]
            procs = {p["pid"]: p for p in rep["processes"]}
            if rep.get("burst") is None and pids <= set(procs) and all(procs[p]["merged_bytes"] > 0 for p in pids):
                break
            assert time.monotonic() < deadline, f"not merged within 30 s: {rep}"
            time.sleep(0.1)
        assert rep["active_domain"] == "m1"
        assert {procs[p]["domain"] for p in pids} == {"m1"} and {procs[p]["function"] for p in pids} == {"a", "b"}
        assert all(procs[p]["merged_bytes"] >= 7 << 20 for p in pids)  # nearly all 2048 pages of each table
        assert ksm_restored.read_settings() == before
        rt.deploy(hinting("m2"))
        r2 = rt.invoke("m2", {"x": np.zeros(4)}, timeout=120).outputs
        # Sandboxed (root), each madvise waits for the node's admission (runtime.merge_supervisor):
        # refused while m1 holds KSM, so nothing of m2's is ever marked, and ctx.merge says 0 bytes.
        assert int(r2["a"]) == 0
        assert rt.dedup.refused and "m1" in rt.dedup.refused[0]
        rep = rt.memory_report()["nodes"]["rt0"]
        assert int(r2["pa"]) not in {p["pid"] for p in rep["processes"]}
        # Nothing of the refused workers is mergeable: nothing of theirs for m1's bursts to merge.
        for pid in (int(r2["pa"]), int(r2["pb"])):
            st = ksm_stat(pid)
            assert st is not None and st.mergeable is False


def test_dedup_hints_need_the_admin_token(node: Any) -> None:
    """A function's connection cannot send a hint (it would pick its own domain): AuthenticationError."""
    ch = Channel(node.config.socket_path)
    try:
        ch.handshake(P.Hello(node.inv.tokens["f"]))
        with pytest.raises(AuthenticationError, match="admin token"):
            ch.call(P.DedupHint(os.getpid(), "wf", "f", "other-tenant", 4096))
        with pytest.raises(AuthenticationError, match="admin token"):
            ch.call(P.DedupStatus())
    finally:
        ch.close()


@pytest.mark.parametrize(("field", "value", "match"), [
    ("pid", 0, r"DedupHint.pid=0 is out of range"),
    ("nbytes", -1, r"DedupHint.nbytes=-1 is out of range"),
    ("domain", "", r"DedupHint.domain='' must be 1..128 printable"),
    ("workflow", "a\nb", r"DedupHint.workflow='a\\nb' must be"),
])
def test_bad_hints_are_refused_before_any_state_changes(field: str, value: Any, match: str) -> None:
    """Each field of a hint is range-checked when the frame is decoded."""
    kw: dict[str, Any] = {"pid": 42, "workflow": "wf", "function": "f", "domain": "d", "nbytes": 4096, field: value}
    with pytest.raises(ProtocolError, match=match):
        P.decode_request(P.encode(P.DedupHint(**kw)))


def test_dedup_status_cli_reports_the_node(node: Any) -> None:
    """`gfaas dedup status --json` prints the node's report; without --json a readable summary."""
    base = [sys.executable, "-m", "gfaas", "dedup", "status", "--socket", node.config.socket_path,
            "--state-dir", node.config.state_dir]
    r = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["node_id"] == "n0" and doc["processes"] == [] and "controllable" in doc["ksm"]
    r = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "node n0: KSM saves" in r.stdout and "no process has hinted" in r.stdout


def _mergeable_child(mib: int) -> subprocess.Popen[str]:
    code = ("import mmap, sys, ctypes; from gfaas.dedup.hint import merge\n"
            f"m = mmap.mmap(-1, {mib} << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\n"
            "m.write(bytes(range(256)) * (len(m) // 256)); merge(m); print('ready', flush=True); sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.timeout(120)
def test_a_killed_daemon_leaves_ksm_to_be_restored_by_the_next(make_config: Any, ksm_restored: KsmSysfs) -> None:
    """SIGKILL in the middle of a burst leaves KSM at the burst setting; the next daemon on the machine
    restores the settings the first one found, before it serves anything."""
    before = ksm_restored.read_settings()
    cfg = make_config()
    kids = [_mergeable_child(256) for _ in range(2)]
    node = LocalNode(cfg).__enter__()
    try:
        with gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as adm:
            for k in kids:
                adm.dedup_hint(k.pid, "wf", "f", "d", 256 << 20)
        deadline = time.monotonic() + 10
        while ksm_restored.read_settings() == before:
            assert time.monotonic() < deadline, "the burst never started"
            time.sleep(0.005)
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait()
        assert ksm_restored.read_settings() != before  # nobody restored them
        node.__exit__(None, None, None)
        node = LocalNode(cfg).__enter__()
        assert ksm_restored.read_settings() == before
        assert not Path("/run/gfaas-ksm/ksm.saved").exists()
    finally:
        node.__exit__(None, None, None)
        for k in kids:
            k.kill()
            k.wait()


def test_a_failed_shared_load_falls_back_to_a_private_copy(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A store that cannot take the weights (a full /dev/shm) costs the worker memory, not the function:
    it loads a private copy, says so, and answers as before."""
    import errno

    import gfaas.dedup.shared as shared

    def full(*_a: Any, **_k: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shared, "load_shared", full)
    want = _reference_logits()
    with caplog.at_level("WARNING", logger="gfaas.runtime"), \
            _rt(dedup="shared", executor="inproc", sandbox="none") as rt:
        rt.deploy(twins("full"))
        out = rt.invoke("full", {"img": IMG}, timeout=120).outputs
    np.testing.assert_allclose(out["f"], want, rtol=1e-5, atol=1e-5)
    assert any("shared loading failed" in r.message and "private copy" in r.message for r in caplog.records)
