"""The ASGI guard in front of every route: authentication, request and body bounds, the last-resort 500.

In this order, before the app reads anything of the body:

* **authentication**: every path except :data:`OPEN_PATHS` needs ``Authorization: Bearer TOKEN``
  (compared in constant time); otherwise 401. New routes are protected without doing anything. The
  dashboard's read-only views (:data:`.dashboard.READ_ONLY_PREFIXES`, GET) are open to a loopback client
  whose socket the gateway's own user owns (:mod:`.peer`): not to function code under a tenant uid.
* **requests in progress**: at most ``max_requests`` (``/healthz`` aside); more are 503 with ``Retry-After``.
* **refused connections wait**: the next request on a connection refused with ``Retry-After`` (429,
  503) is not looked at before that time is up, or :data:`MAX_HOLD_S`, whichever is sooner (the
  server's protocol holds it before it is parsed, :mod:`.protocol`; the guard itself otherwise). A client
  that honours it never notices; one that retries at once makes at most one request a second, so
  refusals cannot crowd out admitted work (and a request held is never held past its client's patience).
* **admission** (issue 23): an invocation (``POST /v1/workflows/NAME/invocations``) is admitted by
  the workflow's adaptive limit (:mod:`.admission`) on its headers and query alone, or waits (no
  thread) for a place while its timeout allows; a refusal is a 429 with ``Retry-After`` before the
  body is read or the runtime asked. The place is freed when the
  invocation ends (the endpoint hands it to the runtime's done-callback) or, if it never reached the
  runtime, when the request ends.
* **body size**: a ``Content-Length`` over the route's limit (``max_spec_bytes`` for a deploy,
  ``max_body_bytes`` otherwise) is 413 at once; a chunked body is cut off with 413 as it passes the limit.
* **body time**: the whole body must arrive within ``body_timeout_s`` of the headers; otherwise 408
  and the connection is closed (slow-body clients cannot hold a request slot for ever).
* **the fast path**: an admitted synchronous invocation with a JSON body is answered here, without
  the web framework, when its query and body are plainly valid (:mod:`.fastpath`); anything else
  goes to the FastAPI route, the body replayed.

Errors that escape the app are answered 500 and logged, at most at a bounded rate.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .admission import invoke_wait, overloaded
from .auth import token_matches
from .dashboard import READ_ONLY_PREFIXES
from .errors import error_response
from .fastpath import fast_invoke, parse_query
from .limits import CODE_TYPES, GatewayLimits
from .linger import LINGER_BYTES, LINGER_S, drain_body, proven_clients
from .peer import same_user_on_loopback
from .ratelog import RateLimitedLog

log = RateLimitedLog(logging.getLogger("gfaas.gateway"))

# Open without a token: liveness (a probe knows no secrets), the API's own description (static; the
# schema-driven clients and /docs need it) and ``/``, a redirect to the dashboard (which asks for the
# token itself unless the caller is the gateway's own user on this machine). Everything else, /metrics
# included, needs the token.
OPEN_PATHS = frozenset({"/", "/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
UNAUTHORIZED = ("this endpoint needs the header `Authorization: Bearer TOKEN`; the token is in the gateway's "
                "token file (gfaas serve prints its path; GatewayClient reads $GFAAS_GATEWAY_TOKEN or "
                "$GFAAS_GATEWAY_TOKEN_FILE)")


_INVOKE = re.compile(r"^/v1/workflows/([^/]+)/invocations$")
MAX_SLOWED = 65536  # refused connections remembered (the expired ones go first beyond it)
MAX_HOLD_S = 1.0  # the longest a refused connection's next request is held (Retry-After may say 30 s)


class _Cut(Exception):
    """The body was cut off (too large or too slow): the answer is the guard's, whatever the app says."""


class Guard:
    """The ASGI middleware described in the module docstring; ``token=None`` turns authentication off."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, limits: GatewayLimits, token: str | None,
                 retry_after_s: int = 1, held: dict[Any, float] | None = None, gateway: Any = None) -> None:
        self.app = app
        self.gateway = gateway  # the app's state.gateway: what early_refusal asks (the protocol has no app)
        self.max_body_bytes = max_body_bytes
        self.limits = limits
        self.token = None if token is None else token.encode()
        self.retry_after_s = retry_after_s
        self.active = 0  # requests in progress (one event loop: no lock needed)
        # a refused connection (client address and port) -> when its next request may be looked at; the
        # gateway's own dict (held_clients), which its server's protocol reads first (protocol.py)
        self._slowed: dict[Any, float] = held if held is not None else {}

    @staticmethod
    def _read_only_local(scope: Scope, path: str, headers: dict[bytes, bytes]) -> bool:
        """The dashboard's read-only views, asked without a token by the gateway's own user on this
        machine (not by function code under a tenant uid: :mod:`.peer`)."""
        if scope.get("method") not in ("GET", "HEAD") or b"authorization" in headers:
            return False
        if not any(path == p or path.startswith(p if p.endswith("/") else p + "/") for p in READ_ONLY_PREFIXES):
            return False
        return same_user_on_loopback(scope.get("client"), scope.get("server"))

    def _limit(self, method: str, path: str, headers: dict[bytes, bytes]) -> tuple[int, str]:
        if method == "POST" and path == "/v1/workflows":
            ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower().decode("latin-1")
            if ctype in CODE_TYPES:  # a code package: its own limit, which may pass the general one
                return self.limits.max_code_bytes, "max_code_bytes"
            if self.limits.max_spec_bytes < self.max_body_bytes:
                return self.limits.max_spec_bytes, "max_spec_bytes"
        return self.max_body_bytes, "max_body_bytes"

    def _refusal(self, scope: Scope, path: str) -> JSONResponse | None:
        """The answer to a request refused on its headers alone, or None."""
        headers = dict(scope.get("headers") or ())
        if self.token is not None and path not in OPEN_PATHS and \
                not token_matches(headers.get(b"authorization"), self.token) and \
                not self._read_only_local(scope, path, headers):
            message = UNAUTHORIZED if b"authorization" not in headers else \
                "the bearer token is not this gateway's (see the gateway's token file)"
            return error_response(401, "unauthorized", message, {"www-authenticate": 'Bearer realm="gfaas"'})
        if path != "/healthz" and self.active >= self.limits.max_requests:
            return error_response(503, "busy", f"the gateway has {self.active} requests in progress (max_requests="
                                  f"{self.limits.max_requests}); retry later", {"retry-after": str(self.retry_after_s)},
                                  retry_after_s=self.retry_after_s)
        limit, knob = self._limit(scope.get("method", ""), path, headers)
        length = headers.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return error_response(400, "bad_request", "the Content-Length header is not an integer")
            if n > limit:
                return self._too_large(limit, knob)
        return None

    @staticmethod
    def _too_large(limit: int, knob: str) -> JSONResponse:
        return error_response(413, "payload_too_large",
                              f"the request body is over the gateway's limit of {limit} bytes ({knob}); send less "
                              f"or start the gateway with a larger {knob}", {"connection": "close"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        if self._slowed and client is not None:
            until = self._slowed.pop(tuple(client), None)
            if until is not None and until > time.monotonic():  # early, and no protocol held it (a test client)
                await self._hold(until)
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        gw: Any = None
        lim: Any = None
        refusal = self._refusal(scope, path)
        if refusal is None:
            proven = proven_clients(scope) if self.token is not None and path not in OPEN_PATHS else None
            if proven is not None and client is not None:
                proven.add(tuple(client))  # authenticated: kept at the connection cap (protocol.py)
            refusal, gw, lim = await self._admission(scope, path)
        if refusal is not None:
            if refusal.headers.get("connection") == "close":  # kept alive, the server reads the rest itself
                await drain_body(scope, receive, LINGER_BYTES, min(LINGER_S, self.limits.body_timeout_s))
            await refusal(scope, receive, send)
            after = refusal.headers.get("retry-after")
            if after is not None and client is not None and self.limits.hold_refused:
                self._slow(tuple(client), float(after))
            return
        fast = None
        if lim is not None and _json_body(scope):
            query = parse_query(scope.get("query_string", b""), gw.max_timeout_s)
            if query is not None:
                fast = (gw, _INVOKE.match(path).group(1), query)  # type: ignore[union-attr]
        self.active += 1
        try:
            await self._guarded(scope, receive, send, path, fast)
        finally:
            self.active -= 1
            if lim is not None and not scope["state"].get("watched"):
                gw.admissions.finished(lim, None)  # it never reached the runtime: its place is free again

    @staticmethod
    async def _hold(until: float) -> None:
        await asyncio.sleep(until - time.monotonic())

    def _slow(self, client: Any, after_s: float) -> None:
        """Hold ``client``'s next request until ``after_s`` from now (see the module docstring)."""
        now = time.monotonic()
        if len(self._slowed) >= MAX_SLOWED:
            for key in [k for k, t in self._slowed.items() if t <= now]:
                del self._slowed[key]
            while len(self._slowed) >= MAX_SLOWED:  # all still waiting: forget the oldest
                del self._slowed[next(iter(self._slowed))]
        self._slowed[client] = now + min(after_s, MAX_HOLD_S)

    def early_refusal(self, scope: Scope) -> JSONResponse | None:
        """The 429 of an invocation its workflow's limit refuses now, decided on the request line and
        headers alone, or None: anything else (another route, a request the guard itself would
        refuse, one that would be admitted or wait) goes through the guard as usual. The server's
        protocol asks this before it builds anything for the request (:mod:`.protocol`): a refusal
        then costs no task, no ASGI call and no response object of the framework's, so refused
        clients cannot take the event loop from admitted work. Its answer is the guard's own, and
        it is counted, and the connection held, as the guard does."""
        gw = self.gateway
        if gw is None or scope.get("method") != "POST":
            return None
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        m = _INVOKE.match(path)
        if m is None:
            return None
        name, wait = m.group(1), invoke_wait(scope, gw.default_timeout_s)
        # Most requests are not refused: asked first, without counting, that costs them little. Only a
        # refusal has the guard's own checks run (a request it would answer otherwise is left to it).
        decision = gw.admissions.refused_now(name, wait, count=False)
        if decision is None or self._refusal(scope, path) is not None:
            return None
        gw.admissions.count_refusal(name, decision)  # nothing ran between: the decision stands, counted once
        client = scope.get("client")
        if self.token is not None and client is not None:
            gw.proven_clients.add(tuple(client))  # authenticated (as the guard notes it)
        answer = overloaded(gw, name, decision)
        if client is not None and self.limits.hold_refused:
            self._slow(tuple(client), float(answer.headers["retry-after"]))
        return answer

    @staticmethod
    async def _admission(scope: Scope, path: str) -> tuple[JSONResponse | None, Any, Any]:
        """(a 429, or None; the gateway; the admitted place, handed to the endpoint in the request's state)."""
        m = _INVOKE.match(path) if scope.get("method") == "POST" else None
        app = scope.get("app")
        gw = getattr(getattr(app, "state", None), "gateway", None)
        if m is None or gw is None:
            return None, gw, None
        name = m.group(1)
        decision, lim = await gw.admissions.enter(name, invoke_wait(scope, gw.default_timeout_s), gw.default_timeout_s)
        if not decision.ok:
            return overloaded(gw, name, decision), gw, None
        scope.setdefault("state", {})["admission"] = lim
        return None, gw, lim

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, path: str, fast: Any = None) -> None:
        limit, knob = self._limit(scope.get("method", ""), path, dict(scope.get("headers") or ()))
        deadline = time.monotonic() + self.limits.body_timeout_s
        received = 0
        cut: JSONResponse | None = None
        body_done = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, cut, body_done
            if body_done:  # after the body: only http.disconnect is left to wait for
                return await receive()
            try:  # (asyncio's own timeout: anyio's cancel scope cost several times as much per request)
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                cut = error_response(408, "request_timeout", f"the request body did not arrive within "
                                     f"{self.limits.body_timeout_s:g} s (body_timeout_s)", {"connection": "close"})
                raise _Cut() from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > limit:
                    cut = self._too_large(limit, knob)
                    raise _Cut()
            else:
                body_done = True
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if cut is not None:
                return  # whatever the app answers to the cut-off body, the answer is the guard's
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            if fast is not None:
                await fast_invoke(self.app, fast, scope, limited_receive, guarded_send)
            else:
                await self.app(scope, limited_receive, guarded_send)
        except Exception as exc:
            if cut is None:
                ref = secrets.token_hex(4)
                log.error("unexpected error (reference %s) answering %s %s", ref, scope.get("method"),
                          scope.get("path"), exc_info=exc)
                if started:
                    return  # too late for a 500; the server closes the connection
                await error_response(500, "internal", f"internal error (reference {ref}); see the gateway log")(
                    scope, receive, send)
                return
        if cut is not None and not started:
            await cut(scope, receive, send)


def _json_body(scope: Scope) -> bool:
    """Whether the request says its body is JSON (``application/json``, parameters aside)."""
    for key, value in scope.get("headers") or ():
        if key == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False
