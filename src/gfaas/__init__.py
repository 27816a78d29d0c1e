"""gfaas: a serverless inference platform for GPU clusters.

The public surface is what this module exports (pinned by ``tests/unit/test_public_api.py``).
"""

from .clock import Clock, ManualClock, WallClock
from .config import NodeConfig
from .dataplane import (
    Admin,
    Buffer,
    Client,
    Credentials,
    DataRef,
    DeviceBuffer,
    DeviceView,
    InvocationHandle,
    connect,
)
from .errors import (
    AccessDenied,
    AuthenticationError,
    CapacityError,
    ConfigError,
    DaemonUnavailable,
    DataDeleted,
    DataLost,
    DataPlaneError,
    DependencyMissing,
    FunctionFailed,
    GfaasError,
    InvalidDataRef,
    NotFound,
    ObjectStateError,
    Overloaded,
    ProtocolError,
    RemoteError,
    SpecError,
    WorkflowError,
)
from .policy import DemandTracker, Plan, Router, RoutingOptions, StorageOptions, storage_policy
from .runtime import Breakdown, Context, InvocationResult
from .runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig
from .runtime.spec import WorkflowSpec
from .runtime.spec import load as load_workflow
from .runtime.spec import loads as loads_workflow
from .topology import Topology, preset

__version__ = "0.1.0"

# The HTTP gateway pulls in FastAPI, pydantic and httpx (~0.3 s): loaded on first use, not on import.
_LAZY = {
    "GatewayClient": ("gfaas.runtime.client_http", "GatewayClient"),
    "GatewayHTTPError": ("gfaas.runtime.client_http", "GatewayHTTPError"),
    "InvocationTimeout": ("gfaas.runtime.client_http", "InvocationTimeout"),
    "GatewayServer": ("gfaas.runtime.gateway", "GatewayServer"),
    "create_gateway_app": ("gfaas.runtime.gateway", "create_app"),
    "serve_gateway": ("gfaas.runtime.gateway", "serve"),
}


def __getattr__(name: str) -> object:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'gfaas' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


__all__ = [
    "AccessDenied",
    "Admin",
    "AuthenticationError",
    "Breakdown",
    "Buffer",
    "CapacityError",
    "Client",
    "Clock",
    "ConfigError",
    "Context",
    "Credentials",
    "DaemonUnavailable",
    "DataDeleted",
    "DataLost",
    "DataPlaneError",
    "DataRef",
    "DemandTracker",
    "DependencyMissing",
    "DeviceBuffer",
    "DeviceView",
    "FunctionFailed",
    "GatewayClient",
    "GatewayHTTPError",
    "GatewayServer",
    "GfaasError",
    "InvalidDataRef",
    "InvocationHandle",
    "InvocationResult",
    "InvocationTimeout",
    "LocalRuntime",
    "ManualClock",
    "NodeConfig",
    "NodeEndpoint",
    "NotFound",
    "ObjectStateError",
    "Overloaded",
    "Plan",
    "ProtocolError",
    "RemoteError",
    "Router",
    "RoutingOptions",
    "RuntimeConfig",
    "SpecError",
    "StorageOptions",
    "Topology",
    "WallClock",
    "WorkflowError",
    "WorkflowSpec",
    "__version__",
    "connect",
    "create_gateway_app",
    "load_workflow",
    "loads_workflow",
    "preset",
    "serve_gateway",
    "storage_policy",
]
