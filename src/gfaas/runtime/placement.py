"""Which GPU each GPU function of a workflow runs on: the same decision in the runtime and the simulator.

Both executors describe a workflow to :func:`gfaas.policy.place_workflow` the same way, through
:func:`function_edges`: the bytes each function sends each other function per invocation, summed
over its outputs. Sizes come from a measurement when there is one (the reference workflows'
``gfaas/workflows/edge_sizes.json``), else from the spec's declared static shapes, else 1 byte
(which still keeps connected functions together).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..policy import place_workflow
from ..topology import Topology
from .spec import WorkflowSpec

#: One row of ``edge_sizes.json``: ``{"from": "fn.output", "to": "fn.input", "nbytes": N}``.
SizeRow = Mapping[str, Any]


def _declared_bytes(spec: WorkflowSpec, function: str, output: str) -> int | None:
    t = spec.function(function).outputs.get(output)
    if t is None or t.dtype is None or t.shape is None or any(d < 0 for d in t.shape):
        return None
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize


def function_edges(spec: WorkflowSpec, sizes: Sequence[SizeRow] | None = None,
                   strict: bool = False) -> list[tuple[str, str, int]]:
    """``(producer, consumer, bytes)`` for every pair of functions with data between them.

    ``strict``: every edge must be measured in ``sizes`` (the simulator's reference workflows);
    otherwise declared shapes, then 1 byte, stand in for missing measurements.
    """
    measured = {(r["from"], r["to"]): int(r["nbytes"]) for r in sizes or ()}
    pair: dict[tuple[str, str], int] = {}
    for f in spec.functions:
        for i in f.inputs:
            if i.from_workflow:
                continue
            key = (f"{i.source}.{i.output}", f"{f.name}.{i.name}")
            n = measured.get(key)
            if n is None:
                if strict:
                    raise ConfigError(f"workflow {spec.name!r}: no measured size for edge {key[0]} -> {key[1]}; "
                                      "regenerate gfaas/workflows/edge_sizes.json (python -m gfaas.workflows.sizes --json)")
                n = _declared_bytes(spec, i.source, i.output) or 1
            pair[(i.source, f.name)] = pair.get((i.source, f.name), 0) + n
    return [(u, v, n) for (u, v), n in pair.items()]


def place_gpu_functions(spec: WorkflowSpec, topology: Topology, free: Sequence[str],
                        sizes: Sequence[SizeRow] | None = None) -> dict[str, str]:
    """The GPU of each ``kind: gpu`` function among ``free`` (GPUs of one node), by
    :func:`~gfaas.policy.place_workflow` on the edges between those functions."""
    fns = [f.name for f in spec.functions if f.kind == "gpu"]
    edges = [(u, v, n) for u, v, n in function_edges(spec, sizes) if u in fns and v in fns]
    return place_workflow(topology, fns, edges, free)
