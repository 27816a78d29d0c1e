"""Threads kept for reuse by the daemon's deferred work (cross-node pulls).

A cross-node get runs on a thread of its own so that the daemon's loop keeps serving other clients
while the bytes arrive. Starting a new thread for each one was a measurable part of a small pull (a
probe of a 4 KiB pull between two daemons on loopback, p50: 1.09 ms with a thread per pull, 0.94-0.96 ms
with this class). Threads here are daemon threads, as before: a pull stuck on a silent peer never
holds up the process's exit, and none is capped, so a slow peer cannot queue others' pulls behind it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("gfaas.dataplane")

IDLE_S = 30.0  # an idle thread leaves after this long


class ReusedThreads:
    """Runs each submitted callable on an idle thread if one waits, else on a new one."""

    def __init__(self, name: str, idle_s: float = IDLE_S) -> None:
        self._name = name
        self._idle_s = idle_s
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job that no submit has claimed yet
        self.started = 0  # threads started so far (for tests and stats)

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            claimed = self._idle > 0
            if claimed:
                self._idle -= 1
            else:
                self.started += 1
        self._jobs.put(job)
        if not claimed:
            threading.Thread(target=self._run, name=self._name, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # unclaimed: leave (a claimed thread's job is on its way)
                        self._idle -= 1
                        return
                continue
            try:
                job()
            except Exception:  # the job's own failure: reported, and the thread stays (else its slot
                log.exception("deferred work failed")  # would be counted idle with no thread behind it)
            with self._lock:
                self._idle += 1
