"""The measured per-edge sizes of the reference workflows (``edge_sizes.json``, made by
``python -m gfaas.workflows.sizes --json``): what the simulator and the runtime's placement use."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def edge_sizes() -> dict[str, list[dict[str, Any]]]:
    """Workflow -> its measured edges (rows ``{"from": "fn.out", "to": "fn.in", "nbytes": N, ...}``)."""
    text = (resources.files("gfaas.workflows") / "edge_sizes.json").read_text(encoding="utf-8")
    doc: dict[str, list[dict[str, Any]]] = json.loads(text)["workflows"]
    return doc


def edges(workflow: str) -> list[dict[str, Any]] | None:
    """``workflow``'s measured edges, or None for one that is not a reference workflow: what
    ``LocalRuntime(edge_sizes=...)`` takes to place GPU functions as the simulator does."""
    return edge_sizes().get(workflow)
