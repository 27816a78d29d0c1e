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
import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

from ...policy.admission import AdaptiveLimit, Admission
from ..result import InvocationResult
from .errors import error_response

__all__ = ["Admissions", "invoke_wait", "overloaded", "wait_until", "watch"]

MAX_TRACKED = 4096  # workflows whose limits are kept (idle ones are dropped past this)


class _Gate:
    """One workflow's limit and the requests waiting for a place (futures, oldest first)."""

    def __init__(self, lim: AdaptiveLimit) -> None:
        self.lim = lim
        self.waiting: deque[asyncio.Future[bool]] = deque()


class Admissions:
    """The per-workflow limits and queues. The guard calls :meth:`enter` on the event loop for every
    invocation; the end of an admitted invocation (:meth:`finished`) admits the oldest waiter, and
    only it is woken."""

    def __init__(self, known: Callable[[], list[str]], **limit_args: Any) -> None:
        self._known = known  # the runtime's deployed workflows (asked once per new name)
        self._gates: dict[str, _Gate] = {}
        self._by_limit: dict[int, _Gate] = {}  # id(limit) -> its gate: a completion finds it in O(1)
        self._lock = threading.Lock()
        self._args = limit_args

    def _gate(self, workflow: str) -> _Gate | None:
        """The workflow's gate; None for a name the runtime does not know (its submit answers 404)."""
        with self._lock:
            gate = self._gates.get(workflow)
        if gate is not None:
            return gate
        if workflow not in self._known():
            return None
        with self._lock:
            if len(self._gates) >= MAX_TRACKED:
                idle = [n for n, g in self._gates.items() if g.lim.in_flight == 0 and not g.waiting]
                for name in idle[: MAX_TRACKED // 4]:
                    self._by_limit.pop(id(self._gates.pop(name).lim), None)
            gate = self._gates.get(workflow)
            if gate is None:
                gate = self._gates[workflow] = _Gate(AdaptiveLimit(**self._args))
                self._by_limit[id(gate.lim)] = gate
            return gate

    async def enter(self, workflow: str, timeout_s: float | None,
                    max_wait_s: float) -> tuple[Admission, AdaptiveLimit | None]:
        """Admit now, or wait (without a thread) for a place for at most ``timeout_s`` (or
        ``max_wait_s``), or refuse. A refused or timed-out request is never submitted."""
        gate = self._gate(workflow)
        if gate is None:
            return Admission(True), None
        loop = asyncio.get_running_loop()
        with self._lock:
            decision = gate.lim.admit(time.monotonic(), timeout_s, len(gate.waiting))
            if not decision.wait:
                return decision, gate.lim
            fut: asyncio.Future[bool] = loop.create_future()
            gate.waiting.append(fut)
        budget = max_wait_s if timeout_s is None else min(timeout_s, max_wait_s)
        # The waiter's future is its answer: True from _admit_waiter (a place), False from the timer.
        # Both run on this loop, so whichever comes first decides (a place given to an expired waiter
        # goes back, _admit_waiter). One future and one timer per waiter: wait_for over a shield made
        # a task's worth of futures and callbacks for each of the thousand that may wait.
        timer = loop.call_later(budget, _expire, fut)
        admitted = False
        try:
            admitted = await fut
        finally:
            timer.cancel()
            if not admitted:  # timed out, or cancelled (the client left)
                if fut.done() and not fut.cancelled() and fut.result():
                    self.finished(gate.lim, None)  # a place came just as its client left: it goes back
                else:  # out of the queue (an admitted waiter has left it already: finished pops it)
                    with self._lock, contextlib.suppress(ValueError):
                        gate.waiting.remove(fut)
        if admitted:
            return Admission(True), gate.lim
        return Admission(False, 1.0, f"no place came free within {budget:g} s"), None

    def refused_now(self, workflow: str, timeout_s: float | None, *, count: bool = True) -> Admission | None:
        """The refusal :meth:`enter` would answer now (counted, unless ``count`` is False), or None: it
        would admit the request or let it wait, and takes no place here (the server's protocol asks
        this before it builds a request, and hands the rest to :meth:`enter`)."""
        gate = self._gate(workflow)
        if gate is None:
            return None
        with self._lock:
            return gate.lim.refusal(time.monotonic(), timeout_s, len(gate.waiting), count=count)

    def count_refusal(self, workflow: str, decision: Admission) -> None:
        """Count a refusal :meth:`refused_now` answered uncounted (``count=False``) and that was made
        (with the return its ``Retry-After`` asks for: the limit counts those still away)."""
        gate = self._gate(workflow)
        if gate is not None:
            with self._lock:
                gate.lim.count_refusal(time.monotonic(), decision)

    def finished(self, lim: AdaptiveLimit | None, latency_s: float | None, service_s: float | None = None) -> None:
        """An admitted invocation ended: free its place and admit the oldest waiter if there is room."""
        if lim is None:
            return
        with self._lock:
            lim.finished(time.monotonic(), latency_s, service_s)
            gate = self._by_limit.get(id(lim))
            while gate is not None and gate.waiting:
                fut = gate.waiting[0]
                if fut.done():  # gave up waiting
                    gate.waiting.popleft()
                    continue
                if not lim.release():
                    break
                gate.waiting.popleft()
                loop = fut.get_loop()
                if _running_loop() is loop:  # on its loop (the usual case): no wake-up write
                    loop.call_soon(_admit_waiter, fut, lim, self)
                else:
                    loop.call_soon_threadsafe(_admit_waiter, fut, lim, self)

    def idle(self) -> bool:
        """Whether no admitted invocation is in flight and none waits (a quiet moment: gcpause)."""
        with self._lock:
            return all(g.lim.in_flight == 0 and not g.waiting for g in self._gates.values())

    def describe(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {w: {"limit": round(g.lim.limit, 1), "in_flight": g.lim.in_flight, "waiting": len(g.waiting),
                        "admitted": g.lim.admitted, "refused": g.lim.refused} for w, g in self._gates.items()}


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, or None (a runtime thread)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


async def wait_until(fut: asyncio.Future[Any], timeout_s: float) -> bool:
    """Wait for ``fut`` for at most ``timeout_s`` without ever cancelling it; whether it is done. (What
    ``wait_for(shield(fut), timeout_s)`` does, with one future and one timer instead of a task's worth.)"""
    if fut.done():
        return True
    loop = asyncio.get_running_loop()
    wake: asyncio.Future[None] = loop.create_future()

    def up(_: Any = None) -> None:
        if not wake.done():
            wake.set_result(None)

    fut.add_done_callback(up)
    timer = loop.call_later(timeout_s, up)
    try:
        await wake
    finally:
        timer.cancel()
        fut.remove_done_callback(up)
    return fut.done()


def _admit_waiter(fut: asyncio.Future[bool], lim: AdaptiveLimit, adm: Admissions) -> None:
    """On the waiter's loop: hand it the place, or give the place back if it left meanwhile."""
    if fut.done():
        adm.finished(lim, None)
    else:
        fut.set_result(True)


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

    loop_thread = threading.get_ident()

    def callback(res: InvocationResult) -> None:  # on the runtime's thread, or this loop's driving it
        try:
            if threading.get_ident() == loop_thread:  # no wake-up: the loop runs it after this round
                loop.call_soon(on_done, res)
            else:
                loop.call_soon_threadsafe(on_done, res)
        except RuntimeError:  # the loop closed (server shutdown): nobody waits any more
            pass

    add(invocation_id, callback)
    return fut


def invoke_wait(scope: Mapping[str, Any], default_s: float) -> float | None:
    """How long an invocation request says it waits: its ``timeout`` (the default without one, or
    with one that is not a number, which its endpoint answers 422), None for ``mode=async``.

    Asked for every invocation request and every refusal, and clients send the same few query
    strings again and again: the answers are kept by query string (a bounded table)."""
    key = (scope.get("query_string", b""), default_s)
    got = _WAITS.get(key, _UNSET)
    if got is not _UNSET:
        return got  # type: ignore[return-value]
    wait = _invoke_wait(key[0], default_s)
    if len(_WAITS) >= _WAITS_MAX:
        _WAITS.clear()
    _WAITS[key] = wait
    return wait


_WAITS: dict[tuple[bytes, float], float | None] = {}
_WAITS_MAX = 256
_UNSET = object()


def _invoke_wait(query: bytes, default_s: float) -> float | None:
    qs = parse_qs(query.decode("latin-1"))
    wait: float | None = default_s
    try:
        if "timeout" in qs:
            wait = float(qs["timeout"][-1])
    except ValueError:
        pass  # the endpoint answers 422 for it
    if qs.get("mode", ["sync"])[-1] == "async":
        wait = None
    return wait


def overloaded(gw: Any, name: str, decision: Admission) -> Any:
    """The 429 of a refused invocation of ``name`` (counted in the gateway's metrics)."""
    gw.tracker.rejected.inc(workflow=name, reason="admission")
    after = max(1, math.ceil(decision.retry_after_s))
    return error_response(429, "overloaded", f"workflow {name!r} takes no more invocations now: "
                          f"{decision.reason}; retry after {after} s", {"retry-after": str(after)},
                          retry_after_s=after)
