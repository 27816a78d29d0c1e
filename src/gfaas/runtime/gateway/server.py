"""Serving the gateway: :class:`GatewayServer` (uvicorn in a background thread) and :func:`serve`."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import resource
import socket
import threading
from typing import Any

from fastapi import FastAPI

from ...errors import ConfigError
from ..api import RuntimeAPI
from .app import create_app
from .limits import GatewayLimits
from .protocol import bounded
from .ratelog import RateLimitFilter

log = logging.getLogger("gfaas.gateway")
# uvicorn logs a warning per malformed request; a flood of them must not become a flood of log.
_UVICORN_FILTER = RateLimitFilter()


class GatewayServer:
    """The gateway served by uvicorn in a background thread; use :func:`serve` to make one.

    ``bind`` is the address it listens on (``0.0.0.0:8080`` for every interface); ``url`` is where a
    client on this machine reaches it (``http://127.0.0.1:8080`` then); ``token`` is the bearer token
    clients must send (``None`` when authentication is off). :meth:`stop` (or leaving the ``with`` block)
    shuts it down.
    """

    def __init__(self, app: FastAPI, sock: socket.socket, host: str, *, access_log: bool = True,
                 graceful_s: float = 5.0, limits: GatewayLimits | None = None) -> None:
        import uvicorn

        limits = limits or GatewayLimits()
        self.app = app
        self.host = host
        self.token: str | None = app.state.gateway.token
        address, self.port = sock.getsockname()[:2]
        self.bind = f"[{address}]:{self.port}" if ":" in address else f"{address}:{self.port}"
        shown = "127.0.0.1" if address == "0.0.0.0" else "[::1]" if address == "::" else \
            f"[{address}]" if ":" in address else address
        self.url = f"http://{shown}:{self.port}"
        self._sock = sock
        self._ready = threading.Event()
        self._error: BaseException | None = None

        ready = self._ready

        class _Server(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets=sockets)
                ready.set()

        # log_config/log_level None: the library leaves logging configuration to the application
        # httptools (else h11) with a header deadline and a connection cap (protocol.py); a header block
        # over 16 KiB is a 400
        protocol = bounded(limits.header_timeout_s, _connection_cap(limits.max_connections),
                           app.state.gateway.proven_clients, app.state.gateway.held_clients,
                           getattr(getattr(app, "guard", None), "early_refusal", None) if limits.early_refusals else None,
                           getattr(app.state.gateway.runtime, "poll_replies", None) if limits.replies_on_loop else None)
        config = uvicorn.Config(app, log_config=None, log_level=None, access_log=access_log, lifespan="on",
                                timeout_graceful_shutdown=math.ceil(graceful_s), http=protocol,
                                timeout_keep_alive=5, h11_max_incomplete_event_size=16 * 1024, loop=_loop())
        uv_log = logging.getLogger("uvicorn.error")
        if _UVICORN_FILTER not in uv_log.filters:
            uv_log.addFilter(_UVICORN_FILTER)
        self._server = _Server(config)
        self._thread = threading.Thread(target=self._run, name=f"gfaas-gateway-{self.port}", daemon=True)

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the thread that called start()
            self._error = exc
            log.error("the gateway server stopped with an error", exc_info=exc)
        finally:
            self._ready.set()

    def start(self, timeout: float = 30.0) -> GatewayServer:
        """Start serving; returns once the server accepts connections."""
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None or not self._server.started:
            self.stop()
            raise ConfigError(f"the gateway did not start on {self.url}: {self._error!r}; see the gfaas.gateway "
                              "and uvicorn.error logs")
        where = "" if self.url.endswith("//" + self.bind) else f" (from this machine: {self.url})"
        log.info("gateway listening on %s%s, %s", self.bind, where,
                 "bearer token required" if self.token else "NO authentication (loopback only)")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, let running requests finish (up to the graceful timeout), and join the thread."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self._sock.close()

    @property
    def running(self) -> bool:
        """Whether the server thread is still alive (after :meth:`stop` returns it should not be)."""
        return self._thread.is_alive()

    def __enter__(self) -> GatewayServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _connection_cap(wanted: int) -> int:
    """``wanted``, but at most half the open-file limit: accept must never fail with EMFILE."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return wanted if soft == resource.RLIM_INFINITY else max(16, min(wanted, soft // 2))


def is_loopback(sock: socket.socket) -> bool:
    """Whether ``sock`` listens on a loopback address only (``0.0.0.0`` and ``::`` are every interface)."""
    try:
        return ipaddress.ip_address(sock.getsockname()[0].split("%")[0]).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    # proto IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on TCP-proto sockets, and without it
    # Nagle's algorithm and delayed ACKs add 40 ms to every response
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def serve(runtime: RuntimeAPI, host: str = "127.0.0.1", port: int = 0, *, token: str | None = None,
          authenticate: bool = True, limits: GatewayLimits | None = None, access_log: bool = True,
          graceful_s: float = 5.0, **app_options: Any) -> GatewayServer:
    """Serve the gateway for ``runtime`` on ``host:port`` in a background thread and return it, started.

    Binds loopback unless told otherwise; ``port=0`` picks a free port (see ``.port``/``.url``).
    ``token``: the bearer token clients must send (``None`` makes a random one: ``.token``);
    ``authenticate=False`` serves without one, which is refused on any address but loopback.
    ``limits`` (:class:`~.limits.GatewayLimits`) and ``app_options`` go to
    :func:`~gfaas.runtime.gateway.create_app` (``max_body_bytes``, ``default_timeout_s``, ...).
    ``access_log=False`` makes uvicorn detach its ``uvicorn.access`` logger's handlers (its own behaviour).
    """
    limits = limits or GatewayLimits()
    try:
        sock = _bind(host, port)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({exc}); pick another port, or 0 for a free one") from exc
    if not authenticate and not is_loopback(sock):
        where = sock.getsockname()[0]
        sock.close()
        raise ConfigError(f"refusing to serve on {where} without authentication: anyone who reaches that address "
                          "could deploy and run code; bind 127.0.0.1, or serve with a token (the default)")
    try:
        app = create_app(runtime, token=token, authenticate=authenticate, limits=limits, **app_options)
        return GatewayServer(app, sock, host, access_log=access_log, graceful_s=graceful_s, limits=limits).start()
    except BaseException:
        sock.close()
        raise


def _loop() -> str:
    """uvloop where it is installed (the event loop costs less per request under load), else asyncio."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"
