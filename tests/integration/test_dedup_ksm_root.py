"""KSM burst merging on the real kernel (root): merge speed, copy-on-write, crash restore, idleness.

Skipped without root or without a writable /sys/kernel/mm/ksm. KSM settings are global: the
`ksm_saved` fixture restores every tunable in a finally, whatever the test did. Other processes may
merge pages at the same time, so progress is read per process from /proc/PID/ksm_stat.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gfaas.dedup.controller import MergeController
from gfaas.dedup.ksm import KsmSysfs
from gfaas.dedup.madvise import PAGE
from gfaas.dedup.procstat import ksm_stat, mergeable_pids
from gfaas.policy.dedup import burst_settings

pytestmark = [pytest.mark.root, pytest.mark.timeout(60)]

KSM = KsmSysfs()
if os.geteuid() != 0:
    pytest.skip("KSM settings need root (run: sudo .venv/bin/python -m pytest ...)", allow_module_level=True)
if not KSM.writable() or not Path("/proc/self/ksm_stat").exists():
    pytest.skip(f"KSM not usable here: {KSM.why_not_controllable() or 'no /proc/PID/ksm_stat'}",
                allow_module_level=True)

MB = 1000 * 1000

# A worker: copies the shared random bytes into its own private anonymous memory, hints it, then
# answers "read I" (sha256 of page I), "write I" (overwrite page I) and "merging" on a pipe.
CHILD = r"""
import hashlib, mmap, sys
from gfaas.dedup.hint import merge
from gfaas.dedup.madvise import PAGE
n, path = int(sys.argv[1]), sys.argv[2]
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
with open(path, "rb") as f:
    f.readinto(m)
h = merge(m)
print("ready", h.length, flush=True)
for line in sys.stdin:
    cmd, *arg = line.split()
    if cmd == "read":
        i = int(arg[0])
        print(hashlib.sha256(m[i * PAGE:(i + 1) * PAGE]).hexdigest(), flush=True)
    elif cmd == "write":
        i = int(arg[0])
        m[i * PAGE:(i + 1) * PAGE] = b"\xa5" * PAGE
        print("ok", flush=True)
"""


class Worker:
    def __init__(self, nbytes: int, data: Path) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(nbytes), str(data)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.pid = self.p.pid

    def ready(self) -> int:
        word, length = self.p.stdout.readline().split()  # type: ignore[union-attr]
        assert word == "ready"
        return int(length)

    def ask(self, line: str) -> str:
        self.p.stdin.write(line + "\n")  # type: ignore[union-attr]
        self.p.stdin.flush()  # type: ignore[union-attr]
        return self.p.stdout.readline().strip()  # type: ignore[union-attr]

    def merging(self) -> int:
        st = ksm_stat(self.pid)
        return st.merging_pages if st else 0

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


@pytest.fixture
def ksm_saved(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The KSM settings before the test; restored exactly afterwards, whatever happened."""
    foreign = mergeable_pids()
    if foreign:
        pytest.skip(f"processes {sorted(foreign)} already have KSM-mergeable memory; the domain audit "
                    "would stop every burst (another KSM user is running)")
    saved = KSM.read_settings()
    try:
        yield saved
    finally:
        KSM.write_settings(saved)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    try:
        yield started
    finally:
        for w in started:
            w.close()


def _spawn(workers: list[Worker], tmp_path: Path, n: int, nbytes: int) -> list[int]:
    data = tmp_path / "random.bin"
    data.write_bytes(os.urandom(nbytes))
    for _ in range(n):
        workers.append(Worker(nbytes, data))
    return [w.ready() // PAGE for w in workers]


def test_eight_by_100mb_merged(ksm_saved: dict[str, str], workers: list[Worker], tmp_path: Path) -> None:
    """8 processes x 100 MB identical bytes, hinted: >= 85% of their pages merged (per-process
    ksm_stat), the burst ends by itself and KSM's settings are restored exactly."""
    pages = _spawn(workers, tmp_path, 8, 100 * MB)
    ctl = MergeController(tmp_path / "state.json")
    ctl.start()
    try:
        t0 = time.monotonic()
        for w in workers:
            ctl.hint(w.pid, domain="test", workflow="wf", function="f", nbytes=pages[0] * PAGE)
        t85 = None
        while time.monotonic() - t0 < 15:
            frac = sum(w.merging() for w in workers) / sum(pages)
            if frac >= 0.85:
                t85 = time.monotonic() - t0
                break
            time.sleep(0.01)
        assert ctl.wait_idle(15.0)
        t_idle = time.monotonic() - t0
        frac = sum(w.merging() for w in workers) / sum(pages)
        status = ctl.status()
    finally:
        ctl.stop()
    print(f"\n8 x 100 MB: 85% merged after {t85} s, burst over after {t_idle:.2f} s, final {frac:.1%}, "
          f"merge_seconds {[p['merge_seconds'] for p in status['processes']]}")
    assert t85 is not None and t85 < 10.0, f"85% not merged within 10 s (reached {frac:.1%})"
    assert frac >= 0.85
    assert status["last_burst"]["reason"] == "settled"
    assert ("burst_start", burst_settings(sum(pages)).as_sysfs()) in ctl.events
    assert ctl.events[-1] == ("restored", ksm_saved)
    assert KSM.read_settings() == ksm_saved
    assert not (tmp_path / "state.json").exists()


def test_copy_on_write_after_merge(ksm_saved: dict[str, str], workers: list[Worker], tmp_path: Path) -> None:
    """After merging, a process that writes to a merged page changes only its own copy: the others
    read the old bytes back, and the writer's merging_pages drops by one page."""
    pages = _spawn(workers, tmp_path, 3, 8 * MB)
    ctl = MergeController(tmp_path / "state.json")
    ctl.start()
    try:
        for w in workers:
            ctl.hint(w.pid, domain="test", workflow="wf", function="f", nbytes=pages[0] * PAGE)
        assert ctl.wait_idle(15.0)
    finally:
        ctl.stop()
    assert all(w.merging() >= 0.85 * p for w, p in zip(workers, pages, strict=True))
    page = 7
    before = [w.ask(f"read {page}") for w in workers]
    assert len(set(before)) == 1
    merged_before = workers[0].merging()
    assert workers[0].ask(f"write {page}") == "ok"
    after = [w.ask(f"read {page}") for w in workers]
    assert after[0] != before[0]
    assert after[1:] == before[1:]
    # ksm_merging_pages is updated when ksmd next visits the page, not at the copy-on-write fault:
    # a second hint (a short burst) lets it catch up.
    ctl = MergeController(tmp_path / "state.json")
    ctl.start()
    try:
        for w in workers:  # all of them: an unregistered mergeable process would stop the burst
            ctl.hint(w.pid, domain="test", workflow="wf", function="f", nbytes=pages[0] * PAGE)
        assert ctl.wait_idle(15.0)
    finally:
        ctl.stop()
    assert ctl.status()["last_burst"]["reason"] == "settled"
    assert workers[0].merging() == merged_before - 1
    assert [w.ask(f"read {page}") for w in workers] == after
    assert KSM.read_settings() == ksm_saved


KILLED = r"""
import sys
from pathlib import Path
from gfaas.dedup.controller import MergeController
ctl = MergeController(Path(sys.argv[1]), max_burst_s=60)
ctl.start(watch=False)  # no watcher: the burst lasts until this process is killed
ctl.hint(int(sys.argv[2]), domain="test", workflow="wf", function="f", nbytes=int(sys.argv[3]))
print("bursting", flush=True)
sys.stdin.read()
"""


def test_killed_controller_restored_by_next_start(
    ksm_saved: dict[str, str], workers: list[Worker], tmp_path: Path
) -> None:
    """A controller SIGKILLed mid-burst leaves the burst settings and its state file; the next
    controller's start() restores the original settings and removes the file."""
    pages = _spawn(workers, tmp_path, 1, 1 * MB)
    state = tmp_path / "state.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(state), str(workers[0].pid), str(pages[0] * PAGE)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "bursting"  # type: ignore[union-attr]
        burst = burst_settings(pages[0]).as_sysfs()
        assert {k: KSM.read_settings()[k] for k in burst} == burst
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(0.05)
        assert {k: KSM.read_settings()[k] for k in burst} == burst
        assert state.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    fresh = MergeController(state)
    fresh.start()
    fresh.stop()
    assert KSM.read_settings() == ksm_saved
    assert not state.exists()
    assert list(fresh.events) == [("recovered", ksm_saved)]


def test_no_hint_no_ksm_activity(ksm_saved: dict[str, str], tmp_path: Path) -> None:
    """A started controller with no hint for a second leaves KSM alone: run unchanged and ksmd
    neither scans pages nor completes scans."""
    if ksm_saved.get("run") != "0":
        pytest.skip(f"KSM run is {ksm_saved.get('run')} (someone else runs ksmd); idleness cannot be measured")
    before = KSM.counters()
    ctl = MergeController(tmp_path / "state.json")
    ctl.start()
    try:
        time.sleep(1.0)
        assert KSM.read_settings() == ksm_saved
    finally:
        ctl.stop()
    after = KSM.counters()
    assert (after.full_scans, after.pages_scanned) == (before.full_scans, before.pages_scanned)
    assert list(ctl.events) == []
    assert not (tmp_path / "state.json").exists()
