"""Keeping the garbage collector's full collections short in long-running processes.

CPython's cyclic collector walks every tracked object of the generations it collects. A server
holds hundreds of thousands of objects from its start (imported modules, FastAPI's app, numpy,
a function's model) that never become garbage, and a full collection walked them all: `gfaas serve`
paused 60-160 ms at a time under load, which was most of the refusals' p99 in `gfaas bench
overload` (docs/performance.md). :func:`freeze_startup` moves what exists at the end of start-up
into the permanent generation, so later collections walk only what requests create.
"""

from __future__ import annotations

import gc


def freeze_startup() -> None:
    """Collect start-up's garbage once, then exclude every surviving object from later collections.

    Call it once, where a process has finished starting and begins to serve. Objects frozen are never
    collected, so call it only after start-up's own temporary cycles are gone (the collect here)."""
    gc.collect()
    gc.freeze()
