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
    GfaasError,
    InvalidDataRef,
    ObjectStateError,
    ProtocolError,
    RemoteError,
)
from .policy import Plan, Router, RoutingOptions
from .topology import Topology, preset

__version__ = "0.1.0"

__all__ = [
    "AccessDenied",
    "Admin",
    "AuthenticationError",
    "Buffer",
    "CapacityError",
    "Client",
    "Clock",
    "ConfigError",
    "Credentials",
    "DaemonUnavailable",
    "DataDeleted",
    "DataLost",
    "DataPlaneError",
    "DataRef",
    "DependencyMissing",
    "GfaasError",
    "InvalidDataRef",
    "InvocationHandle",
    "ManualClock",
    "NodeConfig",
    "ObjectStateError",
    "Plan",
    "ProtocolError",
    "RemoteError",
    "Router",
    "RoutingOptions",
    "Topology",
    "WallClock",
    "__version__",
    "connect",
    "preset",
]
