"""The native extension (``gfaas_native``, built from ``native/`` by ``make setup``), loaded once.

One place for what the native parts share (the simulator's kernel, network, data plane and DAG
stepping, the router, the worker's task path): each asks for its class here and falls back to its
pure-Python reference when the extension, or that class, is missing, and each reads its switch
with :func:`choose` (docs/design/native-core.md). A leaf module, so the policy package may use it.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from .errors import ConfigError

try:
    _module: Any = importlib.import_module("gfaas_native")
except ImportError:
    _module = None


def native_class(name: str) -> Any:
    """The extension's class ``name`` (``Kernel``, ``FluidNetwork``, ``RouterCore``), or None when the
    extension is not built here or predates that class."""
    return getattr(_module, name, None)


def choose(var: str, available: bool, part: str) -> str:
    """``"native"`` or ``"python"``: what the environment variable ``var`` asks for, native by default
    where the extension has ``part`` (``available``). An unknown value, or ``native`` without the
    part, is a :class:`~gfaas.errors.ConfigError` that says how to fix it."""
    want = os.environ.get(var, "").strip().lower()
    if want not in ("", "native", "python"):
        raise ConfigError(f"{var}={want!r}: use 'native', 'python' or leave it unset (native where built)")
    if want == "python" or (want == "" and not available):
        return "python"
    if not available:
        raise ConfigError(f"{var}=native but gfaas_native is not installed here (or has no {part}): run "
                          f"`make setup` (needs cargo) or `pip install ./native`, or unset {var}")
    return "native"
