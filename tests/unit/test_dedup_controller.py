"""gfaas.dedup.controller.MergeController against a fake sysfs, a fake /proc and a fake clock."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from gfaas.dedup.controller import MergeController
from gfaas.dedup.ksm import KsmSysfs
from gfaas.dedup.madvise import PAGE
from gfaas.errors import DedupError, DedupRefused

SAVED = {"run": "0", "pages_to_scan": "100", "sleep_millisecs": "20", "advisor_mode": "none", "smart_scan": "1"}
BURST = {"advisor_mode": "none", "pages_to_scan": "10000", "sleep_millisecs": "0", "smart_scan": "0", "run": "1"}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeKsm(KsmSysfs):
    """Plain files; records every write and checks the state file exists before KSM is touched."""

    def __init__(self, root: Path, state_path: Path) -> None:
        super().__init__(root)
        self.state_path = state_path
        self.writes: list[tuple[str, str]] = []
        self.fail_writes = False
        self.state_seen: list[dict] = []

    def _write(self, name: str, value: str) -> None:
        if self.fail_writes:
            raise DedupError(f"writing {value!r} to {name} failed: [Errno 5] Input/output error")
        if self.state_path.exists():
            self.state_seen.append(json.loads(self.state_path.read_text())["settings"])
        else:
            self.state_seen.append({})
        self.writes.append((name, value))
        super()._write(name, value)


class World:
    """A fake node: sysfs dir, /proc tree, clock and a controller on them."""

    def __init__(self, tmp_path: Path, **kw: float) -> None:
        self.sys = tmp_path / "ksm"
        self.sys.mkdir()
        for name, value in {**SAVED, "advisor_mode": "[none] scan-time", "full_scans": "5"}.items():
            (self.sys / name).write_text(value + "\n")
        self.proc = tmp_path / "proc"
        self.proc.mkdir()
        self.state = tmp_path / "state" / "ksm-state.json"
        self.ksm = FakeKsm(self.sys, self.state)
        self.clock = Clock()
        self.ctl = self.controller(**kw)

    def controller(self, **kw: float) -> MergeController:
        return MergeController(self.state, ksm=self.ksm, proc_root=self.proc, clock=self.clock, **kw)

    def pid(self, pid: int, merging: int = 0, mergeable: bool = True, started: int = 1000) -> None:
        d = self.proc / str(pid)
        d.mkdir(exist_ok=True)
        (d / "stat").write_text(f"{pid} (python3) S " + " ".join(["0"] * 18) + f" {started} 0 0\n")
        (d / "ksm_stat").write_text(
            f"ksm_rmap_items {merging}\nksm_merging_pages {merging}\nksm_process_profit {merging * PAGE}\n"
            f"ksm_merge_any: no\nksm_mergeable: {'yes' if mergeable else 'no'}\n"
        )
        (d / "smaps_rollup").write_text("Rss: 1000 kB\nPss: 600 kB\nPrivate_Dirty: 200 kB\nShared_Clean: 800 kB\n")

    def kill(self, pid: int) -> None:
        for f in (self.proc / str(pid)).iterdir():
            f.unlink()
        (self.proc / str(pid)).rmdir()

    def full_scans(self, n: int) -> None:
        (self.sys / "full_scans").write_text(f"{n}\n")

    def step(self, dt: float = 0.1) -> None:
        self.clock.t += dt
        self.ctl.poll()

    def settings(self) -> dict[str, str]:
        return KsmSysfs(self.sys).read_settings()


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


def test_burst_lifecycle_exact(w: World) -> None:
    """Hint → state file (0600, saved settings) before any KSM write → burst → merging levels off →
    settings restored exactly, state file gone; exact event log and merge time."""
    w.ctl.start(watch=False)
    w.pid(101)
    w.ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=400 * PAGE)
    assert w.settings() == {**SAVED, **BURST}
    # smart scan off for the burst: it would skip pages that failed to merge before their partner came
    assert w.ksm.writes == [("pages_to_scan", "10000"), ("sleep_millisecs", "0"), ("smart_scan", "0"), ("run", "1")]
    assert w.ksm.state_seen == [SAVED, SAVED, SAVED, SAVED]
    assert stat.S_IMODE(w.state.stat().st_mode) == 0o600
    for merging in (0, 0, 150, 400):
        w.pid(101, merging)
        w.step()
    assert w.ctl.status()["burst"]["pending_pids"] == [101]
    w.step()  # 0.1 s flat: window 0.25 s not covered yet
    w.step()
    assert w.ctl.status()["burst"] is not None
    w.step()
    assert w.ctl.status()["burst"] is None
    assert list(w.ctl.events) == [
        ("hint", 101, "a"),
        ("burst_start", BURST),
        ("settled", 101),
        ("burst_end", "settled"),
        ("restored", SAVED),
    ]
    assert w.ksm.writes[4:] == [("run", "0"), ("pages_to_scan", "100"), ("sleep_millisecs", "20"), ("smart_scan", "1")]
    assert w.settings() == SAVED and not w.state.exists()
    proc = w.ctl.status()["processes"][0]
    assert proc["merge_seconds"] == pytest.approx(0.4)  # hint at 100.0, last gain at 100.4
    assert proc["merged_bytes"] == 400 * PAGE and proc["hinted_bytes"] == 400 * PAGE
    assert proc["pss_bytes"] == 600 * 1024 and proc["rss_bytes"] == 1000 * 1024
    w.ctl.stop()
    assert w.ctl.events[-1] == ("restored", SAVED)  # stop() after the burst changes nothing
    assert len(w.ksm.writes) == 8


def test_crash_restore_from_state_file(w: World, tmp_path: Path) -> None:
    """A state file left by a killed controller: the next start() restores its settings exactly
    (not the burst values found in sysfs) and removes it."""
    w.ctl.start(watch=False)
    w.pid(101)
    w.ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=PAGE)
    assert w.state.exists() and w.settings()["run"] == "1"
    # the controller dies here: nothing restores; a new one starts on the same node
    fresh = w.controller()
    fresh.start(watch=False)
    assert w.settings() == SAVED and not w.state.exists()
    assert list(fresh.events) == [("recovered", SAVED)]
    fresh.stop()


def test_failed_restore_keeps_state_file(w: World) -> None:
    """If restoring fails the state file stays, so the next start() restores from it."""
    w.ctl.start(watch=False)
    w.pid(101)
    w.ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=PAGE)
    w.ksm.fail_writes = True
    with pytest.raises(DedupError, match="Input/output error"):
        w.ctl.stop()
    assert w.state.exists() and w.settings()["run"] == "1"
    w.ksm.fail_writes = False
    fresh = w.controller()
    fresh.start(watch=False)
    assert w.settings() == SAVED and not w.state.exists()


def test_second_domain_refused_until_first_is_gone(w: World) -> None:
    """A hint from another domain while the active one has live hinted processes is refused naming
    the active domain; once those processes are gone it is admitted."""
    w.ctl.start(watch=False)
    w.pid(101)
    w.pid(202)
    w.ctl.hint(101, domain="tenant-a", workflow="wf", function="f", nbytes=PAGE)
    with pytest.raises(DedupRefused, match=r"held by sharing domain 'tenant-a' \(1 live hinted process\)"):
        w.ctl.hint(202, domain="tenant-b", workflow="wf2", function="g", nbytes=PAGE)
    assert w.ctl.status()["active_domain"] == "tenant-a"
    w.kill(101)
    w.ctl.hint(202, domain="tenant-b", workflow="wf2", function="g", nbytes=PAGE)
    assert w.ctl.status()["active_domain"] == "tenant-b"
    assert [e for e in w.ctl.events if e[0] in ("hint", "refused", "gone")] == [
        ("hint", 101, "tenant-a"),
        ("refused", 202, "tenant-b"),
        ("gone", 101),
        ("hint", 202, "tenant-b"),
    ]
    w.ctl.stop()
    assert w.settings() == SAVED


def test_audit_stops_burst_on_foreign_mergeable(w: World) -> None:
    """During a burst a process with ksm_mergeable yes outside the active domain ends the burst and
    the settings are restored; with one present no burst starts at all."""
    w.ctl.start(watch=False)
    w.pid(101)
    w.pid(303, mergeable=False)
    w.ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=PAGE)
    w.step()
    assert w.ctl.status()["burst"] is not None
    w.pid(303, mergeable=True)
    writes = len(w.ksm.writes)
    w.step()
    assert list(w.ctl.events)[-4:] == [("audit", (303,)), ("unmerged", (303,)), ("burst_end", "foreign_mergeable"),
                                       ("restored", SAVED)]
    # KSM unmerges everything (run = 2: the pages the foreign process got merged are copied back) before
    # the saved settings come back
    assert w.ksm.writes[writes:] == [("run", "2"), ("run", "0"), ("pages_to_scan", "100"), ("sleep_millisecs", "20"),
                                     ("smart_scan", "1")]
    assert w.settings() == SAVED and not w.state.exists()
    w.ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=PAGE)
    assert list(w.ctl.events)[-2:] == [("hint", 101, "a"), ("audit", (303,))]
    assert w.ctl.status()["burst"] is None and w.settings() == SAVED


def test_a_burst_shorter_than_the_audit_interval_is_audited_before_it_ends(tmp_path: Path) -> None:
    """Issue 37 row 3: a burst settled in 0.09 s, before its first 100 ms audit, with a foreign
    process's guessed pages merged. Now the step that would end it audits first: the foreign
    process stops it and KSM unmerges, whatever the audit interval."""
    w = World(tmp_path, audit_s=10.0)
    w.ctl.start(watch=False)
    w.pid(101)
    w.ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=400 * PAGE)
    w.pid(101, 400)
    w.step(0.03)
    w.pid(666, merging=2048)  # marked its guesses when the burst started; KSM merged them
    w.step(0.03)
    w.step(0.3)  # the hinted process leveled off: this step would have ended the burst as settled
    assert [e[0] for e in w.ctl.events] == ["hint", "burst_start", "settled", "audit", "unmerged", "burst_end",
                                            "restored"]
    assert w.ctl.events[5] == ("burst_end", "foreign_mergeable") and ("run", "2") in w.ksm.writes
    assert w.settings() == SAVED


def test_max_burst_and_full_scan_settling(tmp_path: Path) -> None:
    """No progress: the burst ends at max_burst_s; content with no duplicates settles after three
    full scans since its hint instead."""
    w = World(tmp_path, max_burst_s=0.95)
    w.ctl.start(watch=False)
    w.pid(101)
    w.ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=PAGE)
    for _ in range(9):
        w.step()
    assert w.ctl.status()["burst"] is not None
    w.step()
    assert list(w.ctl.events)[-2:] == [("burst_end", "max_burst_s"), ("restored", SAVED)]
    assert w.ctl.status()["processes"][0]["merge_seconds"] is None
    w.ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=PAGE)
    w.full_scans(7)
    w.step()
    assert w.ctl.status()["burst"] is not None
    w.full_scans(8)
    w.step()
    assert list(w.ctl.events)[-3:] == [("settled", 101), ("burst_end", "settled"), ("restored", SAVED)]
    assert w.ctl.status()["processes"][0]["hinted_bytes"] == 2 * PAGE


def test_vanished_pid_ends_burst(w: World) -> None:
    """Two workers madvised before their hints arrive: the first hint finds the second worker
    mergeable but unregistered (audit, no burst), the second starts the burst. A hinted process that
    exits mid-burst is dropped; with none pending the burst ends."""
    w.ctl.start(watch=False)
    w.pid(101)
    w.pid(102)
    w.ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=PAGE)
    w.ctl.hint(102, domain="a", workflow="wf", function="f", nbytes=PAGE)
    w.kill(101)
    w.step()
    w.kill(102)
    w.step()
    assert list(w.ctl.events)[:4] == [("hint", 101, "a"), ("audit", (102,)), ("hint", 102, "a"), ("burst_start", BURST)]
    assert [e[0] for e in w.ctl.events][4:] == ["gone", "gone", "burst_end", "restored"]
    assert w.ctl.status()["active_domain"] is None and w.settings() == SAVED


def test_not_controllable_records_hints(tmp_path: Path) -> None:
    """Without KSM: hints are recorded, no exception, status says why KSM is not controllable."""
    proc = tmp_path / "proc"
    (proc / "101").mkdir(parents=True)
    (proc / "101" / "ksm_stat").write_text("ksm_merging_pages 0\nksm_mergeable: yes\n")
    ctl = MergeController(tmp_path / "s.json", ksm=KsmSysfs(tmp_path / "none"), proc_root=proc)
    ctl.start()
    ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=PAGE)
    st = ctl.status()
    assert st["ksm"]["controllable"] is False and "CONFIG_KSM" in st["ksm"]["reason"]
    assert st["burst"] is None and st["processes"][0]["pid"] == 101
    assert st["events"] == [["hint", 101, "a"]]
    assert ctl.wait_idle(0.1)
    ctl.stop()
    assert not (tmp_path / "s.json").exists()


def test_status_is_json_and_watcher_thread_ends_burst(tmp_path: Path) -> None:
    """With the real watcher thread and clock, a leveled-off process ends the burst by itself; the
    status dict survives json.dumps."""
    w = World(tmp_path)
    ctl = MergeController(w.state, ksm=w.ksm, proc_root=w.proc, poll_s=0.01, window_s=0.05)
    ctl.start()
    w.pid(101, merging=4)
    ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=4 * PAGE)
    assert json.loads(json.dumps(ctl.status()))["burst"]["settings"] == BURST
    assert ctl.wait_idle(5.0)
    ctl.stop()
    st = json.loads(json.dumps(ctl.status()))
    assert st["last_burst"]["reason"] == "settled" and st["saved_bytes"] == 0
    assert w.settings() == SAVED and not w.state.exists()


def test_reused_pid_is_not_the_hinted_process(w: World) -> None:
    """A hinted process exits and a later process gets its pid: it is not registered (start time
    differs), so another domain is admitted, and the running burst, now serving that domain, is
    audited at once and stopped for the mergeable newcomer."""
    w.ctl.start(watch=False)
    w.pid(101, started=1000)
    w.ctl.hint(101, domain="a", workflow="wf", function="f", nbytes=PAGE)
    w.pid(101, started=2000)  # pid reused
    w.pid(202)
    w.ctl.hint(202, domain="b", workflow="wf", function="g", nbytes=PAGE)
    assert [e for e in w.ctl.events if e[0] in ("hint", "gone", "audit")] == [
        ("hint", 101, "a"),
        ("gone", 101),
        ("hint", 202, "b"),
        ("audit", (101,)),
    ]
    assert list(w.ctl.events)[-2:] == [("burst_end", "foreign_mergeable"), ("restored", SAVED)]
    assert w.ctl.status()["active_domain"] == "b"
    w.ctl.stop()
