"""What the guard does around a refusal (issue 37, rows 6 and 10): read and drop the body of a request
refused on its headers when the answer closes the connection, and remember the clients that
authenticated (the protocol keeps their connections at the cap, :mod:`.protocol`)."""

from __future__ import annotations

from typing import Any

import anyio
from starlette.types import Receive, Scope

__all__ = ["LINGER_BYTES", "LINGER_S", "drain_body", "proven_clients"]

# A refusal that closes the connection (413) first reads and drops the request's body, up to this
# much and this long, so a client still sending gets the answer rather than a reset (a socket closed
# with unread bytes is reset). On a kept-alive connection the server reads the rest itself. A client
# that sent ``Expect: 100-continue`` sends no body before the answer.
LINGER_BYTES = 64 << 20
LINGER_S = 5.0


def proven_clients(scope: Scope) -> set[tuple[Any, ...]] | None:
    """The gateway's set of authenticated clients (None for an app without the gateway's state)."""
    gw = getattr(getattr(scope.get("app"), "state", None), "gateway", None)
    return getattr(gw, "proven_clients", None)


async def drain_body(scope: Scope, receive: Receive, max_bytes: int, max_s: float) -> None:
    """Read and drop the request's body (see :data:`LINGER_BYTES`): nothing when it has none or the
    client waits for ``100 Continue``; stops past ``max_bytes`` or ``max_s`` (the answer then may
    still meet a reset, as it would anywhere)."""
    headers = dict(scope.get("headers") or ())
    if headers.get(b"expect", b"").lower() == b"100-continue":
        return
    length = headers.get(b"content-length")
    if length is not None:
        if not length.isdigit() or int(length) == 0 or int(length) > max_bytes:
            return
    elif b"chunked" not in headers.get(b"transfer-encoding", b"").lower():
        return
    seen = 0
    try:
        with anyio.fail_after(max_s):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return
                seen += len(message.get("body", b""))
                if not message.get("more_body", False) or seen > max_bytes:
                    return
    except TimeoutError:
        return
