"""Which workflows the invoker's lane can run: pure, worked out once per spec.

The lane (:meth:`Invoker.invoke <gfaas.runtime.invoker.Invoker.invoke>`) is the embedded call's
shortcut for the case that dominates a closed loop of small invocations: nothing else is unresolved,
every input rides in the task, and one warm worker runs the whole workflow (its first function, then
the others as a chain, :mod:`gfaas.policy.fusion`). The caller then claims that worker, sends one
task, reads the one reply from that worker's socket itself, and makes the result from it, without the
general path's per-step machinery (a pool's queue, the loop's reads over every worker, a step per
reply) or its per-invocation state. Its outcome is the general path's: the same DAG decisions (the
plan below is what :class:`~.dag.DagState` decides for every invocation of the spec, so the lane does
not step one per call), records and result; anything else (a failure, a reply that does not check
out, a request for the data plane, a long wait) is handed to the general path as it stands, which
makes the invocation's state then and takes it from there.

Whether a spec qualifies does not depend on any reply: no ``when:`` condition (nothing can be
skipped), exactly one function ready at the start, and each function of its chain made ready by the
one before alone, the last completing the DAG. :func:`lane_plan` checks that by stepping a
:class:`DagState` once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .dag import DagState
from .spec import WorkflowSpec


@dataclass(frozen=True)
class LanePlan:
    """A workflow the lane can run: ``head`` first, then ``chain`` in its worker, in this order."""

    spec: WorkflowSpec
    head: str
    chain: tuple[str, ...]

    @property
    def functions(self) -> tuple[str, ...]:
        return (self.head, *self.chain)


def lane_plan(spec: WorkflowSpec, follow: Callable[[str], tuple[str, ...]]) -> LanePlan | None:
    """The lane's plan for ``spec`` (``follow(fn)``: the chain a worker of ``fn`` runs after it,
    ``Deployments.follow``), or None when its invocations take the general path."""
    if any(i.when is not None for f in spec.functions for i in f.inputs):
        return None
    dag = DagState(spec)
    ready, skipped = dag.start()
    if len(ready) != 1 or skipped:
        return None
    head = ready[0]
    chain = tuple(follow(head))
    fn = head
    for nxt in chain:
        ready, skipped = dag.finished(fn, {})
        if ready != [nxt] or skipped:
            return None
        fn = nxt
    ready, skipped = dag.finished(fn, {})
    if ready or skipped or not dag.complete:
        return None
    return LanePlan(spec, head, chain)
