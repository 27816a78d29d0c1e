"""Admission and waiting without a thread per request (issue 23, item 2).

* :class:`Admissions`: one :class:`~gfaas.policy.admission.AdaptiveLimit` per deployed workflow. The
  invoke endpoint asks it on the event loop before anything else; a refusal is a 429 with
  ``Retry-After`` made there and then, without calling the runtime or taking a thread.
* :func:`watch`: when the runtime offers ``add_done_callback`` (``LocalRuntime`` does), an admitted
  invocation is watched by a callback that the finishing thread runs: it hands the result to the
  event loop (``call_soon_threadsafe``), which frees the admission place, counts the metrics and
  completes an asyncio future, so each completion wakes exactly its own waiter and no thread waits.
  A runtime without it falls back to the waiting pool (``_Gateway.wait``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from ...policy.admission import AdaptiveLimit, Admission
from ..result import InvocationResult

__all__ = ["Admissions", "watch"]

MAX_TRACKED = 4096  # workflows whose limits are kept (idle ones are dropped past this)


class Admissions:
    """The per-workflow limits (their state is touched from the event loop and, rarely, other
    threads: a lock keeps it consistent)."""

    def __init__(self, known: Callable[[], list[str]], **limit_args: Any) -> None:
        self._known = known  # the runtime's deployed workflows (asked once per new name)
        self._limits: dict[str, AdaptiveLimit] = {}
        self._lock = threading.Lock()
        self._args = limit_args

    def limit(self, workflow: str) -> AdaptiveLimit | None:
        """The workflow's limit; None for a name the runtime does not know (its submit answers 404)."""
        with self._lock:
            lim = self._limits.get(workflow)
        if lim is not None:
            return lim
        if workflow not in self._known():
            return None
        with self._lock:
            if len(self._limits) >= MAX_TRACKED:
                for name in [n for n, x in self._limits.items() if x.in_flight == 0][: MAX_TRACKED // 4]:
                    del self._limits[name]
            return self._limits.setdefault(workflow, AdaptiveLimit(**self._args))

    def admit(self, workflow: str, timeout_s: float | None) -> tuple[Admission, AdaptiveLimit | None]:
        lim = self.limit(workflow)
        if lim is None:
            return Admission(True), None
        with self._lock:
            return lim.admit(time.monotonic(), timeout_s), lim

    def finished(self, lim: AdaptiveLimit | None, latency_s: float | None) -> None:
        if lim is not None:
            with self._lock:
                lim.finished(time.monotonic(), latency_s)

    def describe(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {w: {"limit": round(x.limit, 1), "in_flight": x.in_flight, "admitted": x.admitted,
                        "refused": x.refused} for w, x in self._limits.items()}


def watch(runtime: Any, invocation_id: str, on_loop: Callable[[InvocationResult], None]) -> asyncio.Future[Any] | None:
    """A future of the invocation's result, completed from the runtime's done-callback on the current
    loop after ``on_loop(result)`` ran there; None when the runtime cannot call back."""
    add = getattr(runtime, "add_done_callback", None)
    if add is None:
        return None
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def on_done(res: InvocationResult) -> None:  # on the loop
        try:
            on_loop(res)
        finally:
            if not fut.done():
                fut.set_result(res)

    def callback(res: InvocationResult) -> None:  # on the runtime's thread
        try:
            loop.call_soon_threadsafe(on_done, res)
        except RuntimeError:  # the loop closed (server shutdown): nobody waits any more
            pass

    add(invocation_id, callback)
    return fut
