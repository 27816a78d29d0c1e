"""Warm workers keep what their handlers free (RuntimeConfig.worker_heap, gfaas.runtime.heap).

``tiny``'s ``gen`` makes a 64 MiB array per call. A worker that gives the array's memory back to the
kernel when it is freed faults it in again on the next call (hundreds of faults with transparent huge
pages, 16,384 without); one that keeps it serves the next call from memory it already touched. Counted
from the worker's own minor-fault counter (/proc/PID/stat), so the test does not depend on timing.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from gfaas.errors import ConfigError
from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.workflows.tiny import SPEC, expected_total

pytestmark = pytest.mark.integration

ELEMENTS = 16 * 2**20  # float32: 64 MiB, over glibc's largest mmap threshold (32 MiB)


def _minflt(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])  # field 10, minflt


def _faults_per_call(heap: str) -> int:
    inputs = {"n": np.asarray(ELEMENTS, dtype=np.int64)}
    with LocalRuntime(RuntimeConfig(worker_heap=heap, fuse_chains=True)) as rt:
        rt.deploy(SPEC)
        for _ in range(2):  # the first calls grow the heap (or map and unmap) once
            assert rt.invoke("tiny", inputs, timeout=60).status == "done"
        # gen's worker runs red too (a chain), with gen's array handed over in it
        (pid,) = {w.pid for p in rt.deployments.pools.values() if p.init.function == "gen" for w in p.slots}
        before = _minflt(pid)
        res = rt.invoke("tiny", inputs, timeout=60)
        after = _minflt(pid)
    assert res.status == "done" and float(res.outputs["total"]) == expected_total(ELEMENTS)
    return after - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and glibc's mallopt")
def test_a_warm_worker_serves_the_next_calls_large_array_without_faulting_it_in() -> None:
    released, kept = _faults_per_call("release"), _faults_per_call("reuse")
    assert released >= 32, released  # 64 MiB in at most 2 MiB pages
    assert kept * 8 <= released, (kept, released)


def test_keep_freed_serves_large_blocks_from_the_heap() -> None:
    """In a child process (mallopt changes the process for good): a freed 64 MiB array's memory is
    used again for the next one, with no page fault."""
    code = ("import resource, numpy as np, sys\nfrom gfaas.runtime.heap import keep_freed\n"
            "ok = keep_freed() if sys.argv[1] == 'reuse' else True\n"
            "f = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for _ in range(2): x = np.arange(16 * 2**20, dtype=np.float32); del x\n"
            "f0 = f(); x = np.arange(16 * 2**20, dtype=np.float32); print(ok, f() - f0)\n")
    out = {}
    for mode in ("reuse", "release"):
        p = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=60, check=True)
        ok, faults = p.stdout.split()
        assert ok == "True"
        out[mode] = int(faults)
    assert out["reuse"] * 8 <= out["release"] and out["release"] >= 32, out


def test_worker_heap_names_its_choices() -> None:
    with pytest.raises(ConfigError, match="worker_heap='keep' is not one of 'reuse', 'release'"):
        RuntimeConfig(worker_heap="keep")  # type: ignore[arg-type]
