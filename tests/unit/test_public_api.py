"""Pin of the public surface of ``gfaas``: changing it must be a deliberate edit of this list."""

import importlib

import gfaas

PUBLIC = [
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


def test_all_is_pinned() -> None:
    """`gfaas.__all__` is exactly the pinned list of public names."""
    assert sorted(gfaas.__all__) == PUBLIC


def test_every_public_name_is_importable() -> None:
    """Every name in `__all__` resolves by attribute and by `from gfaas import name`."""
    mod = importlib.import_module("gfaas")
    for name in PUBLIC:
        assert hasattr(mod, name), name
        ns: dict[str, object] = {}
        exec(f"from gfaas import {name}", ns)
        assert ns[name] is getattr(mod, name)


def test_errors_form_one_tree() -> None:
    """Every public exception derives from GfaasError; data-plane errors from DataPlaneError."""
    dp = ["AccessDenied", "AuthenticationError", "CapacityError", "DaemonUnavailable", "DataDeleted",
          "DataLost", "InvalidDataRef", "ObjectStateError", "RemoteError"]
    for name in dp:
        assert issubclass(getattr(gfaas, name), gfaas.DataPlaneError), name
    for name in [*dp, "ConfigError", "DependencyMissing", "ProtocolError", "DataPlaneError", "ScalingError"]:
        assert issubclass(getattr(gfaas, name), gfaas.GfaasError), name
    assert issubclass(gfaas.InvalidDataRef, ValueError)
    assert issubclass(gfaas.ConfigError, ValueError)
    assert issubclass(gfaas.DependencyMissing, ImportError)


def test_version_is_a_string() -> None:
    """`__version__` matches the package metadata version."""
    from importlib.metadata import version

    assert gfaas.__version__ == version("gfaas")


def test_workflow_errors_form_their_branch() -> None:
    """Runtime errors derive from WorkflowError; a bad spec is also a ConfigError (a ValueError)."""
    for name in ["SpecError", "FunctionFailed", "NotFound", "Overloaded"]:
        assert issubclass(getattr(gfaas, name), gfaas.WorkflowError), name
        assert issubclass(getattr(gfaas, name), gfaas.GfaasError), name
    assert issubclass(gfaas.SpecError, gfaas.ConfigError)


def test_gateway_names_load_lazily() -> None:
    """`import gfaas` does not import FastAPI; the gateway names resolve on first use."""
    import subprocess
    import sys

    code = ("import sys, gfaas; assert 'fastapi' not in sys.modules; "
            "from gfaas import serve_gateway, GatewayClient; assert 'fastapi' in sys.modules; "
            "assert issubclass(gfaas.InvocationTimeout, (gfaas.GfaasError, TimeoutError))")
    subprocess.run([sys.executable, "-c", code], check=True)
    try:
        gfaas.NoSuchName  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:
        raise AssertionError("unknown attributes must raise AttributeError")
