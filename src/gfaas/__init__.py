"""gfaas: a serverless inference platform for GPU clusters.

The public surface is what this module exports (pinned by ``tests/unit/test_public_api.py``).
Names are loaded on first use (PEP 562), so ``import gfaas`` and ``import gfaas.sim.kernel`` cost
almost nothing; ``tests/unit/test_import_cost.py`` bounds what they load.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> (module, attribute)
_EXPORTS: dict[str, tuple[str, str]] = {
    "AccelConfig": ("gfaas.accel.arch", "AccelConfig"),
    "AccessDenied": ("gfaas.errors", "AccessDenied"),
    "Admin": ("gfaas.dataplane", "Admin"),
    "AuthenticationError": ("gfaas.errors", "AuthenticationError"),
    "Breakdown": ("gfaas.runtime", "Breakdown"),
    "Buffer": ("gfaas.dataplane", "Buffer"),
    "CapacityError": ("gfaas.errors", "CapacityError"),
    "CodePackageError": ("gfaas.errors", "CodePackageError"),
    "Client": ("gfaas.dataplane", "Client"),
    "Clock": ("gfaas.clock", "Clock"),
    "ConfigError": ("gfaas.errors", "ConfigError"),
    "Context": ("gfaas.runtime", "Context"),
    "Credentials": ("gfaas.dataplane", "Credentials"),
    "DaemonUnavailable": ("gfaas.errors", "DaemonUnavailable"),
    "DataDeleted": ("gfaas.errors", "DataDeleted"),
    "DataLost": ("gfaas.errors", "DataLost"),
    "DataPlaneError": ("gfaas.errors", "DataPlaneError"),
    "DataRef": ("gfaas.dataplane", "DataRef"),
    "DedupError": ("gfaas.errors", "DedupError"),
    "DedupRefused": ("gfaas.errors", "DedupRefused"),
    "DemandTracker": ("gfaas.policy", "DemandTracker"),
    "DependencyMissing": ("gfaas.errors", "DependencyMissing"),
    "DeviceArray": ("gfaas.dataplane.device_array", "DeviceArray"),
    "DeviceBuffer": ("gfaas.dataplane", "DeviceBuffer"),
    "DeviceView": ("gfaas.dataplane", "DeviceView"),
    "FunctionFailed": ("gfaas.errors", "FunctionFailed"),
    "GatewayClient": ("gfaas.runtime.client_http", "GatewayClient"),
    "GatewayHTTPError": ("gfaas.runtime.client_http", "GatewayHTTPError"),
    "GatewayServer": ("gfaas.runtime.gateway", "GatewayServer"),
    "GatewayUnavailable": ("gfaas.runtime.client_http", "GatewayUnavailable"),
    "GfaasError": ("gfaas.errors", "GfaasError"),
    "InvalidDataRef": ("gfaas.errors", "InvalidDataRef"),
    "InvocationHandle": ("gfaas.dataplane", "InvocationHandle"),
    "InvocationResult": ("gfaas.runtime", "InvocationResult"),
    "InvocationTimeout": ("gfaas.runtime.client_http", "InvocationTimeout"),
    "LlamaConfig": ("gfaas.models.llm_config", "LlamaConfig"),
    "LlamaModel": ("gfaas.models.llm", "LlamaModel"),
    "LocalRuntime": ("gfaas.runtime.local", "LocalRuntime"),
    "ManualClock": ("gfaas.clock", "ManualClock"),
    "MergeController": ("gfaas.dedup.controller", "MergeController"),
    "NodeConfig": ("gfaas.config", "NodeConfig"),
    "NodeEndpoint": ("gfaas.runtime.local", "NodeEndpoint"),
    "NotFound": ("gfaas.errors", "NotFound"),
    "ObjectStateError": ("gfaas.errors", "ObjectStateError"),
    "Overloaded": ("gfaas.errors", "Overloaded"),
    "PipelinePlanner": ("gfaas.policy", "PipelinePlanner"),
    "Plan": ("gfaas.policy", "Plan"),
    "ProtocolError": ("gfaas.errors", "ProtocolError"),
    "RemoteError": ("gfaas.errors", "RemoteError"),
    "Router": ("gfaas.policy", "Router"),
    "RoutingOptions": ("gfaas.policy", "RoutingOptions"),
    "RuntimeConfig": ("gfaas.runtime.local", "RuntimeConfig"),
    "ScalingError": ("gfaas.errors", "ScalingError"),
    "Schedule": ("gfaas.policy.multicast", "Schedule"),
    "SpecError": ("gfaas.errors", "SpecError"),
    "StorageOptions": ("gfaas.policy", "StorageOptions"),
    "Topology": ("gfaas.topology", "Topology"),
    "Transfer": ("gfaas.policy.multicast", "Transfer"),
    "WallClock": ("gfaas.clock", "WallClock"),
    "WorkflowError": ("gfaas.errors", "WorkflowError"),
    "WorkflowSpec": ("gfaas.runtime.spec", "WorkflowSpec"),
    "compile_model": ("gfaas.accel.compiler", "compile_model"),
    "connect": ("gfaas.dataplane", "connect"),
    "create_gateway_app": ("gfaas.runtime.gateway", "create_app"),
    "load_shared": ("gfaas.dedup.shared", "load_shared"),
    "load_workflow": ("gfaas.runtime.spec", "load"),
    "loads_workflow": ("gfaas.runtime.spec", "loads"),
    "plan_multicast": ("gfaas.policy", "plan_multicast"),
    "preset": ("gfaas.topology", "preset"),
    "serve_gateway": ("gfaas.runtime.gateway", "serve"),
    "storage_policy": ("gfaas.policy", "storage_policy"),
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on demand
    from .accel.arch import AccelConfig
    from .accel.compiler import compile_model
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
    from .dataplane.device_array import DeviceArray
    from .dedup.controller import MergeController
    from .dedup.shared import load_shared
    from .errors import (
        AccessDenied,
        AuthenticationError,
        CapacityError,
        CodePackageError,
        ConfigError,
        DaemonUnavailable,
        DataDeleted,
        DataLost,
        DataPlaneError,
        DedupError,
        DedupRefused,
        DependencyMissing,
        FunctionFailed,
        GfaasError,
        InvalidDataRef,
        NotFound,
        ObjectStateError,
        Overloaded,
        ProtocolError,
        RemoteError,
        ScalingError,
        SpecError,
        WorkflowError,
    )
    from .models.llm import LlamaModel
    from .models.llm_config import LlamaConfig
    from .policy import (
        DemandTracker,
        PipelinePlanner,
        Plan,
        Router,
        RoutingOptions,
        StorageOptions,
        plan_multicast,
        storage_policy,
    )
    from .policy.multicast import Schedule, Transfer
    from .runtime import Breakdown, Context, InvocationResult
    from .runtime.client_http import GatewayClient, GatewayHTTPError, GatewayUnavailable, InvocationTimeout
    from .runtime.gateway import GatewayServer
    from .runtime.gateway import create_app as create_gateway_app
    from .runtime.gateway import serve as serve_gateway
    from .runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig
    from .runtime.spec import WorkflowSpec
    from .runtime.spec import load as load_workflow
    from .runtime.spec import loads as loads_workflow
    from .topology import Topology, preset


def __getattr__(name: str) -> object:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'gfaas' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "AccelConfig",
    "AccessDenied",
    "Admin",
    "AuthenticationError",
    "Breakdown",
    "Buffer",
    "CapacityError",
    "Client",
    "Clock",
    "CodePackageError",
    "ConfigError",
    "Context",
    "Credentials",
    "DaemonUnavailable",
    "DataDeleted",
    "DataLost",
    "DataPlaneError",
    "DataRef",
    "DedupError",
    "DedupRefused",
    "DemandTracker",
    "DependencyMissing",
    "DeviceArray",
    "DeviceBuffer",
    "DeviceView",
    "FunctionFailed",
    "GatewayClient",
    "GatewayHTTPError",
    "GatewayServer",
    "GatewayUnavailable",
    "GfaasError",
    "InvalidDataRef",
    "InvocationHandle",
    "InvocationResult",
    "InvocationTimeout",
    "LlamaConfig",
    "LlamaModel",
    "LocalRuntime",
    "ManualClock",
    "MergeController",
    "NodeConfig",
    "NodeEndpoint",
    "NotFound",
    "ObjectStateError",
    "Overloaded",
    "PipelinePlanner",
    "Plan",
    "ProtocolError",
    "RemoteError",
    "Router",
    "RoutingOptions",
    "RuntimeConfig",
    "ScalingError",
    "Schedule",
    "SpecError",
    "StorageOptions",
    "Topology",
    "Transfer",
    "WallClock",
    "WorkflowError",
    "WorkflowSpec",
    "__version__",
    "compile_model",
    "connect",
    "create_gateway_app",
    "load_shared",
    "load_workflow",
    "loads_workflow",
    "plan_multicast",
    "preset",
    "serve_gateway",
    "storage_policy",
]
