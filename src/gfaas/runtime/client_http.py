"""A small Python client of the HTTP gateway (on ``httpx``).

::

    from gfaas.runtime.client_http import GatewayClient

    with GatewayClient("http://127.0.0.1:8080", token_file="/run/user/1000/gfaas-1000/gateway/gateway.token") as gw:
        name = gw.deploy(open("spec.yaml").read())
        res = gw.invoke(name, {"x": np.arange(4, dtype=np.float32)})   # sync: an InvocationResult
        inv = gw.invoke(name, seed=3, mode="async")                     # async: the invocation ID
        res = gw.result(inv, timeout=60)

HTTP errors become the runtime's own exceptions: 400/415/422 :class:`~gfaas.errors.SpecError`, 404
:class:`~gfaas.errors.NotFound`, 429 :class:`~gfaas.errors.Overloaded`, 504 :class:`InvocationTimeout`
(a :class:`TimeoutError` that carries the invocation ID); anything else :class:`GatewayHTTPError`
(401: no or a wrong token). Nothing listening at the URL is :class:`GatewayUnavailable`.

The gateway wants ``Authorization: Bearer TOKEN``: the client sends ``token``, or the token in
``token_file``, or ``$GFAAS_GATEWAY_TOKEN``, or the token in ``$GFAAS_GATEWAY_TOKEN_FILE``, the first
given of these (``gfaas serve`` prints the path of the file it keeps the token in).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np

from ..errors import DependencyMissing, GfaasError, NotFound, Overloaded, SpecError
from .result import InvocationResult
from .wire import decode_array, encode_array, result_from_document

try:
    import httpx
except ImportError as exc:  # pragma: no cover - httpx is a core dependency
    raise DependencyMissing("gfaas.runtime.client_http needs httpx; reinstall gfaas (pip install -e .)") from exc

__all__ = ["GatewayClient", "GatewayHTTPError", "GatewayUnavailable", "InvocationTimeout", "decode_array",
           "encode_array"]

_POLL_S = 30.0  # the longest single ?wait= of result() (the gateway caps waits at its max_timeout_s)


class GatewayHTTPError(GfaasError):
    """The gateway answered with an error status that has no closer exception."""

    def __init__(self, status_code: int, body: Any, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class GatewayUnavailable(GfaasError, ConnectionError):
    """No gateway answers at the client's URL (nothing listens there, or the connection failed)."""


class _Transport(httpx.HTTPTransport):
    """httpx's transport, with a failure to connect turned into :class:`GatewayUnavailable`, whose
    message says where the client looked and how to point it elsewhere."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return super().handle_request(request)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            url = f"{request.url.scheme}://{request.url.netloc.decode()}"
            raise GatewayUnavailable(f"no gateway answers at {url} ({_reason(exc)}): start one with `gfaas serve`, "
                                     "or give the address of yours (--url or $GFAAS_URL; GatewayClient(url))") from None


def _reason(exc: Exception) -> str:
    text = str(exc)
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    return text.split("] ", 1)[-1] or type(exc).__name__


class InvocationTimeout(GfaasError, TimeoutError):
    """A sync invocation did not finish in time (HTTP 504); it goes on: fetch it with ``result(invocation_id)``."""

    def __init__(self, invocation_id: str, message: str) -> None:
        super().__init__(message)
        self.invocation_id = invocation_id


def _check(r: httpx.Response) -> Any:
    """The JSON body of a successful answer; the matching exception otherwise."""
    try:
        body: Any = r.json()
    except ValueError:
        body = {"message": r.text}
    if r.status_code < 400:
        return body
    message = body.get("message", r.text) if isinstance(body, dict) else r.text
    text = f"gateway: HTTP {r.status_code}: {message}"
    if r.status_code in (400, 415, 422):
        raise SpecError(text)
    if r.status_code == 404:
        raise NotFound(text)
    if r.status_code == 429:
        raise Overloaded(text + f" (retry after {r.headers.get('retry-after', '?')} s)")
    if r.status_code == 401:
        raise GatewayHTTPError(401, body, "gateway: HTTP 401: no token, or not this gateway's: give the token file "
                                          "`gfaas serve` printed (--token-file FILE or $GFAAS_GATEWAY_TOKEN_FILE; "
                                          "token_file= in Python)")
    if r.status_code == 504 and isinstance(body, dict) and "invocation_id" in body:
        raise InvocationTimeout(str(body["invocation_id"]), text)
    raise GatewayHTTPError(r.status_code, body, text)


def _token(token: str | None, token_file: str | Path | None) -> str | None:
    if token:
        return token
    path = token_file or None
    if path is None and os.environ.get("GFAAS_GATEWAY_TOKEN"):
        return os.environ["GFAAS_GATEWAY_TOKEN"]
    path = path or os.environ.get("GFAAS_GATEWAY_TOKEN_FILE") or None
    if path is None:
        return None
    from .gateway.auth import read_token_file

    return read_token_file(path)


class GatewayClient:
    """Deploy, invoke and fetch results over the gateway's HTTP API.

    Args:
        url: the gateway's base URL (e.g. ``GatewayServer.url``).
        timeout: seconds for each HTTP request beyond any wait the request itself asks the gateway for.
        client: an ``httpx.Client`` to use instead (e.g. FastAPI's ``TestClient``); its own timeouts apply
            (make them longer than the waits you ask for) and :meth:`close` leaves it open.
        token: the gateway's bearer token; token_file: a file that holds it (see the module docstring for
            the environment variables read when neither is given). Not with ``client``, which sends its own
            headers.
    """

    def __init__(self, url: str = "", *, timeout: float = 30.0, client: httpx.Client | None = None,
                 token: str | None = None, token_file: str | Path | None = None) -> None:
        if client is None and not url:
            raise ValueError("GatewayClient needs the gateway's url (or an httpx client)")
        token = _token(token, token_file) if client is None or token or token_file else None
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._own = client is None
        if client is None:  # TCP_NODELAY: a request's headers and body go out without waiting for an ACK
            nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
            client = httpx.Client(base_url=url, timeout=timeout, headers=headers,
                                  transport=_Transport(socket_options=nodelay))
        elif headers:
            raise ValueError("GatewayClient(client=...) sends what that client sends: give it the header "
                             "Authorization: Bearer TOKEN instead of token=/token_file=")
        self._http = client
        self._timeout = timeout

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _timeout_for(self, wait: float) -> dict[str, Any]:
        """The HTTP timeout of a request that asks the gateway to wait ``wait`` s (an injected client's own
        timeouts apply as they are)."""
        return {"timeout": self._timeout + wait} if self._own else {}

    # -- workflows
    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def deploy(self, spec_text: str, content_type: str = "application/yaml",
               code: str | Path | bytes | None = None) -> str:
        """Deploy a spec (YAML or JSON text); returns the workflow's name. ``code``: a directory of the
        handlers' modules (packed with the spec as ``workflow.yaml``), or a package's archive bytes
        (which must hold ``workflow.yaml`` itself; ``spec_text`` is then ignored). A deployed name
        gets a new version (docs/deploying-code.md)."""
        if code is None:
            r = self._http.post("/v1/workflows", content=spec_text.encode("utf-8"),
                                headers={"content-type": content_type})
        else:
            from .codepkg import pack_dir

            archive = code if isinstance(code, bytes) else \
                pack_dir(code, extra={"workflow.yaml": spec_text.encode("utf-8")})
            content = "application/zip" if archive[:4] == b"PK\x03\x04" else "application/gzip"
            r = self._http.post("/v1/workflows", content=archive, headers={"content-type": content})
        return str(_check(r)["workflow"])

    def versions(self, workflow: str) -> list[dict[str, Any]]:
        """Every version of ``workflow``, oldest first."""
        out: list[dict[str, Any]] = _check(self._http.get(f"/v1/workflows/{workflow}/versions"))["versions"]
        return out

    def scaling_status(self, workflow: str) -> dict[str, Any]:
        """The workflow's workers per function, scaling targets, cold starts (``GET .../status``)."""
        doc: dict[str, Any] = _check(self._http.get(f"/v1/workflows/{workflow}/status"))
        return doc

    def rollback(self, workflow: str, version: int) -> int:
        """Make ``version`` current again (as a new version, returned)."""
        return int(_check(self._http.post(f"/v1/workflows/{workflow}/rollback", json={"version": version}))["version"])

    def undeploy(self, workflow: str) -> None:
        """Undeploy ``workflow``: its workers stop; ``NotFound`` if it is not deployed."""
        _check(self._http.delete(f"/v1/workflows/{workflow}"))

    def workflows(self) -> list[str]:
        return [str(n) for n in _check(self._http.get("/v1/workflows"))["workflows"]]

    def describe(self, workflow: str) -> dict[str, Any]:
        doc: dict[str, Any] = _check(self._http.get(f"/v1/workflows/{workflow}"))
        return doc

    # -- invocations
    @staticmethod
    def _body(inputs: Mapping[str, Any] | None, seed: int | None, transport: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if inputs is not None:
            body["inputs"] = {k: encode_array(np.asarray(v)) for k, v in inputs.items()}
        if seed is not None:
            body["seed"] = int(seed)
        if transport is not None:
            body["transport"] = transport
        return body

    @overload
    def invoke(self, workflow: str, inputs: Mapping[str, Any] | None = ..., *, seed: int | None = ...,
               timeout: float | None = ..., transport: str | None = ...,
               mode: Literal["sync"] = ...) -> InvocationResult: ...

    @overload
    def invoke(self, workflow: str, inputs: Mapping[str, Any] | None = ..., *, seed: int | None = ...,
               timeout: float | None = ..., transport: str | None = ...,
               mode: Literal["async"]) -> str: ...

    def invoke(self, workflow: str, inputs: Mapping[str, Any] | None = None, *, seed: int | None = None,
               timeout: float | None = None, transport: str | None = None,
               mode: Literal["sync", "async"] = "sync") -> InvocationResult | str:
        """Invoke ``workflow`` with ``inputs`` (name -> array) or ``seed``.

        ``mode="sync"`` waits (the gateway's default, or ``timeout`` seconds) and returns the result
        (``status`` may be ``"failed"``); on timeout it raises :class:`InvocationTimeout`.
        ``mode="async"`` returns the invocation ID at once.
        """
        params: dict[str, Any] = {"mode": mode}
        if timeout is not None and mode == "sync":
            params["timeout"] = timeout
        wait = (timeout if timeout is not None else 600.0) if mode == "sync" else 0.0
        r = self._http.post(f"/v1/workflows/{workflow}/invocations", params=params,
                            json=self._body(inputs, seed, transport), **self._timeout_for(wait))
        doc = _check(r)
        if mode == "async":
            return str(doc["invocation_id"])
        return result_from_document(doc)

    def submit(self, workflow: str, inputs: Mapping[str, Any] | None = None, *, seed: int | None = None,
               transport: str | None = None) -> str:
        """``invoke(..., mode="async")``: the invocation ID."""
        return self.invoke(workflow, inputs, seed=seed, transport=transport, mode="async")

    def status(self, invocation_id: str) -> str:
        return str(_check(self._http.get(f"/v1/invocations/{invocation_id}"))["status"])

    def result(self, invocation_id: str, timeout: float | None = None) -> InvocationResult:
        """Wait for the invocation's result (``None``: as long as it takes); ``TimeoutError`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
            r = self._http.get(f"/v1/invocations/{invocation_id}/result", params={"wait": left},
                               **self._timeout_for(left))
            doc = _check(r)
            if r.status_code == 200:
                return result_from_document(doc)
            if deadline is not None and time.monotonic() >= deadline:
                raise InvocationTimeout(invocation_id, f"invocation {invocation_id} still {doc.get('status')} "
                                                       f"after {timeout} s")

    # -- logs
    @staticmethod
    def _log_params(function: str | None, invocation: str | None, since: float | None,
                    limit: int | None) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for k, v in (("function", function), ("invocation", invocation), ("since", since), ("limit", limit)):
            if v is not None:
                params[k] = v
        return params

    def logs(self, workflow: str, *, function: str | None = None, invocation: str | None = None,
             since: float | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """The workflow's kept log lines (oldest first; the gateway's default limit is the last 1000):
        dicts of ``seq, time, workflow, version, function, invocation, stream, level, text``."""
        r = self._http.get(f"/v1/workflows/{workflow}/logs", params=self._log_params(function, invocation, since, limit))
        if r.status_code >= 400:
            _check(r)
        return [json.loads(line) for line in r.text.splitlines() if line.strip()]

    def follow_logs(self, workflow: str, *, function: str | None = None, invocation: str | None = None,
                    limit: int | None = None, for_s: float = 60.0, after: int | None = None) -> Iterator[dict[str, Any]]:
        """The kept lines (after ``seq`` ``after``, when given), then new ones as they come, for ``for_s``
        seconds or the gateway's longest wait (``max_timeout_s``), whichever is shorter."""
        params = {**self._log_params(function, invocation, None, limit), "follow": "true", "follow_s": for_s}
        if after is not None:
            params["after"] = after
        with self._http.stream("GET", f"/v1/workflows/{workflow}/logs", params=params,
                               **self._timeout_for(for_s)) as r:
            if r.status_code >= 400:
                r.read()
                _check(r)
            for line in r.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def metrics(self) -> str:
        r = self._http.get("/metrics")
        if r.status_code >= 400:
            _check(r)
        return r.text
