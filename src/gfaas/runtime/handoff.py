"""Which step's worker may hand its outputs straight to the next step's worker: one hop, not two.

A function's small outputs normally go back to the runtime in its reply, and the runtime sends them
on in the next function's task: two messages and the invoker's thread between the workers. When a
function's outputs have exactly one reader, which reads nothing but them and the request's inputs
and has no condition, the invoker (``Invoker._hand_off``) can claim an idle worker for that reader
as it sends the first task, with a socket pair between the two workers: the first worker sends its
carried outputs on it (``worker.hand_over``) as well as its reply to the runtime, and the second,
holding its task already, checks what comes as the runtime checks a reply (``worker.await_peer``)
and runs. Anything else (an output too large to carry, a failure, a message that is not what was
due) and the second worker returns its task, which then goes the usual way or fails the invocation.
"""

from __future__ import annotations

from .spec import WorkflowSpec

__all__ = ["next_step"]


def next_step(spec: WorkflowSpec, fn: str) -> str:
    """The one function whose worker may take ``fn``'s outputs straight from ``fn``'s worker, or ""."""
    readers: set[str] = set()
    outputs = set(spec.outputs.values())
    for out in spec.function(fn).outputs:
        if (fn, out) in outputs:
            return ""  # the caller reads it too: the runtime must have it
        readers.update(spec.readers(fn, out))
    if len(readers) != 1:
        return ""
    nxt = spec.function(next(iter(readers)))
    if nxt.accelerator or any(i.when is not None or not (i.from_workflow or i.source == fn) for i in nxt.inputs):
        return ""
    return nxt.name
