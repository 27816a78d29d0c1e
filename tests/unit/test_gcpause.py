"""freeze_startup: what exists when a server starts serving leaves the collector's generations;
QuietCollector: full collections when the server is quiet, with backstops, and young ones paced by the clock."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import pytest

from gfaas.gcpause import QuietCollector, freeze_startup, full_collection_due


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


@pytest.mark.parametrize(("kw", "why"), [
    ({"quiet": True}, "quiet"),
    ({"quiet": True, "young_since": 9}, None),  # nothing new reached the oldest generation
    ({"quiet": False}, None),
    ({"quiet": False, "tracked": 400_001, "tracked_after": 100_000}, "grew to 400001"),
    ({"quiet": False, "tracked": 399_999, "tracked_after": 100_000}, None),  # under 4x
    ({"quiet": False, "tracked": 249_000, "tracked_after": 10_000}, None),  # under the floor
    ({"quiet": False, "since_s": 600.0}, "none for 600 s"),
])
def test_a_full_collection_is_due_when_quiet_or_as_a_backstop(kw: dict[str, Any], why: str | None) -> None:
    args: dict[str, Any] = {"quiet": False, "young_since": 10, "tracked": None, "tracked_after": 50_000,
                            "since_s": 1.0} | kw
    got = full_collection_due(**args)
    assert (got is None) if why is None else (got is not None and why in got)


def test_the_collector_runs_full_collections_itself_and_gives_the_rule_back() -> None:
    saved = gc.get_threshold()
    busy = [True]
    now = [0.0]
    col = QuietCollector(lambda: not busy[0], clock=lambda: now[0], size_every_s=1e9, young_every_s=0).start()
    try:
        assert gc.get_threshold()[:2] == (400, 4) and gc.get_threshold()[2] > 10**6  # the rule is off
        fulls = gc.get_stats()[2]["collections"]
        for _ in range(12):
            gc.collect(1)  # young collections move survivors into the oldest generation
        now[0] = 5.0
        assert col.tick() is None and gc.get_stats()[2]["collections"] == fulls  # busy: none
        busy[0] = False
        assert col.tick() == "quiet" and gc.get_stats()[2]["collections"] == fulls + 1 and col.collections == 1
        assert col.tick() is None  # nothing new since
        busy[0] = True
        for _ in range(12):
            gc.collect(1)
        now[0] = 5.0 + 600
        assert col.tick() == "none for 600 s"
    finally:
        col.stop()
    assert gc.get_threshold() == saved


def test_a_failing_quiet_probe_counts_as_busy(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> bool:
        raise RuntimeError("probe")

    col = QuietCollector(broken, size_every_s=1e9, young_every_s=0).start()
    try:
        for _ in range(12):
            gc.collect(1)
        assert col.tick() is None and "quiet probe failed" in caplog.text
    finally:
        col.stop()


def test_young_collections_are_paced_by_the_clock_while_busy_and_not_when_quiet() -> None:
    """The pacer runs a young collection every ``young_every_s`` while the server is busy (each fourth
    of generation 1), none while it is quiet, and ends with :meth:`stop`: CPython's own rule counts
    deallocations of old objects too, so under steady load it let the youngest generation grow to
    tens of thousands of objects between collections."""
    busy = [True]
    seen: list[int] = []

    def cb(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and threading.current_thread().name == "gfaas-gc-pacer":
            seen.append(info["generation"])

    gc.callbacks.append(cb)
    col = QuietCollector(lambda: not busy[0], young_every_s=0.005, size_every_s=1e9).start()
    try:
        deadline = time.monotonic() + 10
        while len(seen) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen[:8] == [0, 0, 0, 1, 0, 0, 0, 1] and col.paced >= 8
        busy[0] = False
        time.sleep(0.1)  # one under way ends
        n = len(seen)
        time.sleep(0.4)
        assert len(seen) == n  # quiet: none
    finally:
        col.stop()
        gc.callbacks.remove(cb)
    assert not any(t.name == "gfaas-gc-pacer" for t in threading.enumerate())
