"""Makes this interpreter look like the GPU machine's image: third-party packages not on it do not import.

Put this folder first on ``PYTHONPATH`` and set ``GFAAS_SIM_IMAGE`` to a comma-separated list of the
top-level packages the image has (e.g. ``numpy,yaml,_yaml,pytest,_pytest,pluggy,iniconfig,packaging``);
every other module found in a ``site-packages`` or ``dist-packages`` folder then raises
``ModuleNotFoundError`` as it would there, and folders that ``.pth`` files put on ``sys.path`` from
outside the environment (an editable install of gfaas) are dropped: the image has no gfaas installed.
The standard library and ``PYTHONPATH`` folders (``src``, a ``--target`` folder of carried wheels) are
untouched. Used by tests/integration/test_gpu_env.py.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from typing import Any

_ALLOWED = {n.strip() for n in os.environ.get("GFAAS_SIM_IMAGE", "").split(",") if n.strip()}
_SITE_DIRS = tuple(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))


class _HideSitePackages:
    """A meta-path finder placed first: refuses top-level names that only site-packages would provide."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if path is not None or name in _ALLOWED or name in sys.builtin_module_names:
            return None  # submodules follow their (allowed) parent; builtins stay
        spec = importlib.machinery.PathFinder.find_spec(name)
        origin = (spec.origin or "") if spec is not None else ""
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        if any(str(p).startswith(_SITE_DIRS) for p in [origin, *locations] if p):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden: not on the simulated GPU image)",
                                      name=name)
        return None


if "GFAAS_SIM_IMAGE" in os.environ:
    _keep = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    sys.path[:] = [p for p in sys.path
                   if p in ("", os.getcwd(), *_keep) or p.startswith((sys.prefix, sys.base_prefix))]
    sys.meta_path.insert(0, _HideSitePackages())
