"""Page merging in the workflow runtime: ``RuntimeConfig(dedup=...)`` (docs/dedup.md).

``shared``: each worker maps its model's weights from the sharing domain's content-addressed store
(:func:`gfaas.dedup.shared.load_shared`), so warm workers of the same model hold one copy. ``merge``:
the memory a model load added is marked mergeable and the node's merge controller merges it with the
other workers' identical pages by a KSM burst. ``on``: both. Handlers may hint more with ``ctx.merge``.

The sharing domain of a workflow is ``dedup_domain`` if set (every workflow of the runtime shares it:
one owner's workflows), else the workflow's own name, so two tenants never share a page. The runtime,
not the function, names the domain when it relays a worker's hint to the node daemon.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from ..errors import ConfigError, GfaasError
from .scratch import Scratch

log = logging.getLogger("gfaas.runtime")

DEDUP_MODES = ("off", "shared", "merge", "on")


def check_mode(mode: object) -> str:
    if mode not in DEDUP_MODES:
        raise ConfigError(f"dedup={mode!r} is not one of {list(DEDUP_MODES)}: 'shared' maps model weights from "
                          "one copy per sharing domain, 'merge' hints the model's memory to KSM, 'on' does both")
    return str(mode)


@dataclass(frozen=True)
class WorkerMemory:
    """One live worker's memory, as the node sees it (``/proc/PID/smaps_rollup``, ``ksm_stat``)."""

    workflow: str
    function: str
    pid: int
    rss_bytes: int
    pss_bytes: int
    merged_bytes: int  # pages KSM merged in this process


class InitFields(TypedDict, total=False):
    """The worker ``Init`` fields of page merging (:meth:`RuntimeDedup.init_fields`)."""

    dedup: str
    dedup_domain: str
    shared_dir: str


class RuntimeDedup:
    """The runtime's side: the shared store's directory, the domain rule, hint relaying."""

    def __init__(self, mode: str, domain: str = "") -> None:
        self.mode = check_mode(mode)
        if domain:
            from ..dedup.shared import check_domain

            check_domain(domain)
        self.domain = domain
        self._lock = threading.Lock()
        self._pids: dict[int, tuple[str, str]] = {}  # worker pid -> (workflow, function)
        self.refused: list[str] = []  # hints the node refused (another domain holds KSM), newest last
        self.store_dir: Path | None = None
        self._scratch: Scratch | None = None
        self._supervisor: Any = None  # MergeSupervisor, once a worker hands its seccomp listener over
        if self.mode in ("shared", "on"):
            # In RAM beside the pool, removed with the runtime (or, if it is killed, by the next one
            # that makes a store: runtime.scratch): the weights of its workers only.
            base = "/dev/shm" if os.path.isdir("/dev/shm") else None
            self._scratch = Scratch("gfaas-shared-", base)
            self.store_dir = self._scratch.path

    def domain_of(self, workflow: str) -> str:
        return self.domain or workflow

    def init_fields(self, workflow: str) -> InitFields:
        """The ``Init`` fields a worker of ``workflow`` needs."""
        if self.mode == "off":
            return {}
        return {"dedup": self.mode, "dedup_domain": self.domain_of(workflow),
                "shared_dir": str(self.store_dir) if self.store_dir else ""}

    def started(self, worker: Any, workflow: str, function: str, admin: Any, lock: Any = None) -> None:
        """A worker is ready: relay its model load's hint; a sandboxed worker's later hints are
        supervised (runtime.merge_supervisor): each ``madvise`` waits until the node admitted it.
        ``lock``: what guards ``admin`` (the supervisor's thread takes it for each decision)."""
        with self._lock:
            self._pids[int(worker.pid)] = (workflow, function)
        self.hinted(worker, workflow, function, admin, int(getattr(worker, "hinted_bytes", 0)))
        listener = getattr(worker, "merge_listener", None)
        if listener is None or admin is None:
            return
        worker.merge_listener = None  # the supervisor owns it now
        with self._lock:
            if self._supervisor is None:
                from .merge_supervisor import MergeSupervisor

                self._supervisor = MergeSupervisor()
            sup = self._supervisor

        def decide(nbytes: int) -> bool:
            with lock if lock is not None else contextlib.nullcontext():
                return self._relay(worker, workflow, function, admin, nbytes)

        sup.watch(listener, int(worker.pid), decide)

    def hinted(self, worker: Any, workflow: str, function: str, admin: Any, nbytes: int) -> None:
        """Relay a worker's hint (its model load, or ``ctx.merge`` during a call) to its node; a
        supervised worker's ``ctx.merge`` was registered call by call already."""
        if nbytes <= 0 or admin is None:
            return
        sup = self._supervisor
        if sup is not None and sup.watching(int(worker.pid)):
            return
        self._relay(worker, workflow, function, admin, nbytes)

    def _relay(self, worker: Any, workflow: str, function: str, admin: Any, nbytes: int) -> bool:
        if nbytes <= 0 or admin is None:
            return False
        try:
            admin.dedup_hint(int(worker.pid), workflow, function, self.domain_of(workflow), nbytes)
            return True
        except GfaasError as exc:  # a refused hint costs memory, never the invocation
            log.warning("page merging: the node refused %s/%s's hint of %d bytes: %s", workflow, function, nbytes, exc)
            with self._lock:
                self.refused.append(str(exc))
            # Left mergeable, its pages would be merged by the active domain's next burst (and they
            # would stop it, as foreign mergeable memory): the worker takes its hints back.
            unmerge = getattr(worker, "unmerge", None)
            if unmerge is not None and not (self._supervisor is not None and self._supervisor.watching(int(worker.pid))):
                unmerge()  # (a supervised worker's refused madvise marked nothing: nothing to take back)
            return False

    def memory(self) -> list[WorkerMemory]:
        """What each live worker uses now (root or the workers' own uid can read it)."""
        from ..dedup.procstat import ksm_stat, mem_usage

        with self._lock:
            pids = dict(self._pids)
        out = []
        for pid, (wf, fn) in sorted(pids.items()):
            mem, ks = mem_usage(pid), ksm_stat(pid)
            if mem is None:
                with self._lock:
                    self._pids.pop(pid, None)
                continue
            out.append(WorkerMemory(wf, fn, pid, mem.rss, mem.pss, (ks.merging_pages if ks else 0) * os.sysconf(
                "SC_PAGE_SIZE")))
        return out

    def shared_report(self) -> dict[str, Any]:
        """Bytes the shared store saves now: each file mapped by ``n`` live workers saves ``(n - 1)``
        copies of it (read from the workers' ``/proc/PID/maps``)."""
        if self.store_dir is None:
            return {"files": 0, "bytes": 0, "saved_bytes": 0, "mappings": 0}
        with self._lock:
            pids = list(self._pids)
        mappers: dict[str, set[int]] = {}
        root = str(self.store_dir)
        for pid in pids:
            for path in _mapped_paths(pid):
                if path.startswith(root + "/"):
                    mappers.setdefault(path, set()).add(pid)
        sizes = {}
        for p in mappers:
            try:
                sizes[p] = os.stat(p).st_size
            except OSError:
                sizes[p] = 0
        total = sum(f.stat().st_size for f in self.store_dir.rglob("*") if f.is_file())
        return {"files": sum(1 for f in self.store_dir.rglob("*") if f.is_file()), "bytes": total,
                "mappings": sum(len(v) for v in mappers.values()),
                "saved_bytes": sum(sizes[p] * (len(v) - 1) for p, v in mappers.items())}

    def close(self) -> None:
        if self._supervisor is not None:
            self._supervisor.close()
        if self._scratch is not None:
            self._scratch.remove()  # mapped pages live on until their workers exit


def _mapped_paths(pid: int) -> set[str]:
    """The files ``pid`` maps (its ``/proc/PID/maps``); empty once it is gone."""
    from ..dedup.regions import read_maps

    try:
        return {e.path for e in read_maps(pid) if e.path.startswith("/")}
    except OSError:
        return set()
