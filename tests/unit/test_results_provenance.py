"""Every committed result file says which commit it measured, on which machine, from a clean tree.

A 9x large-object regression went unnoticed for 84 commits because a result file was never re-run
and nothing said which code it described. The commit a result names must exist and be an
ancestor of HEAD (a result can only name the commit before the one that adds it).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gfaas.provenance import git_state, machine, provenance

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)


def _history_available() -> str | None:
    r = _git("rev-parse", "--is-shallow-repository")
    if r.returncode != 0:
        return "not a git checkout"
    if r.stdout.strip() == "true":
        return "a shallow clone: the measured commits may be outside its history"
    return None


def test_there_are_result_files() -> None:
    assert RESULTS, "benchmarks/results/ holds no result file"


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_result_names_an_ancestor_commit_measured_clean(path: Path) -> None:
    why = _history_available()
    if why:
        pytest.skip(why)
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict) and "provenance" in doc, f"{path.name} has no provenance block; re-run it"
    prov = doc["provenance"]
    sha = prov.get("commit")
    assert isinstance(sha, str) and len(sha) == 40, f"{path.name}: commit {sha!r} is not a full sha"
    assert _git("cat-file", "-e", f"{sha}^{{commit}}").returncode == 0, f"{path.name}: {sha} is not in the history"
    assert _git("merge-base", "--is-ancestor", sha, "HEAD").returncode == 0, f"{path.name}: {sha} is not behind HEAD"
    assert prov.get("dirty") is False, f"{path.name} was measured with uncommitted changes; commit, then re-run"
    m = prov.get("machine") or {}
    assert m.get("cores") and m.get("mem_bytes") and m.get("cpu_model"), f"{path.name}: machine not recorded"
    assert prov.get("command"), f"{path.name}: the command that made it is not recorded"


def test_provenance_of_this_checkout(tmp_path: Path) -> None:
    """The block names this checkout's HEAD; a tree outside git gives None, not an error."""
    why = _history_available()
    if why:
        pytest.skip(why)
    head = _git("rev-parse", "HEAD").stdout.strip()
    p = provenance(["gfaas", "bench"])
    assert p["commit"] == head and p["command"] == "gfaas bench" and isinstance(p["dirty"], bool)
    assert git_state(tmp_path) == {"commit": None, "dirty": None}
    assert machine()["cores"] >= 1


def test_only_changes_to_what_runs_make_a_tree_dirty(tmp_path: Path) -> None:
    """Docs and result files do not change a measurement; source, benchmark scripts and the build do."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, timeout=30)

    git("init", "-q")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("hello\n")
    git("add", "-A")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "README.md").write_text("changed\n")
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "src" / "m.py").write_text("x = 2\n")
    assert git_state(tmp_path)["dirty"] is True


def test_a_copied_tree_uses_the_declared_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a device machine the tree arrives over a stale .git: the sender's declared commit wins, and says so."""
    import gfaas.provenance as prov

    monkeypatch.setattr(prov, "_git", lambda args, cwd: "b" * 40 if args[0] == "rev-parse" else " M src/x.py")
    monkeypatch.delenv("GFAAS_SOURCE_COMMIT", raising=False)
    assert prov.git_state() == {"commit": "b" * 40, "dirty": True}
    monkeypatch.setattr(prov, "_git", lambda args, cwd: None)
    assert prov.git_state() == {"commit": None, "dirty": None}
    monkeypatch.setenv("GFAAS_SOURCE_COMMIT", "not-a-sha")
    assert prov.git_state() == {"commit": None, "dirty": None}
    monkeypatch.setattr(prov, "_git", lambda args, cwd: "b" * 40 if args[0] == "rev-parse" else " M src/x.py")
    monkeypatch.setenv("GFAAS_SOURCE_COMMIT", "a" * 40)
    monkeypatch.setenv("GFAAS_SOURCE_DIRTY", "0")
    assert prov.git_state() == {"commit": "a" * 40, "dirty": False, "commit_declared": True}
    monkeypatch.setenv("GFAAS_SOURCE_DIRTY", "maybe")
    assert prov.git_state()["dirty"] is None


def test_the_machine_block_says_how_much_cpu_other_guests_took_during_the_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``steal_s``: the steal ticks of /proc/stat since the command began, in seconds (None where the
    kernel has no such count); a benchmark run on a busy host says so in its own file."""
    from gfaas import provenance as p

    ticks = os.sysconf("SC_CLK_TCK")
    monkeypatch.setattr(p, "_STEAL_AT_START", 1000)
    monkeypatch.setattr(p, "_steal_ticks", lambda: 1000 + 3 * ticks // 2)
    m = p.machine()
    assert m["steal_s"] == 1.5 and m["run_s"] >= 0
    monkeypatch.setattr(p, "_steal_ticks", lambda: None)
    assert p.machine()["steal_s"] is None
