"""The node daemon's side of page merging: one :class:`~gfaas.dedup.controller.MergeController` per
machine.

KSM's settings are global to the machine, but a machine may run several node daemons (``gfaas cluster
start`` runs N on loopback). Were each to burst and restore on its own, the second would save the
first one's burst setting as "previous" and restore that. So the daemon that takes an exclusive
``flock`` on ``<lock_dir>/ksm.lock`` owns KSM: its controller saves the settings it found in
``<lock_dir>/ksm.saved`` before it changes anything, and the next owner restores them if this one
died mid-burst. Other daemons on the machine record hints and report them, but never touch KSM (their
report says which process owns it). The lock is released by the kernel when the owner dies, so a
killed daemon never blocks the next one.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..secfiles import private_dir
from .controller import MergeController
from .ksm import KsmSysfs

log = logging.getLogger("gfaas.dedup")

DEFAULT_LOCK_DIR = "/run/gfaas-ksm"
_MAX_PROCESSES = 150  # a report is one 64 KiB frame: the largest savers first, the rest counted
_MAX_EVENTS = 40


class NodeDedup:
    """Owns (or not) the machine's KSM controller for one node daemon."""

    def __init__(self, state_dir: str, lock_dir: str = DEFAULT_LOCK_DIR, ksm: KsmSysfs | None = None,
                 proc_root: Path = Path("/proc")) -> None:
        self._lock_fd = -1
        self.owner_note = ""
        ksm = ksm or KsmSysfs()
        state_path = Path(state_dir) / "ksm.saved"  # a non-owner never restores from here: it never writes it
        if ksm.writable():
            try:
                private_dir(lock_dir, "KSM lock directory")
                fd = os.open(os.path.join(lock_dir, "ksm.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
                             | os.O_NOFOLLOW, 0o600)
            except (OSError, ConfigError) as exc:
                self.owner_note = f"cannot open the KSM lock in {lock_dir}: {exc}"
            else:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                        raise
                    os.close(fd)
                    self.owner_note = f"KSM is controlled by another node daemon on this machine ({_holder(lock_dir)})"
                else:
                    os.ftruncate(fd, 0)
                    os.write(fd, str(os.getpid()).encode())
                    self._lock_fd = fd
                    state_path = Path(lock_dir) / "ksm.saved"
        # Not root: KSM is read-only anyway and its own reason says so. Root without the lock: read-only here.
        view = ksm if self.owns_ksm or not ksm.writable() else _ReadOnlyKsm(ksm.root, self.owner_note)
        self.controller = MergeController(state_path, ksm=view, proc_root=proc_root)

    @property
    def owns_ksm(self) -> bool:
        return self._lock_fd >= 0

    def start(self) -> None:
        self.controller.start()
        if self.owner_note:
            log.info("page merging: %s; hints are recorded but this daemon does not run KSM", self.owner_note)

    def stop(self) -> None:
        try:
            self.controller.stop()
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = -1

    def hint(self, pid: int, workflow: str, function: str, domain: str, nbytes: int) -> None:
        self.controller.hint(pid, domain=domain, workflow=workflow, function=function, nbytes=nbytes)

    def forget(self, pid: int) -> None:
        self.controller.forget(pid)

    def report(self) -> bytes:
        """The controller's status as JSON, cut to fit one protocol frame."""
        st: dict[str, Any] = self.controller.status()
        st["owns_ksm"] = self.owns_ksm
        if self.owner_note:
            st["note"] = self.owner_note
        procs = st.get("processes", [])
        merged: dict[str, int] = {}
        for p in procs:
            key = f"{p['workflow']}/{p['function']}"
            merged[key] = merged.get(key, 0) + int(p.get("merged_bytes") or 0)
        st["merged_by_function"] = merged
        st["events"] = st.get("events", [])[-_MAX_EVENTS:]
        if len(procs) > _MAX_PROCESSES:
            procs = sorted(procs, key=lambda p: -int(p.get("merged_bytes", 0)))
            st["processes"], st["processes_not_shown"] = procs[:_MAX_PROCESSES], len(procs) - _MAX_PROCESSES
        return json.dumps(st, separators=(",", ":")).encode()


class _ReadOnlyKsm(KsmSysfs):
    """KSM as a daemon that does not own it sees it: counters, never a write."""

    def __init__(self, root: Path, why: str) -> None:
        super().__init__(root)
        self._why = why or "this node daemon does not own KSM on this machine"

    def writable(self) -> bool:
        return False

    def why_not_controllable(self) -> str | None:
        return self._why if self.available() else super().why_not_controllable()

    def write_settings(self, s: Any) -> None:  # pragma: no cover - the controller checks writable() first
        raise PermissionError("this node daemon does not own KSM on this machine")


def _holder(lock_dir: str) -> str:
    try:
        return "pid " + Path(lock_dir, "ksm.lock").read_text().strip()
    except OSError:
        return "pid unknown"
