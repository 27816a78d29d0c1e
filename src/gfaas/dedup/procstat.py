"""Per-process KSM progress and memory use from ``/proc`` (a fake tree in tests)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KsmStat:
    """``/proc/PID/ksm_stat``: pages of this process mapped to KSM pages, its reverse-map items,
    profit in bytes (saved minus KSM's metadata), whether any of its memory is mergeable, and whether
    the whole process was made mergeable (``prctl(PR_SET_MEMORY_MERGE)``)."""

    merging_pages: int
    rmap_items: int
    process_profit: int
    mergeable: bool
    merge_any: bool


@dataclass(frozen=True)
class MemUsage:
    """``/proc/PID/smaps_rollup`` in bytes: resident, proportional (shared pages split among sharers),
    private and shared resident memory."""

    rss: int
    pss: int
    private: int
    shared: int


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None


def ksm_stat(pid: int, proc_root: Path = Path("/proc")) -> KsmStat | None:
    """The KSM state of ``pid``; None when the process is gone."""
    text = _read(proc_root / str(pid) / "ksm_stat")
    if text is None:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2:
            fields[parts[0]] = parts[1]

    def num(key: str) -> int:
        try:
            return int(fields.get(key, "0"))
        except ValueError:
            return 0

    return KsmStat(
        merging_pages=num("ksm_merging_pages"),
        rmap_items=num("ksm_rmap_items"),
        process_profit=num("ksm_process_profit"),
        mergeable=fields.get("ksm_mergeable") == "yes",
        merge_any=fields.get("ksm_merge_any") == "yes",
    )


def mem_usage(pid: int, proc_root: Path = Path("/proc")) -> MemUsage | None:
    """Memory use of ``pid`` (bytes); None when the process is gone."""
    text = _read(proc_root / str(pid) / "smaps_rollup")
    if text is None:
        return None
    kb: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            kb[parts[0][:-1]] = int(parts[1])
    return MemUsage(
        rss=kb.get("Rss", 0) * 1024,
        pss=kb.get("Pss", 0) * 1024,
        private=(kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) * 1024,
        shared=(kb.get("Shared_Clean", 0) + kb.get("Shared_Dirty", 0)) * 1024,
    )


def start_time(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """When ``pid`` started (clock ticks after boot, ``/proc/PID/stat`` field 22); None when gone or
    unreadable. A pid number can be reused by a later process; the pair (pid, start time) cannot."""
    text = _read(proc_root / str(pid) / "stat")
    if text is None or ")" not in text:
        return None
    fields = text[text.rindex(")") + 1 :].split()  # the command name may hold spaces and ')'
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def mergeable_pids(proc_root: Path = Path("/proc")) -> set[int]:
    """Processes with ``ksm_mergeable: yes`` (some of their memory is a KSM candidate)."""
    out: set[int] = set()
    try:
        entries = list(proc_root.iterdir())
    except FileNotFoundError:
        return out
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = ksm_stat(int(entry.name), proc_root)
        except PermissionError:
            continue
        if stat is not None and (stat.mergeable or stat.merge_any):
            out.add(int(entry.name))
    return out
