"""Which node runs a function's call, and which queued call a worker takes: data locality across nodes.

A function whose workers may run on several nodes (a Ray cluster, issue 20) should run each call
where its inputs already are, so that the fewest bytes cross the network. Two decisions, both pure:

* :func:`choose_node`: the node for a new worker (or the node a call prefers): the candidate that
  holds the most of the call's input bytes; ties (no inputs anywhere, or equal shares) go to the
  node with the fewest workers of the function, then to the earlier candidate. Nodes that are down
  are not candidates (the caller leaves them out).
* :func:`pick_call`: which of the first ``lookahead`` queued calls a free worker on ``node`` takes:
  the oldest one that prefers its node, else the oldest one no free worker on its preferred node
  will take. A worker leaves a call only to a free worker where its inputs are, so no call waits
  while a worker that could run it idles.

The runtime feeds them the byte counts the global directory holds for each input
(:mod:`gfaas.dataplane.directory`) and its workers per node; the simulator places a CPU function of
a replica spread over nodes by :func:`choose_node` on its in-edges' bytes (:mod:`gfaas.sim.cluster`).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import TypeVar

N = TypeVar("N", bound=Hashable)  # a node's name (the runtime) or index (the simulator)

LOOKAHEAD = 16  # queued calls a free worker looks through for one whose inputs are on its node


def choose_node(candidates: Sequence[N], input_bytes: Mapping[N, int],
                workers: Mapping[N, int] | None = None) -> N:
    """The candidate holding most input bytes; then fewest ``workers``; then candidate order.

    ``ValueError`` without candidates (the caller says why none is left)."""
    if not candidates:
        raise ValueError("no candidate node")
    load = workers or {}
    order = {n: k for k, n in enumerate(candidates)}
    return min(candidates, key=lambda n: (-input_bytes.get(n, 0), load.get(n, 0), order[n]))


def pick_call(node: str, preferred: Sequence[str | None], idle: Collection[str] = (),
              lookahead: int = LOOKAHEAD) -> int | None:
    """Index of the queued call a free worker on ``node`` takes; ``preferred[k]`` is the node the
    k-th oldest call prefers (None: none). ``idle``: nodes with a free worker of the function now.

    The oldest call that prefers ``node``; else the oldest whose preferred node has no free worker
    (it would wait); else None: every call in view is better served by a free worker elsewhere."""
    window = preferred[:lookahead]
    for k, want in enumerate(window):
        if want == node:
            return k
    for k, want in enumerate(window):
        if want is None or want not in idle:
            return k
    return None
