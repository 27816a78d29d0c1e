"""Queue hints from the runtime to the node daemons, sent as queues change.

Queue-aware eviction (``gfaas.policy.storage.plan_eviction``) needs to know how far back each
object's consumers wait. The runtime knows; the daemon does not. Queues change on every submit and
dispatch, and a hint is one round trip to every node, so hints are coalesced: a change pokes the
hinter, which sends at most once per ``interval_s`` and only the invocations whose hint differs
from the one last sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..errors import GfaasError

log = logging.getLogger("gfaas.runtime")

#: (invocation id, function -> requests ahead of it, functions that will not run again)
Hint = tuple[str, dict[str, int], list[str]]


class QueueHinter:
    """A thread that sends :func:`collect`'s hints through ``send`` after :meth:`poke`."""

    def __init__(self, collect: Callable[[], list[Hint]], send: Callable[[Hint], None],
                 interval_s: float) -> None:
        self._collect, self._send, self._interval = collect, send, interval_s
        self._wake = threading.Event()
        self._stop = False
        self._last: dict[str, tuple[dict[str, int], list[str]]] = {}
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="gfaas-queue-hints", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """A queue changed: send fresh hints soon."""
        self._wake.set()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(5)

    def flush(self) -> int:
        """Send what changed now (the thread's work, also callable directly); returns hints sent."""
        hints = self._collect()
        live = {h[0] for h in hints}
        for gone in [k for k in self._last if k not in live]:
            del self._last[gone]
        n = 0
        for inv_id, positions, done in hints:
            if self._last.get(inv_id) == (positions, done):
                continue
            try:
                self._send((inv_id, positions, done))
            except GfaasError as exc:  # e.g. the invocation ended meanwhile: nothing to steer
                log.debug("queue hint for %s not sent: %s", inv_id, exc)
                continue
            self._last[inv_id] = (positions, done)
            n += 1
        self.sent += n
        return n

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
            # Coalesce: changes during this pause go out together in the next flush.
            time.sleep(self._interval)
