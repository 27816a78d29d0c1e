"""The native extension (``gfaas_native``, built from ``native/`` by ``make setup``), loaded once.

One place for what the simulator's kernel and network (``gfaas.sim``) and the router
(``gfaas.policy.routing_native``) share: each asks for its class here and falls back to its pure-Python
reference when the extension, or that class, is missing (docs/design/native-core.md). A leaf module,
so the policy package may use it.
"""

from __future__ import annotations

import importlib
from typing import Any

try:
    _module: Any = importlib.import_module("gfaas_native")
except ImportError:
    _module = None


def native_class(name: str) -> Any:
    """The extension's class ``name`` (``Kernel``, ``FluidNetwork``, ``RouterCore``), or None when the
    extension is not built here or predates that class."""
    return getattr(_module, name, None)
