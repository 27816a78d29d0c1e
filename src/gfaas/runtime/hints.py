"""Queue hints from the runtime to the node daemons, sent as queues change.

Queue-aware eviction (``gfaas.policy.storage.plan_eviction``) needs to know how far back each
object's consumers wait. The runtime knows; the daemon does not. A queued function is described by
its *ticket*, its number in its FIFO queue, and each queue by its *head*, the requests that have
left it (``policy.storage.QueueBook``): the daemon computes a position as ticket - head. So a
dispatch changes one head rather than the position of every request behind it, and the work per
change is O(1): only the invocations and queues that changed are marked (:meth:`QueueHinter.changed`),
and at most once per ``interval_s`` the hinter sends what they are now, all of it in one
``QueueState`` message per node. (Sending every changed position, one round trip per invocation,
was O(waiters) per dispatch: 7.2 round trips per invocation at 256 in flight, docs/performance.md.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from ..errors import GfaasError

log = logging.getLogger("gfaas.runtime")

#: One invocation's hint: (invocation id, function -> (queue, ticket) while queued, functions
#: running (position 0), functions that will not run again).
Entry = tuple[str, dict[str, tuple[str, int]], list[str], list[str]]
#: What one round sends: the entries of the invocations that changed, and queue -> head.
Batch = tuple[list[Entry], dict[str, int]]


class QueueHinter:
    """A thread that sends ``collect(invocations, queues)``'s batch through ``send`` after
    :meth:`changed` marks them (``thread=False``: none; the owner calls :meth:`flush`)."""

    def __init__(self, collect: Callable[[set[str], set[str]], Batch], send: Callable[[Batch], None],
                 interval_s: float, thread: bool = True) -> None:
        self._collect, self._send, self._interval = collect, send, interval_s
        self._wake = threading.Event()
        self._stop = False
        self._mu = threading.Lock()  # the marks
        self._flushing = threading.Lock()  # one round at a time: a later state is never overtaken
        self._invs: set[str] = set()
        self._queues: set[str] = set()
        self.sent = 0  # entries sent
        self.rounds = 0  # batches sent
        self._thread: threading.Thread | None = None
        if thread:
            self._thread = threading.Thread(target=self._run, name="gfaas-queue-hints", daemon=True)
            self._thread.start()

    def changed(self, invocation: str | None = None, queue: str | None = None) -> None:
        """An invocation's functions moved (queued, dispatched, finished), or a request entered or
        left ``queue``: send what they are now, soon."""
        with self._mu:
            if invocation is not None:
                self._invs.add(invocation)
            if queue is not None:
                self._queues.add(queue)
        self._wake.set()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def flush(self, invocations: Iterable[str] = ()) -> list[str]:
        """Send what is marked (and ``invocations``) now: the thread's work, also callable directly.
        Returns the invocations hinted. A batch that could not be sent stays marked."""
        with self._flushing:
            with self._mu:
                invs, queues = self._invs, self._queues
                self._invs, self._queues = set(), set()
            invs.update(invocations)
            if not invs and not queues:
                return []
            entries, heads = self._collect(invs, queues)
            if not entries and not heads:
                return []
            try:
                self._send((entries, heads))
            except Exception as exc:
                with self._mu:  # tried again with the next round
                    self._invs |= invs
                    self._queues |= queues
                if not isinstance(exc, GfaasError):
                    raise
                log.debug("queue hints not sent: %s", exc)
                return []
            self.sent += len(entries)
            self.rounds += 1
            return [e[0] for e in entries]

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if self._stop:
                return
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - a failed hint must never stop the runtime
                log.exception("sending queue hints failed")
            if self._stop:
                return
            # Coalesce: changes during this pause go out together in the next round.
            time.sleep(self._interval)
