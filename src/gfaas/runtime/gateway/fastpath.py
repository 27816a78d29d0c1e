"""The invoke endpoint's fast path: a well-formed synchronous invocation skips the web framework.

``POST /v1/workflows/NAME/invocations`` is most of what a loaded gateway answers, and FastAPI's
routing, dependency solving, pydantic validation and middleware stack cost about as much event-loop
time per request as the invocation itself. The guard (:mod:`.guard`) hands such a request here after
admitting it: the query and the body are parsed with msgspec against the same rules as the
:class:`~.schemas.InvocationRequest` schema, and the invocation runs through the very function the
FastAPI route calls (:func:`.invocations.run_invocation`), so its answers are the route's.

Anything this parser does not accept as plainly valid (an unknown query parameter, ``mode=async``, a
body with an extra key, a float where an integer goes, a dtype it does not know, ...) goes to the
FastAPI route with the body already read, so every error answer (422 with its field list, 400, 404)
comes from one place and reads the same either way.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any
from urllib.parse import parse_qsl

import msgspec
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..wire import DTYPES, MAX_NDIM
from .errors import response_for
from .invocations import run_invocation

__all__ = ["FastBody", "fast_invoke", "parse_body", "parse_query"]

_DTYPES = frozenset(DTYPES)
_TRANSPORTS = frozenset({"gfaas", "redis"})
_MAX_SEED = 2**53 - 1  # as the schema's bound
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$")  # what both parsers read alike as a float


class _Array(msgspec.Struct, forbid_unknown_fields=True):
    dtype: str
    shape: list[int]
    data_b64: str

    def as_doc(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": self.shape, "data_b64": self.data_b64}


class _Request(msgspec.Struct, forbid_unknown_fields=True):
    # UNSET, not None: a JSON null is not "left out" (the schema refuses it; the route says so)
    inputs: dict[str, _Array] | msgspec.UnsetType = msgspec.UNSET
    seed: int | msgspec.UnsetType = msgspec.UNSET
    transport: str | msgspec.UnsetType = msgspec.UNSET


_decoder = msgspec.json.Decoder(_Request)


class FastBody:
    """A request body the fast path accepted: what :func:`.invocations.run_invocation` reads."""

    __slots__ = ("inputs", "seed", "transport")

    def __init__(self, inputs: dict[str, _Array] | None, seed: int | None, transport: str | None) -> None:
        self.inputs, self.seed, self.transport = inputs, seed, transport


def parse_body(raw: bytes) -> FastBody | None:
    """The body, if it is plainly valid by the schema's rules; None sends the request to the route."""
    try:
        req = _decoder.decode(raw)
    except msgspec.DecodeError:
        return None
    inputs = None if req.inputs is msgspec.UNSET else req.inputs
    seed = None if req.seed is msgspec.UNSET else req.seed
    transport = None if req.transport is msgspec.UNSET else req.transport
    if (inputs is None) == (seed is None):
        return None
    if seed is not None and not 0 <= seed <= _MAX_SEED:
        return None
    if transport is not None and transport not in _TRANSPORTS:
        return None
    for a in (inputs or {}).values():
        if a.dtype not in _DTYPES or len(a.shape) > MAX_NDIM or any(n < 0 for n in a.shape):
            return None
    return FastBody(inputs, seed, transport)


def parse_query(query: bytes, max_timeout_s: float) -> tuple[float | None, str] | None:
    """``(timeout or None, outputs)`` of a synchronous invocation's query string; None (the route
    answers) for anything else: another parameter, a repeated one, ``mode=async``, a bad value."""
    timeout: float | None = None
    outputs = "full"
    seen: set[str] = set()
    try:
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True, strict_parsing=False)
    except ValueError:
        return None
    for key, value in pairs:
        if key in seen:
            return None
        seen.add(key)
        if key == "timeout":
            if not _NUMBER.match(value):
                return None
            timeout = float(value)
            if not (math.isfinite(timeout) and 0 <= timeout <= max_timeout_s):
                return None
        elif key == "outputs":
            if value not in ("full", "digest"):
                return None
            outputs = value
        elif key == "mode":
            if value != "sync":
                return None
        else:
            return None
    return timeout, outputs


async def fast_invoke(app: ASGIApp, fast: tuple[Any, str, tuple[float | None, str]], scope: Scope,
                      receive: Receive, send: Send) -> None:
    """An admitted synchronous invocation whose query :func:`parse_query` took: run here if its body
    parses plainly, else handed to ``app`` (the FastAPI application) with the body replayed.
    ``fast``: the gateway's state, the workflow's name, the parsed query."""
    gw, name, (timeout, outputs) = fast
    chunks = []
    while True:
        message = await receive()  # the guard's receive: the body's size and time limits hold
        if message["type"] != "http.request":
            return  # the client left before its body was in: nobody to answer
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    raw = b"".join(chunks)
    body = parse_body(raw)
    if body is None:
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await app(scope, replay, send)
        return
    request = Request(scope, receive)
    wait_s = gw.default_timeout_s if timeout is None else timeout
    try:
        response = await run_invocation(request, name, body, gw, "sync", wait_s, outputs,
                                        scope["state"].get("admission"), time.monotonic())
    except Exception as exc:
        answer = await response_for(request, exc)
        if answer is None:
            raise
        response = answer
    await response(scope, receive, send)
