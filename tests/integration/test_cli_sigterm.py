"""SIGTERM ends a CLI command the way Ctrl-C does (gfaas.cli._exit_on_sigterm): the runtime it made
closes, so its workers and node daemon stop and its weight store leaves /dev/shm. Killed outright, a
``gfaas demo`` once left 1.1 GB of model weights there."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

STORES = "/dev/shm/gfaas-shared-*"  # runtime/dedup.py: a runtime's weight store (dedup "on")


def _stores() -> set[str]:
    """The weight stores in /dev/shm, without the lock file beside each (runtime/scratch.py)."""
    return {s for s in glob.glob(STORES) if not s.endswith(".owner")}


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.serial  # it watches /dev/shm for the store the command makes: no other test may make one meanwhile
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="the weight store lives in /dev/shm, which this machine lacks")
def test_sigterm_closes_the_runtime_and_removes_its_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    before = _stores()
    env = {**os.environ, "GFAAS_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.Popen([sys.executable, "-m", "gfaas", "demo", "--scale", "small", "--workflows", "social",
                          "--requests", "100000", "--out", str(tmp_path / "demo")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # Its store exists and its workers are up: the demo is serving requests.
        deadline = time.monotonic() + 120
        new: set[str] = set()
        while time.monotonic() < deadline and p.poll() is None:
            new = _stores() - before
            if new and len(_children(p.pid)) >= 3:  # the node daemon, the worker template, and more
                break
            time.sleep(0.2)
        assert p.poll() is None, f"the demo ended early: {p.stderr.read() if p.stderr else ''}"
        assert len(new) == 1, f"expected one new weight store, found {sorted(new)}"
        kids = _children(p.pid)
        time.sleep(1.0)  # well inside its runtime's `with` block
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    left = [s for s in new if os.path.exists(s)] + [f"{s}.owner" for s in new if os.path.exists(f"{s}.owner")]
    for store in left:  # not for the tests after this one to trip over (test_dataplane_reliability once did)
        if store.endswith(".owner"):
            os.unlink(store)
        else:
            shutil.rmtree(store, ignore_errors=True)
    assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert not left, f"the weight store was left in /dev/shm: {left}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(k) for k in kids):
        time.sleep(0.1)
    assert not [k for k in kids if _alive(k)], "a child of the runtime outlived it"
