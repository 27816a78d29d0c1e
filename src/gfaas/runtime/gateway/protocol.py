"""The HTTP protocol the gateway's uvicorn server speaks: h11 with a header deadline and a cap on
connections, which uvicorn itself does not have.

uvicorn times out idle kept-alive connections, but a connection whose request headers trickle in a
byte at a time stays open for ever; a thousand of them made the gateway unresponsive (issue 14, row
12). Here the headers of each request must be complete within ``header_timeout_s`` of the connection
(or of the request's first byte on a kept-alive connection), or the connection is closed; and a
connection beyond ``max_connections`` open ones is closed as soon as it is accepted, so the slots for
requests in progress (the guard's ``max_requests``) are never taken by connections that send nothing.

Which connection goes at the cap matters (issue 37, row 6): closing the newest let 2,100 connections
that never authenticated keep every client with the token out. So at the cap the oldest connection
that is idle (no request in progress) and has never sent an authenticated request is closed to make
room; only when every connection is busy or proven is the new one refused.

An invocation its workflow's limit refuses is answered here too, with the httptools parser, as soon
as its headers are in (the guard's ``early_refusal`` decides and makes the answer): no task, no ASGI
call, no framework response per refusal, and its body is skipped as it arrives. Overloaded, most
requests are refusals, and answering them through the framework took event-loop time from the admitted
ones (docs/performance.md). Anything else, and every request with h11, goes through the guard.

A connection refused with ``Retry-After`` that sends its next request before that time is held here,
below the web framework (the guard marks it in ``held``, :mod:`.guard`): its transport stops reading and
the bytes already in wait with one timer until the time is up, then go through as usual. Holding the
request in the guard instead cost a coroutine, a task and their futures per early retry, which a
young collection walks (gcpause); 2,000 clients that retry at once kept about as many held.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from .ratelog import RateLimitedLog

log = RateLimitedLog(logging.getLogger("gfaas.gateway"), burst=5, per_s=0.2)


class _Bounds(asyncio.Protocol):
    """A header deadline and a connection cap over one of uvicorn's HTTP protocols (both keep
    ``cycle``, ``connections``, ``loop`` and ``transport``), set by :func:`bounded`."""

    header_timeout_s = 10.0
    max_connections = 2048
    proven: set[tuple[Any, ...]] = set()  # the clients that authenticated (the guard adds, bounded() sets)
    held: dict[Any, float] = {}  # refused clients -> monotonic time their next request may be read (the guard adds)
    max_header_bytes = 16 * 1024  # h11 enforces it itself; httptools does not, so it is counted here
    # Called after each chunk a connection reads (the runtime's poll_replies, set by bounded()): the
    # worker replies already in are handled then, not after every other ready connection of the round
    between: Callable[[], None] | None = None
    # what the protocol classes below provide (for the type checker)
    cycle: Any
    connections: Any
    loop: Any
    transport: Any
    client: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._opened = 0.0
        self._held: list[bytes] | None = None  # what arrived while held (reading is paused meanwhile)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = self.loop.time()
        if len(self.connections) > self.max_connections:
            victim = self._idle_unproven()
            if victim is None:
                log.warning("refusing a connection from %s: %d are open (max_connections=%d), all busy or "
                            "authenticated", self.client, len(self.connections) - 1, self.max_connections)
                transport.close()
                return
            log.warning("closing an idle connection from %s that never authenticated to take one from %s "
                        "(max_connections=%d)", victim.client, self.client, self.max_connections)
            victim.transport.close()
        self._arm()

    def _idle_unproven(self) -> _Bounds | None:
        """The oldest other connection with no request in progress that never authenticated."""
        best: _Bounds | None = None
        for c in self.connections:
            if c is self or not isinstance(c, _Bounds) or c._in_request() or c.transport is None \
                    or c.transport.is_closing() or (c.client and tuple(c.client) in self.proven):
                continue
            if best is None or c._opened < best._opened:
                best = c
        return best

    _parsing = False  # inside a request's body (httptools: from the end of its headers to its end)

    def _in_request(self) -> bool:
        # A request answered before its body was in (a refusal) is still being read: what comes
        # next is the rest of its body, not the headers of another request.
        return self._parsing or (self.cycle is not None and not self.cycle.response_complete)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:
        if self._held is not None:
            self._held.append(data)  # read before the pause took effect
            return
        if self.held and not self._in_request() and self.client:
            until = self.held.pop(tuple(self.client), None)
            wait = 0.0 if until is None else until - time.monotonic()
            if wait > 0:  # it came back before its Retry-After: read it when that is up
                self._held = [data]
                self.transport.pause_reading()
                self.loop.call_later(wait, self._release)
                return
        if not self._in_request():
            self._arm()  # the first bytes of a request: its headers are due in header_timeout_s
            self._header_bytes += len(data)
        super().data_received(data)
        if self._in_request() or self.transport.is_closing():
            self._disarm()
            self._header_bytes = 0
        elif self._header_bytes > self.max_header_bytes:
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n"
                                 b"content-length: 0\r\n\r\n")
            self.transport.close()
        if self.between is not None:
            self.between()

    def _release(self) -> None:
        data, self._held = b"".join(self._held or ()), None
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.resume_reading()
        self.data_received(data)

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self._in_request() and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.client:
            self.proven.discard(tuple(self.client))
        super().connection_lost(exc)


class BoundedH11Protocol(_Bounds, H11Protocol):
    """uvicorn's h11 protocol (pure Python) with the bounds."""


class _EarlyRefusal:
    """Answers what ``refuse(scope)`` returns a response for, in place of starting the request's ASGI
    task (uvicorn's httptools protocol calls ``_start_asgi_task`` once a request's headers are in,
    for a pipelined one once the one before it was answered)."""

    refuse: Callable[[dict[str, Any]], Any] | None = None  # Guard.early_refusal, set by bounded()
    _parsing: bool
    _header_bytes: int
    _disarm: Callable[[], None]
    # what uvicorn's httptools protocol provides
    cycle: Any
    loop: Any
    pipeline: Any
    timeout_keep_alive: float
    timeout_keep_alive_task: Any
    timeout_keep_alive_handler: Any
    transport: Any
    access_logger: Any
    access_log: bool
    client: Any

    def on_headers_complete(self) -> None:
        # The header block is in: its deadline and byte count end here, not when a response starts,
        # since a refusal made here ends the request inside the chunk that brought it.
        self._parsing = True
        self._header_bytes = 0
        self._disarm()
        super().on_headers_complete()  # type: ignore[misc]

    def on_message_complete(self) -> None:
        self._parsing = False
        super().on_message_complete()  # type: ignore[misc]
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and self.timeout_keep_alive_task is None \
                and not self.pipeline and not self.transport.is_closing():
            # Answered before its body was in (each chunk of which stopped the idle timer): the
            # connection is idle from here, so its keep-alive time starts now, as after any answer.
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                self.timeout_keep_alive_handler)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        try:
            answer = self.refuse(cycle.scope) if self.refuse is not None else None
        except Exception as exc:  # noqa: BLE001 - a bug here must not cost the request: the guard answers it
            log.error("the early refusal check failed; the guard answers the request", exc_info=exc)
            answer = None
        if answer is None:
            super()._start_asgi_task(cycle, app)  # type: ignore[misc]
            return
        head = [b"HTTP/1.1 %d %s\r\n" % (answer.status_code, _REASONS.get(answer.status_code, b""))]
        head += [b"%s: %s\r\n" % kv for kv in cycle.default_headers]
        head += [b"%s: %s\r\n" % kv for kv in answer.raw_headers]
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        self.transport.write(b"".join(head) + b"\r\n" + answer.body)
        # The request is answered: uvicorn's parser callbacks drop the rest of its body as it comes.
        cycle.response_started = cycle.response_complete = True
        if self.access_log:
            scope = cycle.scope
            self.access_logger.info('%s - "%s %s HTTP/%s" %d', "{}:{}".format(*self.client) if self.client else "-",
                                    scope["method"], scope["path"], scope.get("http_version", "1.1"),
                                    answer.status_code)
        if not cycle.keep_alive:
            self.transport.close()
            return
        self.on_response_complete()  # type: ignore[attr-defined]


_REASONS = {429: b"Too Many Requests"}


def _httptools() -> type | None:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed: h11 it is
        return None
    return type("BoundedHttpToolsProtocol", (_EarlyRefusal, _Bounds, HttpToolsProtocol),
                {"__doc__": "uvicorn's httptools protocol (a C parser) with the bounds and early refusals."})


def bounded(header_timeout_s: float, max_connections: int, proven: set[tuple[Any, ...]] | None = None,
            held: dict[Any, float] | None = None, refuse: Callable[[dict[str, Any]], Any] | None = None,
            between: Callable[[], None] | None = None) -> type:
    """A protocol class with these bounds (uvicorn's ``http=`` takes a class): httptools's C parser
    where it is installed (a request costs the event loop less, which is what keeps refusals cheap
    under overload, docs/performance.md), else h11. ``proven``: the set of authenticated clients the
    gateway's guard fills (the app's ``state.gateway.proven_clients``); ``held``: the refused clients
    whose next request waits (the app's ``state.gateway.held_clients``, which the guard fills);
    ``refuse``: what answers refusals before a request is built (the guard's ``early_refusal``; httptools only);
    ``between``: what runs after each chunk a connection reads (the runtime's ``poll_replies``)."""
    base = _httptools() or BoundedH11Protocol
    return type(base.__name__, (base,), {"header_timeout_s": header_timeout_s, "max_connections": max_connections,
                                         "proven": proven if proven is not None else set(),
                                         "held": held if held is not None else {},
                                         "refuse": staticmethod(refuse) if refuse is not None else None,
                                         "between": staticmethod(between) if between is not None else None})
