"""gfaas.dedup.ksm against a fake sysfs directory that behaves like the 6.x kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from gfaas.dedup.ksm import KsmCounters, KsmSysfs
from gfaas.errors import ConfigError, DedupError

DEFAULTS = {
    "run": "0",
    "pages_to_scan": "100",
    "sleep_millisecs": "20",
    "advisor_mode": "[none] scan-time",
    "smart_scan": "1",
    "advisor_min_pages_to_scan": "500",
    "pages_shared": "7",
    "pages_sharing": "21",
    "full_scans": "3",
}


class KernelLikeKsm(KsmSysfs):
    """Fake sysfs that records writes and copies the kernel's rules: advisor_mode shows the choice
    in brackets and a mode change resets pages_to_scan; pages_to_scan is EINVAL under scan-time."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writes: list[tuple[str, str]] = []

    def _write(self, name: str, value: str) -> None:
        self.writes.append((name, value))
        mode = self._read("advisor_mode")
        if name == "pages_to_scan" and mode.startswith("none ["):
            raise DedupError(f"writing {value!r} to pages_to_scan failed: [Errno 22] Invalid argument")
        if name == "advisor_mode":
            if value not in ("none", "scan-time"):
                raise DedupError("EINVAL")
            changed = (value == "none") != mode.startswith("[none]")
            super()._write(name, "[none] scan-time" if value == "none" else "none [scan-time]")
            if changed:
                reset = "100" if value == "none" else self._read("advisor_min_pages_to_scan")
                (self.root / "pages_to_scan").write_text(reset)
            return
        super()._write(name, value)


def make_sysfs(tmp_path: Path, **overrides: str) -> KernelLikeKsm:
    root = tmp_path / "ksm"
    root.mkdir()
    for name, value in {**DEFAULTS, **overrides}.items():
        (root / name).write_text(value + "\n")
    return KernelLikeKsm(root)


def test_read_settings_selected_advisor(tmp_path: Path) -> None:
    """advisor_mode is read as the bracketed choice; values are stripped."""
    ksm = make_sysfs(tmp_path)
    assert ksm.read_settings() == {
        "run": "0",
        "pages_to_scan": "100",
        "sleep_millisecs": "20",
        "advisor_mode": "none",
        "smart_scan": "1",
    }


def test_burst_then_restore_exact_order(tmp_path: Path) -> None:
    """Burst: advisor first, run last. Restore to run=0: run first, every value back exactly."""
    ksm = make_sysfs(tmp_path)
    saved = ksm.read_settings()
    ksm.write_settings({"advisor_mode": "none", "pages_to_scan": "100000", "sleep_millisecs": "0", "run": "1"})
    assert ksm.writes == [("pages_to_scan", "100000"), ("sleep_millisecs", "0"), ("run", "1")]
    ksm.writes.clear()
    ksm.write_settings(saved)
    assert ksm.writes == [
        ("run", "0"),
        ("pages_to_scan", "100"),
        ("sleep_millisecs", "20"),
        ("smart_scan", "1"),
    ]
    assert ksm.read_settings() == saved


def test_restore_scan_time_advisor(tmp_path: Path) -> None:
    """From the scan-time advisor: the burst switches it off before setting pages_to_scan, the
    restore switches it back on and leaves pages_to_scan to it (the kernel refuses the write)."""
    ksm = make_sysfs(tmp_path, advisor_mode="none [scan-time]", pages_to_scan="500", run="1")
    saved = ksm.read_settings()
    assert saved["advisor_mode"] == "scan-time"
    ksm.write_settings({"advisor_mode": "none", "pages_to_scan": "100000", "sleep_millisecs": "0", "run": "1"})
    assert ksm.writes[:2] == [("advisor_mode", "none"), ("pages_to_scan", "100000")]
    assert ksm.read_settings()["pages_to_scan"] == "100000"
    ksm.writes.clear()
    ksm.write_settings(saved)
    assert ksm.writes == [
        ("advisor_mode", "scan-time"),
        ("sleep_millisecs", "20"),
        ("smart_scan", "1"),
        ("run", "1"),
    ]
    assert ksm.read_settings() == saved


def test_write_settings_validates(tmp_path: Path) -> None:
    """Unknown keys, bad numbers and bad modes are refused before anything is written."""
    ksm = make_sysfs(tmp_path)
    with pytest.raises(ConfigError, match=r"unknown KSM settings \['max_page_sharing'\]"):
        ksm.write_settings({"run": "1", "max_page_sharing": "2"})
    with pytest.raises(ConfigError, match="pages_to_scan must be a non-negative integer, got '-5'"):
        ksm.write_settings({"run": "1", "pages_to_scan": "-5"})
    with pytest.raises(ConfigError, match="advisor_mode must be one of"):
        ksm.write_settings({"advisor_mode": "fast"})
    assert ksm.writes == []


def test_counters_and_availability(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counters read as ints, 0 where the kernel lacks the file; a missing dir is not available."""
    ksm = make_sysfs(tmp_path)
    assert ksm.counters() == KsmCounters(7, 21, 0, 0, 0, 3, 0)
    assert ksm.available() and ksm.writable() and ksm.why_not_controllable() is None
    gone = KsmSysfs(tmp_path / "nope")
    assert not gone.available() and not gone.writable()
    assert "does not exist (kernel built without CONFIG_KSM)" in str(gone.why_not_controllable())
    monkeypatch.setattr("gfaas.dedup.ksm.os.access", lambda path, mode: False)  # as a non-root user
    assert ksm.available() and not ksm.writable()
    assert "not writable by uid" in str(ksm.why_not_controllable())
    assert "run the node daemon as root" in str(ksm.why_not_controllable())
