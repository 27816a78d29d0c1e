"""freeze_startup: what exists when a server starts serving leaves the collector's generations."""

from __future__ import annotations

import gc
import weakref

from gfaas.gcpause import freeze_startup


def test_startup_objects_are_frozen_and_garbage_is_collected_first() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

    gc.unfreeze()
    try:
        kept = [Node() for _ in range(100)]
        garbage = Node()
        gone = weakref.ref(garbage)
        del garbage
        freeze_startup()
        frozen = gc.get_freeze_count()
        assert frozen >= 100 + len(kept)
        assert all(not any(o is k for o in gc.get_objects()) for k in kept[:3])  # no generation holds them
        assert gone() is None  # collected before the freeze, not frozen for good
    finally:
        gc.unfreeze()
