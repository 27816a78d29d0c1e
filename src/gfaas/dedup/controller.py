"""The merge controller (node daemon, root): KSM bursts while hinted pages are pending.

On a hint (the hinting process already marked its pages ``MADV_MERGEABLE``) the controller saves
KSM's settings to a state file, switches KSM to the burst setting of :mod:`gfaas.policy.dedup`, watches
``/proc/PID/ksm_stat`` of the hinted processes until each one's merging leveled off (or
``max_burst_s`` passed), then restores the saved settings and removes the state file. A controller
that died mid-burst leaves the state file behind; the next :meth:`MergeController.start` restores
from it. So ksmd costs nothing while nobody hinted.

Sharing domains: KSM has one global tree, so merging is granted to one domain at a time per node
(:func:`gfaas.policy.dedup.admit`), and during a burst the controller audits ``/proc/*/ksm_stat``: a
process with mergeable memory that is not a registered process of the active domain stops the burst,
and KSM unmerges every page it merged (``run`` = 2) before its settings are restored, so what such a
process got merged is copied back before it can time writes to it for long. A burst ends (settled or
at ``max_burst_s``) only after an audit in that same step: a burst shorter than ``audit_s`` is audited
too (a 0.09 s burst once settled before its first audit, issue 37 row 3). Sandboxed workers cannot
mark memory mergeable at all unless their runtime hints pages (:mod:`gfaas.runtime.seccomp`).

Without root or without KSM the controller still records hints (status says why it cannot control
KSM); it never raises for that.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DedupRefused
from ..policy.dedup import admit, burst_settings, min_gain_for, settled
from .ksm import KsmSysfs
from .madvise import PAGE
from .procstat import KsmStat, ksm_stat, mem_usage, mergeable_pids, start_time

log = logging.getLogger("gfaas.dedup")

Event = tuple[Any, ...]


@dataclass
class _Proc:
    pid: int
    domain: str
    workflow: str
    function: str
    hinted_bytes: int
    hinted_at: float
    full_scans_at_hint: int
    started: int | None = None
    pending: bool = True
    samples: list[tuple[float, int]] = field(default_factory=list)
    last_gain_at: float | None = None
    merge_seconds: float | None = None


@dataclass
class _Burst:
    settings: dict[str, str]
    saved: dict[str, str]
    started_at: float
    last_audit_at: float


class MergeController:
    """KSM burst merging for hinted processes, with exact restore of KSM's settings.

    Args:
        state_path: file holding the saved settings while a burst runs (0600, written atomically).
        ksm: the sysfs accessor (a fake directory in tests).
        proc_root: ``/proc`` (a fake tree in tests).
        clock: monotonic seconds; every decision uses it (tests drive a fake one with :meth:`poll`).
        poll_s: how often the watcher thread samples.
        max_burst_s: the longest a burst may run.
        window_s: a process's merging has leveled off when it gained less than 0.5% of its hinted
            pages over this long (extra keyword).
        audit_s: how often a burst audits ``/proc/*/ksm_stat`` for foreign mergeable processes
            (extra keyword).
        max_events: length of the event log kept for :meth:`status` (extra keyword).
    """

    def __init__(
        self,
        state_path: Path,
        *,
        ksm: KsmSysfs | None = None,
        proc_root: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.02,
        max_burst_s: float = 30.0,
        window_s: float = 0.25,
        audit_s: float = 0.1,
        max_events: int = 256,
    ) -> None:
        if poll_s <= 0 or max_burst_s <= 0 or window_s <= 0 or audit_s < 0:
            raise ConfigError(
                f"MergeController needs poll_s, max_burst_s, window_s > 0 and audit_s >= 0; got "
                f"poll_s={poll_s}, max_burst_s={max_burst_s}, window_s={window_s}, audit_s={audit_s}"
            )
        self.state_path = Path(state_path)
        self.ksm = ksm if ksm is not None else KsmSysfs()
        self.proc_root = Path(proc_root)
        self.clock = clock
        self.poll_s = poll_s
        self.max_burst_s = max_burst_s
        self.window_s = window_s
        self.audit_s = audit_s
        self.events: deque[Event] = deque(maxlen=max_events)
        self._procs: dict[int, _Proc] = {}
        self._active_domain: str | None = None
        self._burst: _Burst | None = None
        self._last_burst: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._kick = threading.Event()  # a burst started (or stop): wakes the idle watcher
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, *, watch: bool = True) -> None:
        """Restore settings left by a crashed run (state file), then start the watcher thread
        (``watch=False``: no thread, the caller drives :meth:`poll`; extra keyword)."""
        with self._lock:
            self._recover()
        if watch and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="gfaas-ksm-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End any burst, restore settings, join the thread (idempotent)."""
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._burst is not None:
                self._end_burst("stopped")

    def _recover(self) -> None:
        if not self.state_path.exists():
            return
        try:
            saved = self._load_state()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            aside = self.state_path.with_name(self.state_path.name + ".corrupt")
            os.replace(self.state_path, aside)
            log.error("KSM state file %s is unreadable (%s): moved to %s; KSM settings not restored",
                      self.state_path, exc, aside)
            self._event("state_corrupt", str(aside))
            return
        if self.ksm.why_not_controllable() is not None:
            log.warning("KSM state file %s left by a crashed controller, but KSM cannot be controlled "
                        "here (%s): settings not restored", self.state_path, self.ksm.why_not_controllable())
            return
        self.ksm.write_settings(saved)
        self.state_path.unlink()
        self._event("recovered", dict(saved))
        log.warning("restored KSM settings %s left by a crashed controller (%s)", saved, self.state_path)

    def _load_state(self) -> dict[str, str]:
        data = json.loads(self.state_path.read_text())
        saved = data["settings"]
        if not isinstance(saved, dict) or not all(isinstance(v, str) for v in saved.values()):
            raise ValueError(f"'settings' must map names to strings, got {saved!r}")
        return dict(saved)

    def _save_state(self, saved: dict[str, str]) -> None:
        # Written (and fsynced) before KSM is touched, so a crash at any later point can be undone.
        self.state_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, json.dumps({"version": 1, "settings": saved, "pid": os.getpid()}).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.state_path)
        dfd = os.open(self.state_path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # -- hints -----------------------------------------------------------------------------------

    def hint(self, pid: int, *, domain: str, workflow: str, function: str, nbytes: int) -> None:
        """Register ``nbytes`` hinted by process ``pid`` of sharing ``domain`` and start a burst.

        :class:`DedupRefused` when another domain still has live hinted processes on this node."""
        if pid <= 0 or nbytes < 0:
            raise ConfigError(f"hint needs pid > 0 and nbytes >= 0, got pid={pid}, nbytes={nbytes}")
        with self._lock:
            self._prune()
            live: dict[str, int] = {}
            for p in self._procs.values():
                live[p.domain] = live.get(p.domain, 0) + 1
            reason = admit(domain, self._active_domain, live)
            if reason is not None:
                self._event("refused", pid, domain)
                raise DedupRefused(reason)
            switched = self._active_domain != domain
            self._active_domain = domain
            now = self.clock()
            scans = self.ksm.counters().full_scans if self.ksm.available() else 0
            old = self._procs.get(pid)
            self._procs[pid] = _Proc(
                pid=pid,
                domain=domain,
                workflow=workflow,
                function=function,
                hinted_bytes=(old.hinted_bytes if old and old.domain == domain else 0) + nbytes,
                hinted_at=now,
                full_scans_at_hint=scans,
                started=start_time(pid, self.proc_root),
            )
            self._event("hint", pid, domain)
            if self._burst is None and self.ksm.why_not_controllable() is None:
                self._begin_burst(now)
            elif self._burst is not None and switched:
                # The burst now serves another domain: the previous one's processes must not stay in it.
                self._burst.last_audit_at = now
                self._audit()

    def forget(self, pid: int) -> None:
        """A worker stopped: drop its registration."""
        with self._lock:
            if self._procs.pop(pid, None) is not None:
                self._event("forget", pid)
            if not self._procs:
                self._active_domain = None

    def _stat(self, p: _Proc) -> KsmStat | None:
        """The process's ksm_stat; None when it is gone, or when its pid now names a later process."""
        st = ksm_stat(p.pid, self.proc_root)
        if st is not None and p.started is not None and start_time(p.pid, self.proc_root) != p.started:
            return None
        return st

    def _prune(self) -> None:
        for pid in [pid for pid, p in self._procs.items() if self._stat(p) is None]:
            del self._procs[pid]
            self._event("gone", pid)
        if not self._procs:
            self._active_domain = None

    # -- bursts ----------------------------------------------------------------------------------

    def _foreign(self) -> list[int]:
        mine = {p.pid for p in self._procs.values() if p.domain == self._active_domain}
        return sorted(mergeable_pids(self.proc_root) - mine)

    def _audit(self) -> bool:
        """End the burst if a process outside the active domain has mergeable memory; False then."""
        foreign = self._foreign()
        if not foreign:
            return True
        self._event("audit", tuple(foreign))
        try:
            self.ksm.write_settings({"run": "2"})  # unmerge every merged page (and stop ksmd) first
            self._event("unmerged", tuple(foreign))
        except Exception:  # noqa: BLE001 - the restore below must still run; the audit is reported
            log.exception("KSM unmerge after a foreign mergeable process (%s) failed", foreign)
        self._end_burst("foreign_mergeable")
        return False

    def _begin_burst(self, now: float) -> None:
        foreign = self._foreign()
        if foreign:
            self._event("audit", tuple(foreign))
            # Usually workers that marked memory and whose hint is still on its way (the next hint
            # starts the burst); a process that never hints keeps showing up here and in the events.
            log.info("KSM burst not started yet: processes %s outside domain %r have mergeable memory",
                     foreign, self._active_domain)
            return
        pending_pages = sum(p.hinted_bytes for p in self._procs.values() if p.pending) // PAGE
        settings = burst_settings(pending_pages).as_sysfs()
        # A state file still here means an earlier restore failed: its settings are the real ones.
        saved = self._load_state() if self.state_path.exists() else self.ksm.read_settings()
        self._save_state(saved)
        self._event("burst_start", dict(settings))
        try:
            self.ksm.write_settings(settings)
        except Exception:
            self.ksm.write_settings(saved)
            self.state_path.unlink()
            self._event("restored", dict(saved))
            raise
        self._burst = _Burst(settings=settings, saved=saved, started_at=now, last_audit_at=now)
        self._kick.set()

    def _end_burst(self, reason: str) -> None:
        burst = self._burst
        assert burst is not None
        # A failed restore raises with the burst still recorded (the watcher retries) and the state
        # file still there (the next start() restores from it).
        self.ksm.write_settings(burst.saved)
        self.state_path.unlink(missing_ok=True)
        self._burst = None
        if reason != "foreign_mergeable":
            # After an audit stop the unsettled processes stay pending: the next hint's burst (once
            # the foreign process is registered or gone) watches them again.
            for p in self._procs.values():
                p.pending = False
        self._last_burst = {"reason": reason, "seconds": round(self.clock() - burst.started_at, 4)}
        self._event("burst_end", reason)
        self._event("restored", dict(burst.saved))
        self._idle.notify_all()

    def poll(self) -> None:
        """One watcher step: sample the pending processes, end the burst when all settled, when
        ``max_burst_s`` passed or when the audit finds a foreign mergeable process."""
        with self._lock:
            burst = self._burst
            if burst is None:
                return
            now = self.clock()
            if self.audit_s == 0 or now - burst.last_audit_at >= self.audit_s:
                burst.last_audit_at = now
                if not self._audit():
                    return
            full_scans = self.ksm.counters().full_scans
            for p in list(self._procs.values()):
                if not p.pending:
                    continue
                st = self._stat(p)
                if st is None:
                    p.pending = False
                    del self._procs[p.pid]
                    self._event("gone", p.pid)
                    continue
                if st.merging_pages > (p.samples[-1][1] if p.samples else 0):
                    p.last_gain_at = now
                p.samples.append((now, st.merging_pages))
                # Keep one sample at or before the window's start (the window's baseline).
                while len(p.samples) > 2 and p.samples[1][0] <= now - self.window_s:
                    p.samples.pop(0)
                if settled(
                    p.samples,
                    full_scans - p.full_scans_at_hint,
                    window_s=self.window_s,
                    min_gain=min_gain_for(p.hinted_bytes // PAGE),
                ):
                    p.pending = False
                    if p.last_gain_at is not None:
                        p.merge_seconds = round(p.last_gain_at - p.hinted_at, 4)
                    self._event("settled", p.pid)
            if not self._procs:
                self._active_domain = None
            ending = "settled" if not any(p.pending for p in self._procs.values()) else \
                "max_burst_s" if now - burst.started_at >= self.max_burst_s else None
            if ending is None:
                return
            if burst.last_audit_at != now:  # no burst ends before an audit covered all of it
                burst.last_audit_at = now
                if not self._audit():
                    return
            self._end_burst(ending)

    def _watch(self) -> None:
        while not self._stop.is_set():
            if self._burst is None:
                # Idle: no wake-ups at all until a hint starts a burst (zero cost while nobody hinted).
                self._kick.wait()
                self._kick.clear()
                continue
            if self._stop.wait(self.poll_s):
                break
            try:
                self.poll()
            except Exception:
                log.exception("KSM watcher step failed; ending the burst")
                with self._lock, contextlib.suppress(Exception):
                    if self._burst is not None:
                        self._end_burst("error")

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no burst runs; False if one still runs after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._burst is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(min(left, 0.05))
            return True

    # -- reporting -------------------------------------------------------------------------------

    def _event(self, *event: Any) -> None:
        self.events.append(tuple(event))
        log.debug("dedup event %s", event)

    def status(self) -> dict[str, Any]:
        """JSON-ready state: KSM settings and counters, the active domain, the burst, each hinted
        process (hinted, merged, PSS and RSS bytes, merge seconds from hint to the last gain before
        merging leveled off) and the bytes KSM saves node-wide (``pages_sharing`` pages)."""
        with self._lock:
            reason = self.ksm.why_not_controllable()
            available = self.ksm.available()
            counters = self.ksm.counters().as_dict() if available else {}
            procs = []
            for p in sorted(self._procs.values(), key=lambda p: p.pid):
                st = self._stat(p)
                try:
                    mu = mem_usage(p.pid, self.proc_root)
                except OSError:
                    mu = None
                procs.append(
                    {
                        "pid": p.pid,
                        "domain": p.domain,
                        "workflow": p.workflow,
                        "function": p.function,
                        "hinted_bytes": p.hinted_bytes,
                        "merged_bytes": st.merging_pages * PAGE if st else 0,
                        "profit_bytes": st.process_profit if st else 0,
                        "pss_bytes": mu.pss if mu else None,
                        "rss_bytes": mu.rss if mu else None,
                        "merge_seconds": p.merge_seconds,
                        "pending": p.pending,
                    }
                )
            burst = None
            if self._burst is not None:
                burst = {
                    "settings": dict(self._burst.settings),
                    "saved": dict(self._burst.saved),
                    "elapsed_s": round(self.clock() - self._burst.started_at, 4),
                    "pending_pids": sorted(p.pid for p in self._procs.values() if p.pending),
                }
            return {
                "ksm": {
                    "settings": self.ksm.read_settings() if available else {},
                    "counters": counters,
                    "controllable": reason is None,
                    "reason": reason,
                },
                "active_domain": self._active_domain,
                "burst": burst,
                "last_burst": self._last_burst,
                "processes": procs,
                "saved_bytes": counters.get("pages_sharing", 0) * PAGE,
                "events": [list(e) for e in self.events],
            }

