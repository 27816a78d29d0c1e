"""Which functions of a workflow run one after another in the same warm worker: chains.

A step of an invocation costs a message to a worker and one back, plus the invoker's work between
them. When a function ``b`` reads from ``a`` alone, and nothing else reads ``a``, ``b`` can only start
once ``a`` is done and nothing else waits for ``a``: running ``b`` in ``a``'s worker right after it
saves a round trip and an invoker step, and delays nothing. The worker then answers for both.

:func:`chains` decides this from a workflow's shape alone; the runtime adds, per call, what only it
knows (``b``'s inputs arrive as values small enough to carry, ``a``'s outputs came back that way).
A function joins ``a``'s chain only when it

* reads from ``a`` and from no other function (the request's inputs are fine), with no ``when:``
  condition (a condition is the invoker's to decide, on ``a``'s scalars);
* is the only function that reads any output of ``a`` (another reader would wait for ``b`` too);
* is in ``a``'s group: the same tenant, node, device and reservation, so running it in ``a``'s
  worker changes no isolation boundary and no resource ledger;
* and both are ``fusable``: CPU functions with no model, no accelerator and no ``scaling:`` of their
  own (a function that asks to be scaled on its own keeps its own workers).

Chains compose: with ``a -> b -> c`` as above, ``a``'s worker runs ``b`` and then ``c``, and ``b``'s
(when ``b`` runs on its own) runs ``c``. Pure: no clock, I/O or threads (``docs/design/request-path.md``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One function as :func:`chains` sees it."""

    name: str
    sources: tuple[str, ...]  # the functions it reads from (the request's inputs not counted), no repeats
    gated: bool  # a ``when:`` condition on any input
    fusable: bool  # may share a worker with its neighbours (see the module docstring)
    group: Hashable  # stages fuse only within one group (tenant, node, device, reservation)


def chains(stages: Sequence[Stage]) -> dict[str, tuple[str, ...]]:
    """Per function that has followers: the functions its worker runs after it, in order.

    ``ValueError`` for a stage that names an unknown source (the caller's spec is checked already)."""
    by_name = {s.name: s for s in stages}
    readers: dict[str, list[str]] = {s.name: [] for s in stages}
    for s in stages:
        for src in s.sources:
            if src not in readers:
                raise ValueError(f"stage {s.name!r} reads from unknown stage {src!r}")
            readers[src].append(s.name)
    follower: dict[str, str] = {}
    for s in stages:
        if len(s.sources) != 1 or s.gated or not s.fusable:
            continue
        a = by_name[s.sources[0]]
        if a.fusable and a.group == s.group and readers[a.name] == [s.name]:
            follower[a.name] = s.name
    out: dict[str, tuple[str, ...]] = {}
    for head in follower:
        chain: list[str] = []
        nxt = follower.get(head)
        while nxt is not None:  # a DAG: a chain cannot come back to its head
            chain.append(nxt)
            nxt = follower.get(nxt)
        out[head] = tuple(chain)
    return out
