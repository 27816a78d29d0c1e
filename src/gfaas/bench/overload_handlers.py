"""The workflow of ``gfaas bench overload`` (and ``gfaas bench ray-serve``'s gfaas side): the tiny
two-function workflow of :mod:`gfaas.workflows.tiny`, named ``overload``."""

from __future__ import annotations

from ..workflows.tiny import SPEC as _TINY
from ..workflows.tiny import expected_total, gen, red

#: The workflow both the HTTP rows and the embedded ``invoke_p50_us`` run (``n`` float32 elements).
SPEC = _TINY.replace("name: tiny", "name: overload", 1)
WORKFLOW = "overload"  # the name SPEC deploys as

__all__ = ["SPEC", "WORKFLOW", "expected_total", "gen", "red"]
