"""gfaas.dedup.procstat against a fake /proc tree."""

from __future__ import annotations

import os
from pathlib import Path

from gfaas.dedup.procstat import KsmStat, MemUsage, ksm_stat, mem_usage, mergeable_pids, start_time

STAT = """\
ksm_rmap_items 25600
ksm_zero_pages 0
ksm_merging_pages 25000
ksm_process_profit 101990400
ksm_merge_any: no
ksm_mergeable: yes
"""

ROLLUP = """\
55d0a0000000-7ffc00041000 ---p 00000000 00:00 0                          [rollup]
Rss:              204800 kB
Pss:               30000 kB
Pss_Anon:          25000 kB
Shared_Clean:       1000 kB
Shared_Dirty:     190000 kB
Private_Clean:       800 kB
Private_Dirty:     13000 kB
"""


def _proc(root: Path, pid: int, **files: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / str(pid) / name).write_text(text)


def test_ksm_stat_parses_and_none_when_gone(tmp_path: Path) -> None:
    """Every field of ksm_stat; a vanished process is None, not an error."""
    _proc(tmp_path, 7, ksm_stat=STAT)
    assert ksm_stat(7, tmp_path) == KsmStat(25000, 25600, 101990400, True, False)
    assert ksm_stat(8, tmp_path) is None
    _proc(tmp_path, 9, ksm_stat="ksm_rmap_items 3\n")  # an older kernel: fewer lines
    assert ksm_stat(9, tmp_path) == KsmStat(0, 3, 0, False, False)


def test_mem_usage_in_bytes(tmp_path: Path) -> None:
    """smaps_rollup kB become bytes; private and shared sum their clean and dirty parts."""
    _proc(tmp_path, 7, smaps_rollup=ROLLUP)
    assert mem_usage(7, tmp_path) == MemUsage(
        rss=204800 * 1024, pss=30000 * 1024, private=13800 * 1024, shared=191000 * 1024
    )
    assert mem_usage(8, tmp_path) is None


def test_mergeable_pids(tmp_path: Path) -> None:
    """Only numeric entries with ksm_mergeable or ksm_merge_any yes; others and gone ones skipped."""
    _proc(tmp_path, 7, ksm_stat=STAT)
    _proc(tmp_path, 8, ksm_stat=STAT.replace("mergeable: yes", "mergeable: no"))
    _proc(tmp_path, 9, ksm_stat=STAT.replace("mergeable: yes", "mergeable: no").replace("any: no", "any: yes"))
    _proc(tmp_path, 10)  # no ksm_stat: the process exited while we listed /proc
    (tmp_path / "self").mkdir()
    assert mergeable_pids(tmp_path) == {7, 9}


def test_real_proc_self() -> None:
    """This process: ksm_stat and smaps_rollup parse on the running kernel (if it has them)."""
    if not Path("/proc/self/ksm_stat").exists():
        return
    st = ksm_stat(os.getpid())
    mu = mem_usage(os.getpid())
    assert st is not None and mu is not None
    assert mu.rss > 0 and 0 < mu.pss <= mu.rss


def test_start_time_survives_odd_command_names(tmp_path: Path) -> None:
    """Field 22 of /proc/PID/stat, counted after the last ')' (names may hold spaces and parens)."""
    rest = " ".join(str(i) for i in range(3, 53))  # fields 3..52: field 22 holds "22"
    _proc(tmp_path, 7, stat=f"7 (a) b (c)) {rest}\n")
    assert start_time(7, tmp_path) == 22
    assert start_time(8, tmp_path) is None
    own = start_time(os.getpid())
    assert own is not None and own == start_time(os.getpid())
