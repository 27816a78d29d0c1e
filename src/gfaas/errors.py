"""The one exception tree of gfaas.

Every error names the bad value and says what to do about it. Errors that cross the daemon's
socket travel as ``(code, message)`` where ``code`` is the class name; :func:`error_from_code`
turns them back into the same class on the client side.
"""

from __future__ import annotations


class GfaasError(Exception):
    """Base class of every error gfaas raises on purpose."""


class ConfigError(GfaasError, ValueError):
    """A configuration value is out of range or inconsistent."""


class DependencyMissing(GfaasError, ImportError):
    """An optional extra (gpu, torch, ray, server) is needed but not installed."""


class ProtocolError(GfaasError):
    """A message on the wire is malformed, truncated, oversize or of an unknown type."""


class DataPlaneError(GfaasError):
    """Base class of errors about stored objects and the node daemon."""


class InvalidDataRef(DataPlaneError, ValueError):
    """A data reference string or ID does not parse."""


class AuthenticationError(DataPlaneError):
    """Credentials (invocation token or admin token) are unknown, revoked or malformed."""


class AccessDenied(DataPlaneError):
    """The caller may not use this object.

    Raised identically whether the object exists elsewhere or not, so that IDs leak nothing.
    """


class DataDeleted(DataPlaneError):
    """The object was freed: deleted, or read by all of its declared consumers."""


class DataLost(DataPlaneError):
    """The object existed but its storage was lost (its node daemon restarted or died)."""


class CapacityError(DataPlaneError):
    """The pool cannot hold the object (too large, or not enough free space)."""


class QuotaExceeded(CapacityError):
    """An invocation reached one of its per-invocation quotas on a node (the message names it)."""


class ObjectStateError(DataPlaneError):
    """The object is in the wrong state for the call (e.g. sealing twice, writing after seal)."""


class DaemonUnavailable(DataPlaneError):
    """The node daemon cannot be reached, or the connection to it broke."""


class RemoteError(DataPlaneError):
    """A transfer from another node failed."""


class WorkflowError(GfaasError):
    """Base class of errors about workflow specs, deployments and invocations."""


class SpecError(WorkflowError, ConfigError):
    """A workflow spec is malformed or inconsistent (cycle, unknown function or handler, type mismatch)."""


class CodePackageError(SpecError):
    """A workflow's code package is refused (not an archive, a path escaping it, a link, over a limit)."""


class FunctionFailed(WorkflowError):
    """A function's handler raised, returned something invalid, or its worker died mid-invocation."""


class MachineRefused(FunctionFailed):
    """A function's worker could not start because of its machine's set-up, not the function's code
    (a Ray node that cannot run a code package sandboxed)."""


class NotFound(WorkflowError):
    """No workflow, invocation or model of that name is known here."""


class Overloaded(WorkflowError):
    """A queue is full: the request was refused, not lost; retry later or raise the limit."""


class DedupError(GfaasError):
    """Page merging or shared loading failed (see gfaas.dedup)."""


class DedupRefused(DedupError):
    """A merge hint was refused (another sharing domain is active on the node, or merging is off)."""


class ScalingError(GfaasError):
    """The real scaling testbed failed: network namespaces cannot be made here (they need root and
    iproute2), or a node process reported an error or exited."""


_BY_CODE: dict[str, type[GfaasError]] = {
    cls.__name__: cls
    for cls in (
        GfaasError,
        ConfigError,
        DependencyMissing,
        ProtocolError,
        DataPlaneError,
        InvalidDataRef,
        AuthenticationError,
        AccessDenied,
        DataDeleted,
        DataLost,
        CapacityError,
        QuotaExceeded,
        ObjectStateError,
        DaemonUnavailable,
        RemoteError,
        WorkflowError,
        SpecError,
        FunctionFailed,
        NotFound,
        Overloaded,
        ScalingError,
        DedupError,
        DedupRefused,
    )
}


def error_from_code(code: str, message: str) -> GfaasError:
    """Rebuild an error received from the daemon; unknown codes become :class:`DataPlaneError`."""
    return _BY_CODE.get(code, DataPlaneError)(message)


def code_of(exc: BaseException) -> str:
    """The wire code of an error: its class name if it is one of ours, else ``DataPlaneError``."""
    name = type(exc).__name__
    return name if name in _BY_CODE else "DataPlaneError"


def require_extra(module: str, extra: str) -> object:
    """Import an optional module or raise :class:`DependencyMissing` naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise DependencyMissing(
            f"{module!r} is not installed; install the extra with: pip install 'gfaas[{extra}]'"
        ) from exc
