"""The HTTP protocol the gateway's uvicorn server speaks: h11 with a header deadline and a cap on
connections, which uvicorn itself does not have.

uvicorn times out idle kept-alive connections, but a connection whose request headers trickle in a
byte at a time stays open for ever; a thousand of them made the gateway unresponsive (issue 14, row
12). Here the headers of each request must be complete within ``header_timeout_s`` of the connection
(or of the request's first byte on a kept-alive connection), or the connection is closed; and a
connection beyond ``max_connections`` open ones is closed as soon as it is accepted, so the slots for
requests in progress (the guard's ``max_requests``) are never taken by connections that send nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from .ratelog import RateLimitedLog

log = RateLimitedLog(logging.getLogger("gfaas.gateway"), burst=5, per_s=0.2)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a connection cap (set by :func:`bounded`)."""

    header_timeout_s = 10.0
    max_connections = 2048

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            log.warning("refusing a connection from %s: %d are open (max_connections=%d)", self.client,
                        len(self.connections) - 1, self.max_connections)
            transport.close()
            return
        self._arm()

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:
        if not self._in_request():
            self._arm()  # the first bytes of a request: its headers are due in header_timeout_s
        super().data_received(data)
        if self._in_request() or self.transport.is_closing():
            self._disarm()

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self._in_request() and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def bounded(header_timeout_s: float, max_connections: int) -> type[BoundedH11Protocol]:
    """A :class:`BoundedH11Protocol` with these bounds (uvicorn's ``http=`` takes a class)."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,),
                {"header_timeout_s": header_timeout_s, "max_connections": max_connections})
