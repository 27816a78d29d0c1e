"""runtime.scratch: a runtime killed outright leaves its scratch directories (its weight store in
/dev/shm, its node's run directory), and the next runtime that makes one removes them, and only
them: not a live owner's, not a directory made a moment ago, not another user's files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gfaas.runtime import scratch
from gfaas.runtime.dedup import RuntimeDedup
from gfaas.runtime.scratch import Scratch, sweep

OWNER = """
import sys, time
from gfaas.runtime.scratch import Scratch
s = Scratch("gfaas-t-", sys.argv[1])
(s.path / "weights").write_bytes(b"x" * 4096)
print(s.path, flush=True)
time.sleep(60)
"""


def _owner(base: Path) -> tuple[subprocess.Popen[str], Path]:
    p = subprocess.Popen([sys.executable, "-c", OWNER, str(base)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    return p, Path(p.stdout.readline().strip())


def _age(path: Path, seconds: float) -> None:
    lock = f"{path}.owner"
    t = time.time() - seconds
    os.utime(lock, (t, t))


def test_a_scratch_directory_is_private_and_goes_with_its_lock(tmp_path: Path) -> None:
    s = Scratch("gfaas-t-", str(tmp_path))
    assert s.path.is_dir() and (s.path.stat().st_mode & 0o777) == 0o700
    assert Path(f"{s.path}.owner").is_file()
    (s.path / "f").write_text("x")
    s.remove()
    s.remove()  # twice is harmless
    assert list(tmp_path.iterdir()) == []


def test_a_killed_owners_directory_is_removed_by_the_next_one(tmp_path: Path) -> None:
    p, path = _owner(tmp_path)
    try:
        _age(path, 2 * scratch.STALE_S)
        assert sweep("gfaas-t-", str(tmp_path)) == []  # its owner lives: kept, however old
        assert path.is_dir()
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert path.is_dir(), "a killed owner cannot remove its own directory"
        _age(path, scratch.STALE_S / 2)
        assert sweep("gfaas-t-", str(tmp_path)) == []  # too young to judge: kept
        _age(path, 2 * scratch.STALE_S)
        nxt = Scratch("gfaas-t-", str(tmp_path))  # making one sweeps
        assert not path.exists() and not Path(f"{path}.owner").exists()
        assert sorted(x.name for x in tmp_path.iterdir()) == sorted([nxt.path.name, nxt.path.name + ".owner"])
        nxt.remove()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_other_prefixes_links_and_other_users_files_are_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.mkdir()
    (tmp_path / "gfaas-t-link.owner").symlink_to(tmp_path / "elsewhere.owner")
    (tmp_path / "elsewhere.owner").write_text("")
    (tmp_path / "gfaas-t-dir").symlink_to(target)  # a lock for a link to someone's directory
    (tmp_path / "gfaas-t-dir.owner").write_text("")
    (tmp_path / "other-x").mkdir()
    (tmp_path / "other-x.owner").write_text("")
    for f in tmp_path.iterdir():
        if f.name.endswith(".owner") and not f.is_symlink():
            _age(f.with_suffix(""), 2 * scratch.STALE_S)
    assert sweep("gfaas-t-", str(tmp_path)) == []
    assert target.is_dir() and (tmp_path / "other-x").is_dir() and (tmp_path / "gfaas-t-dir").is_symlink()
    if os.geteuid() == 0:  # a lock file of another user's is not this user's to judge
        (tmp_path / "gfaas-t-theirs").mkdir()
        (tmp_path / "gfaas-t-theirs.owner").write_text("")
        _age(tmp_path / "gfaas-t-theirs", 2 * scratch.STALE_S)
        os.chown(tmp_path / "gfaas-t-theirs.owner", 65534, 65534)
        assert sweep("gfaas-t-", str(tmp_path)) == []
        assert (tmp_path / "gfaas-t-theirs").is_dir()


def test_the_weight_store_is_a_scratch_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """RuntimeDedup keeps its store in one (so a killed runtime's store is swept), and removes it."""
    d = RuntimeDedup("shared")
    try:
        assert d.store_dir is not None and Path(f"{d.store_dir}.owner").is_file()
        assert d.store_dir.name.startswith("gfaas-shared-")
    finally:
        d.close()
    assert not d.store_dir.exists() and not Path(f"{d.store_dir}.owner").exists()
