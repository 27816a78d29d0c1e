"""gfaas: a serverless inference platform for GPU clusters.

The public surface is what this module exports (pinned by ``tests/unit/test_public_api.py``).
"""

from .clock import Clock, ManualClock, WallClock
from .config import NodeConfig
from .dataplane import Admin, Buffer, Client, Credentials, DataRef, InvocationHandle, connect
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
from .policy import Plan, Router, RoutingOptions
from .runtime import Breakdown, Context, InvocationResult
from .runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig
from .runtime.spec import WorkflowSpec
from .runtime.spec import load as load_workflow
from .runtime.spec import loads as loads_workflow
from .topology import Topology, preset

__version__ = "0.1.0"

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
    "DependencyMissing",
    "FunctionFailed",
    "GfaasError",
    "InvalidDataRef",
    "InvocationHandle",
    "InvocationResult",
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
    "Topology",
    "WallClock",
    "WorkflowError",
    "WorkflowSpec",
    "__version__",
    "connect",
    "load_workflow",
    "loads_workflow",
    "preset",
]
