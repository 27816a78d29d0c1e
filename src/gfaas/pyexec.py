"""Command lines that run one of gfaas's modules in a child Python, safely.

``python -m MODULE`` puts the working directory first on ``sys.path``: a platform process started as
root from a directory others can write (a shared checkout, ``/tmp``) would import any module planted
there, such as a ``msgspec.py``, before its own. So every process gfaas starts runs in an isolated
interpreter (``-I``: no working directory or script directory on ``sys.path``, no ``PYTHON*``
environment, no user site directory), with ``sys.path`` given explicitly: the directory this ``gfaas``
was imported from, then the ``PYTHONPATH`` entries of the starting process, made absolute (the
operator's own choice, kept).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["module_argv", "search_path"]


def search_path(env: dict[str, str] | None = None) -> list[str]:
    """The ``sys.path`` head a child gets: gfaas's own directory, then ``PYTHONPATH`` (absolute)."""
    paths = [str(Path(__file__).resolve().parents[1])]
    for p in (os.environ if env is None else env).get("PYTHONPATH", "").split(os.pathsep):
        if p:
            a = os.path.abspath(p)
            if a not in paths:
                paths.append(a)
    return paths


def module_argv(module: str, *args: str) -> list[str]:
    """What ``python -m module args`` does, in an isolated interpreter (see the module docstring)."""
    code = (f"import runpy, sys; sys.path[:0] = {search_path()!r}; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-I", "-c", code, *args]
