"""The gateway's error answers: the JSON error body and the exception handlers (:func:`add_error_handlers`).

Every error is ``{"error": CODE, "message": TEXT, ...}``; see the package docstring for the codes.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ...errors import ConfigError, GfaasError, NotFound, Overloaded
from .ratelog import RateLimitedLog

log = RateLimitedLog(logging.getLogger("gfaas.gateway"))

_BODY_HINT = ('expected a JSON body {"inputs": {NAME: {"dtype": ..., "shape": [...], "data_b64": ...}}} '
              'or {"seed": INT}')


class _ErrorJSON(JSONResponse):
    """A JSON answer encoded by msgspec: the same compact UTF-8 JSON as the framework's ``json.dumps``
    at a fraction of its cost, which was a sixth of a refusal's (py-spy, an all-refused load)."""

    def render(self, content: Any) -> bytes:
        return encode_json(content)


encode_json = msgspec.json.Encoder().encode  # compact UTF-8 JSON (error and result bodies)


def error_response(http_status: int, code: str, message: str, headers: Mapping[str, str] | None = None,
                   **extra: Any) -> JSONResponse:
    """The JSON error body every error answer has."""
    return _ErrorJSON({"error": code, "message": message, **extra}, status_code=http_status,
                      headers=dict(headers or {}))


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [{"field": _field_name(e.get("loc", ())), "message": str(e.get("msg", "")).removeprefix("Value error, ")}
              for e in exc.errors()]
    for e, raw in zip(errors, exc.errors(), strict=True):
        if raw.get("type") == "json_invalid":
            e["field"] = "body"
            e["message"] = f"not valid JSON ({raw.get('ctx', {}).get('error', 'decode error')})"
    text = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    if any(tuple(raw.get("loc", ()))[:1] == ("body",) for raw in exc.errors()):
        text += f" ({_BODY_HINT})"
    return error_response(422, "invalid_request", text, errors=errors)


_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")


def _allowed_methods(request: Request) -> str:
    """Every method some route of the app serves on this path (Starlette's 405 names only the first
    route's: ``POST`` where ``GET`` is served too)."""
    return ", ".join(m for m in _METHODS if any(
        route.matches({**request.scope, "method": m})[0] == Match.FULL for route in request.app.routes))


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large",
            415: "unsupported_media_type"}.get(exc.status_code, "http_error")
    message = str(exc.detail) if exc.status_code != 404 else \
        f"no such endpoint: {request.method} {request.url.path} (see /docs or docs/gateway.md)"
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() != "allow"}
    if exc.status_code == 405:
        headers["allow"] = _allowed_methods(request)
        message = f"{request.method} is not served on {request.url.path}; allowed: {headers['allow']}"
    return error_response(exc.status_code, code, message, headers)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return error_response(404, "not_found", str(exc))


async def _bad(request: Request, exc: Exception) -> JSONResponse:
    return error_response(400, "bad_request", str(exc))


async def _overloaded(request: Request, exc: Exception) -> JSONResponse:
    retry_after_s = request.app.state.gateway.retry_after_s
    return error_response(429, "overloaded", str(exc), {"retry-after": str(retry_after_s)},
                          retry_after_s=retry_after_s)


async def _gfaas(request: Request, exc: Exception) -> JSONResponse:
    ref = secrets.token_hex(4)
    log.error("error (reference %s) answering %s %s: %s", ref, request.method, request.url.path, exc, exc_info=exc)
    return error_response(500, "internal", f"{type(exc).__name__}: {exc} (reference {ref})")


async def response_for(request: Request, exc: Exception) -> JSONResponse | None:
    """The answer the app's handlers give ``exc`` (None: none of them takes it), for code that runs
    outside the app's routes (the guard's fast path)."""
    for kind, handler in ((NotFound, _not_found), (ConfigError, _bad), (Overloaded, _overloaded),
                          (GfaasError, _gfaas)):
        if isinstance(exc, kind):
            return await handler(request, exc)
    return None


def add_error_handlers(app: FastAPI) -> None:
    """Register the gateway's exception handlers on ``app`` (the 413 and last-resort 500 are the guard's)."""
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(ConfigError, _bad)  # SpecError is one
    app.add_exception_handler(Overloaded, _overloaded)
    app.add_exception_handler(GfaasError, _gfaas)
