"""The runtime's side of supervised page merging (:mod:`.seccomp`, issue 37 row 3).

A sandboxed worker of a runtime that hints pages (``dedup`` ``merge`` or ``on``) hands the listener of
its seccomp filter to the runtime with its ``Ready``. Each ``madvise(MADV_MERGEABLE)`` in it, or in
any process it started, then waits in the kernel until this supervisor answers: allowed only when
the caller is a thread of the worker process itself and ``decide`` says yes (the runtime registers
the hint with the node's merge controller, which refuses a sharing domain other than the one merging
now), refused with EPERM otherwise. One thread serves every worker; a worker's listener is dropped
when every process under its filter has exited.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable

from .seccomp import receive, respond

log = logging.getLogger("gfaas.runtime")

Decide = Callable[[int], bool]  # (bytes the call marks) -> allowed


def thread_group(tid: int) -> int | None:
    """The process a thread belongs to (``Tgid`` in ``/proc/TID/status``); None when it is gone."""
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class MergeSupervisor:
    """Answers the supervised ``madvise`` calls of every watched worker (see the module docstring)."""

    def __init__(self) -> None:
        self._ep = select.epoll()
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[int, Decide]] = {}  # listener fd -> (worker pid, decide)
        self._wake_r, self._wake_w = os.pipe()
        self._ep.register(self._wake_r, select.EPOLLIN)
        self._closing = False
        self.answered: list[tuple[int, int, bool]] = []  # (worker pid, calling tid, allowed), the last 256
        self._thread = threading.Thread(target=self._run, name="gfaas-merge-supervisor", daemon=True)
        self._thread.start()

    def watch(self, listener: int, pid: int, decide: Decide) -> None:
        """Answer ``listener``'s calls for worker ``pid`` with ``decide``; the supervisor owns the fd."""
        with self._lock:
            if self._closing:
                os.close(listener)
                return
            self._watched[listener] = (pid, decide)
            self._ep.register(listener, select.EPOLLIN)

    def watching(self, pid: int) -> bool:
        with self._lock:
            return any(p == pid for p, _ in self._watched.values())

    def close(self) -> None:
        with self._lock:
            self._closing = True
        os.write(self._wake_w, b"x")
        self._thread.join(5)
        with self._lock:
            for fd in list(self._watched):
                self._drop(fd)
        self._ep.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _drop(self, fd: int) -> None:
        self._watched.pop(fd, None)
        try:
            self._ep.unregister(fd)
        except OSError:
            pass
        os.close(fd)  # calls still waiting on it fail (ENOSYS): refused, never let through

    def _run(self) -> None:
        while True:
            for fd, events in self._ep.poll():
                if fd == self._wake_r:
                    return
                with self._lock:
                    entry = self._watched.get(fd)
                if entry is None:
                    continue
                if events & select.EPOLLIN:
                    self._answer(fd, *entry)
                elif events & (select.EPOLLHUP | select.EPOLLERR):  # every process under it exited
                    with self._lock:
                        self._drop(fd)

    def _answer(self, fd: int, pid: int, decide: Decide) -> None:
        try:
            n = receive(fd)
        except OSError:  # the caller went away before we read it
            return
        allow = False
        try:
            # Only the worker's own threads: a process it started is not the registered worker.
            allow = thread_group(n.tid) == pid and bool(decide(int(n.args[1])))
        except Exception:  # noqa: BLE001 - a failing decision refuses the call, it must not stop the thread
            log.exception("page merging: deciding worker %d's madvise failed; refused", pid)
        try:
            respond(fd, n, allow)
        except OSError as exc:
            log.warning("page merging: answering worker %d's madvise failed: %s", pid, exc)
        self.answered.append((pid, n.tid, allow))
        del self.answered[:-256]
        if not allow:
            log.info("page merging: refused madvise(MADV_MERGEABLE) of thread %d (worker %d)", n.tid, pid)
