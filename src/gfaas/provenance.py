"""Where a result came from: the commit measured, whether the tree had changes, the machine.

Every file under ``benchmarks/results/`` carries a ``provenance`` block made here, so a reader (and
``tests/unit/test_results_provenance.py``) can tell which code a number describes and whether it
is stale. A result can only name the commit *before* the one that adds it, so "fresh" means: the
named commit is an ancestor of HEAD and nothing the result measures changed since.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: What a measurement runs: an uncommitted change here makes the tree "dirty" for it. Docs and
#: the result files a batch of runs is writing do not.
_MEASURED = ("src", "native", "benchmarks/*.py", "pyproject.toml", "Makefile")


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def source_root() -> Path:
    """The checkout this package was imported from (an editable install), or the package dir."""
    return Path(__file__).resolve().parent.parent.parent


def git_state(root: Path | None = None) -> dict[str, Any]:
    """``{"commit": full sha or None, "dirty": bool or None}`` of the source tree measured."""
    root = root or source_root()
    if root == source_root() and os.environ.get("GFAAS_SOURCE_COMMIT"):
        return _declared_state()
    sha = _git(["rev-parse", "HEAD"], root)
    if sha is None:
        return {"commit": None, "dirty": None}
    status = _git(["status", "--porcelain", "--untracked-files=no", "--", *_MEASURED], root)
    return {"commit": sha, "dirty": bool(status) if status is not None else None}


def _declared_state() -> dict[str, Any]:
    """The commit a copied tree declares (``GFAAS_SOURCE_COMMIT``, ``GFAAS_SOURCE_DIRTY``); it wins over git.

    A device machine receives the sender's working tree over a ``.git`` that may be older (on the
    lent GPU machines it is the session's starting commit, so git there names the wrong commit and
    calls the tree dirty). The sender, having checked that its tree is clean, names the commit; the
    block then says the commit was declared.
    """
    sha = os.environ.get("GFAAS_SOURCE_COMMIT", "")
    if len(sha) != 40 or any(c not in "0123456789abcdef" for c in sha):
        return {"commit": None, "dirty": None}
    dirty = {"0": False, "1": True}.get(os.environ.get("GFAAS_SOURCE_DIRTY", ""))
    return {"commit": sha, "dirty": dirty, "commit_declared": True}


def _first(path: str, key: str) -> str | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _steal_ticks() -> int | None:
    """CPU time the hypervisor gave other guests while this machine's CPUs wanted it (``/proc/stat``
    steal, all CPUs, clock ticks); None where there is no such line."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) if fields and fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError):
        return None


_STEAL_AT_START = _steal_ticks()  # when the command began (its CLI imports this module first)
_STARTED = time.monotonic()


def steal_s() -> float | None:
    """Seconds of CPU the machine lost to other guests (steal) since this process's command began:
    on a shared VM, what makes two runs of the same code differ by tens of percent."""
    now = _steal_ticks()
    if now is None or _STEAL_AT_START is None:
        return None
    return round((now - _STEAL_AT_START) / os.sysconf("SC_CLK_TCK"), 2)


def machine() -> dict[str, Any]:
    """The machine and software a measurement ran on, and the CPU it lost to other guests meanwhile
    (``steal_s``, over ``run_s`` seconds of the command)."""
    mem = _first("/proc/meminfo", "MemTotal")
    import numpy as np

    return {
        "cpu_model": _first("/proc/cpuinfo", "model name") or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "mem_bytes": int(mem.split()[0]) * 1024 if mem else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "steal_s": steal_s(),
        "run_s": round(time.monotonic() - _STARTED, 1),
    }


_SETTINGS: dict[str, Any] | None = None


def record_settings(settings: dict[str, Any] | None) -> None:
    """What this process's command runs with (its parsed flags, defaults filled in); every later
    :func:`provenance` block carries it. The CLI records them once it has parsed its arguments."""
    global _SETTINGS
    _SETTINGS = None if settings is None else dict(settings)


def provenance(command: list[str] | None = None, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The block every committed result file carries under the key ``provenance``: the commit and tree
    state, the machine, the command and the settings it ran with (``settings``, else those recorded by
    :func:`record_settings`), so ``tests/unit/test_results_settings.py`` can check that the command,
    parsed today, still means the same run."""
    block = {
        **git_state(),
        "machine": machine(),
        "command": " ".join(command if command is not None else sys.argv),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    chosen = settings if settings is not None else _SETTINGS
    if chosen is not None:
        block["settings"] = chosen
    kernel = sys.modules.get("gfaas.sim.kernel")  # a simulator ran here: its core, native or python
    if kernel is not None:
        block["sim_core"] = kernel.CORE
    return block
