"""The protocol between the HTTP gateway (and other front ends) and a workflow runtime.

:class:`RuntimeAPI` is what :func:`gfaas.runtime.gateway.create_app` calls; :class:`~gfaas.runtime.local.LocalRuntime`
implements it, and so can any fake used in tests. It is a structural :class:`typing.Protocol`: nothing
has to inherit from it.

Errors are part of the protocol (the gateway maps them to HTTP status codes):

* :class:`~gfaas.errors.SpecError` - a bad spec, or inputs that do not fit the workflow (400);
* :class:`~gfaas.errors.NotFound` - no such workflow or invocation (404);
* :class:`~gfaas.errors.Overloaded` - a queue is full, the request was refused and may be retried (429);
* :class:`TimeoutError` - :meth:`RuntimeAPI.result` waited ``timeout`` seconds without an outcome (504/202).

A function that fails does not make :meth:`RuntimeAPI.result` raise: it returns an
:class:`~gfaas.runtime.result.InvocationResult` with ``status == "failed"`` and ``error`` set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .result import InvocationResult

__all__ = ["RuntimeAPI"]


@runtime_checkable
class RuntimeAPI(Protocol):
    """What a workflow runtime offers to the gateway. Every method may be called from several threads."""

    def deploy(self, spec_text: str, code: bytes | str | os.PathLike[str] | None = None) -> str:
        """Deploy a workflow (or a new version of a deployed one) from its YAML or JSON spec text and,
        optionally, a code package (archive bytes, or a directory); return its name. ``SpecError`` if bad."""
        ...

    def versions(self, workflow: str) -> list[dict[str, Any]]:
        """Every version of a deployed workflow, oldest first; ``NotFound`` if it is not deployed."""
        ...

    def rollback(self, workflow: str, version: int) -> int:
        """Make ``version`` current again as a new version; returns its number."""
        ...

    def undeploy(self, workflow: str) -> None:
        """Remove a deployed workflow and stop its workers; its unfinished invocations fail.
        ``NotFound`` if it is not deployed."""
        ...

    def workflows(self) -> list[str]:
        """The names of the deployed workflows."""
        ...

    def describe(self, workflow: str) -> dict[str, Any]:
        """A JSON-able description of a deployed workflow's spec; ``NotFound`` if not deployed."""
        ...

    def submit(self, workflow: str, inputs: Mapping[str, np.ndarray] | None = None, seed: int | None = None,
               transport: str | None = None, deadline_s: float | None = None) -> str:
        """Start an invocation and return its ID.

        Give either ``inputs`` (one array per declared input) or ``seed`` (the workflow's own
        deterministic input generator). ``transport`` picks how data passes between functions for
        this invocation (``"gfaas"`` or ``"redis"`` for the local runtime); ``None`` is the runtime's
        default, and the gateway passes it only when the client named one. ``deadline_s``: seconds
        from now by which its functions must have started (the gateway passes a synchronous
        request's timeout); one still queued then is not run and the invocation fails as expired.

        Raises ``NotFound`` (workflow), ``SpecError`` (missing, extra or ill-typed inputs; both or
        neither of inputs and seed), ``ConfigError`` (an unknown transport) or ``Overloaded`` (queue full).
        """
        ...

    def status(self, invocation_id: str) -> str:
        """``"queued"``, ``"running"``, ``"done"`` or ``"failed"``; ``NotFound`` for unknown IDs."""
        ...

    def result(self, invocation_id: str, timeout: float | None = None) -> InvocationResult:
        """Wait for the invocation to finish (done or failed) and return its result.

        Raises ``TimeoutError`` if it has not finished after ``timeout`` seconds (``None`` waits
        forever, ``0`` does not wait) and ``NotFound`` for unknown IDs.
        """
        ...

    def logs(self, workflow: str, function: str | None = None, invocation: str | None = None,
             since: float | None = None, limit: int = 1000, after: int | None = None) -> list[dict[str, Any]]:
        """The last ``limit`` log lines of ``workflow``'s functions that match, oldest first: dicts of
        ``seq, time, workflow, version, function, invocation, stream, level, text`` (see
        :mod:`gfaas.runtime.logs`); ``after`` keeps only lines with a larger ``seq``. ``NotFound`` for an
        unknown workflow."""
        ...

    def scaling_status(self, workflow: str) -> dict[str, Any]:
        """The workers of the current version's functions: ``{"workflow", "version", "functions":
        {name: {"warm", "idle", "busy", "starting", "queued", "target", "min", "max", "cold_starts",
        "worker_seconds", ...}}, "nodes": {...}}`` (docs/autoscaling.md); ``NotFound`` if not deployed."""
        ...

    def queue_depths(self) -> dict[str, int]:
        """Requests waiting per function, keyed ``"workflow/function"``."""
        ...
