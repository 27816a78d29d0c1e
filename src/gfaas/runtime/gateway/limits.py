"""What the gateway accepts: :class:`GatewayLimits`, the knobs of its caps and timeouts."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError
from ...units import KiB

# Where the shipped workflows' handlers live: the only package a default gateway loads handlers from.
DEFAULT_HANDLER_PACKAGES = ("gfaas.workflows",)


# Content types of a deploy that carries a code package: an archive holding workflow.yaml and the code.
CODE_TYPES = ("application/gzip", "application/x-gzip", "application/x-tar", "application/x-gtar", "application/zip")


@dataclass(frozen=True)
class GatewayLimits:
    """Caps and timeouts of a gateway, each answered with a clear 4xx (or a closed connection for the
    server-level ones) that names the setting.

    Attributes:
        handler_packages: modules (and their submodules) deployed specs may name as handlers; any other
            handler is a 400 naming it, checked before anything is imported.
        max_spec_bytes: the largest spec body (413; the shipped specs are under 3 KiB).
        max_code_bytes: the largest code package, archive and unpacked contents alike (413 for the
            body, 400 for what it expands to; docs/deploying-code.md).
        max_functions: functions per spec (400).
        max_workflows: workflows deployed at once (409; undeploy one with ``DELETE /v1/workflows/NAME``).
        max_requests: requests in progress at once, waits included (more: 503 with ``Retry-After``).
        body_timeout_s: the whole request body must arrive within this many seconds of the headers (408).
        header_timeout_s: a request's headers must arrive within this many seconds of the connection
            (or of the request's first byte on a kept-alive one); then the connection is closed.
        max_connections: open connections at once; newer ones are closed at once. ``serve`` lowers it to
            half the process's open-file limit.
        hold_refused: the next request on a connection answered 429 or 503 waits until its
            ``Retry-After`` is up, at most a second (a client retrying at once makes at most one
            request a second). Turn it off behind a proxy that carries many clients' requests on
            one connection.
        early_refusals: an invocation its workflow's limit refuses is answered by the server's
            protocol as soon as its headers are in (httptools), the guard's answer without the
            framework's cost (``gfaas bench overload`` measures both); off, it goes through the guard.
        replies_on_loop: the runtime's worker replies are handled on the server's event loop thread,
            where the invocations are submitted and answered (``LocalRuntime.drive_replies``), not on
            the invoker's own thread; off, they keep that thread (two threads share the GIL).
    """

    handler_packages: tuple[str, ...] = DEFAULT_HANDLER_PACKAGES
    max_spec_bytes: int = 64 * KiB
    max_code_bytes: int = 64 * 1024 * KiB
    max_functions: int = 64
    max_workflows: int = 64
    max_requests: int = 512
    body_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    max_connections: int = 2048
    hold_refused: bool = True
    early_refusals: bool = True
    replies_on_loop: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.handler_packages, str):
            raise ConfigError(f"handler_packages must be a tuple of package names, not the string "
                              f"{self.handler_packages!r}")
        for p in self.handler_packages:
            if not isinstance(p, str) or not p or p.startswith(".") or p.endswith(".") or ":" in p:
                raise ConfigError(f"handler_packages: {p!r} is not a package name such as 'gfaas.workflows'")
        for name in ("max_spec_bytes", "max_code_bytes", "max_functions", "max_workflows", "max_requests", "max_connections"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"GatewayLimits.{name}={value!r} is invalid: give an integer >= 1")
        for name in ("body_timeout_s", "header_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"GatewayLimits.{name}={getattr(self, name)!r} is invalid: give seconds > 0")
