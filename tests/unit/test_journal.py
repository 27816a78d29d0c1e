"""The object journal: compacted while running, crash-safe at every step of a compaction."""

from __future__ import annotations

import os

import pytest

from gfaas.dataplane.journal import REC, Journal

LIVE, DEAD = "aa" * 16, "bb" * 16


def oid(i: int) -> bytes:
    return i.to_bytes(16, "big")


def fill(j: Journal, live: int, dead: int) -> dict[bytes, str]:
    """Append ``dead`` records of DEAD and ``live`` of LIVE, interleaved; returns the live ones."""
    want = {}
    for i in range(max(live, dead)):
        if i < dead:
            j.append(oid(10_000 + i), DEAD)
        if i < live:
            j.append(oid(i), LIVE)
            want[oid(i)] = LIVE
    return want


def test_retain_compacts_once_dead_records_outnumber_live_ones(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Dead records below ratio x live (or below compact_min) stay; past both, only live records remain
    and appends continue after them."""
    j = Journal(str(tmp_path / "j"), compact_ratio=2.0, compact_min=10)
    want = fill(j, live=10, dead=20)
    assert j.retain({LIVE}) is False and (j.records, j.dead) == (30, 20)  # 20 is not > 2 x 10
    for i in range(3):  # an ended invocation's records, appended after it was seen dead, count too
        j.append(oid(10_600 + i), DEAD)
    j.append(oid(10_501), "cc" * 16)
    assert j.retain({LIVE, "cc" * 16}) is True and j.compactions == 1  # 23 dead > 2 x 11 live
    assert (j.records, j.dead) == (11, 0)
    j.append(oid(99), LIVE)
    want.update({oid(10_501): "cc" * 16, oid(99): LIVE})
    assert Journal(j.path).load() == want
    assert os.path.getsize(j.path) % (1 << 20) == 0 and not os.path.exists(j.path + ".new")
    j.close()


def test_compaction_needs_compact_min_dead_records(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Few dead records are not worth a rewrite, however few the live ones."""
    j = Journal(str(tmp_path / "j"), compact_min=100)
    fill(j, live=1, dead=99)
    assert j.retain({LIVE}) is False and j.records == 100
    j.close()


@pytest.mark.parametrize("step", ["written", "synced", "renamed"])
def test_a_crash_at_any_step_of_compaction_loads_the_same_live_records(tmp_path, step: str) -> None:  # type: ignore[no-untyped-def]
    """A crash between writing, syncing and renaming the new file leaves a journal whose records of
    open invocations are exactly those before the compaction."""
    j = Journal(str(tmp_path / "j"), compact_min=1)
    want = fill(j, live=50, dead=500)

    def crash(name: str) -> None:
        if name == step:
            raise KeyboardInterrupt(f"crash after {name}")

    j._step = crash
    with pytest.raises(KeyboardInterrupt):
        j.retain({LIVE})
    loaded = Journal(j.path).load()
    assert {k: v for k, v in loaded.items() if v == LIVE} == want
    assert len(loaded) == (50 if step == "renamed" else 550)
    # A restarted daemon rewrites from what it loaded; a later compaction clears the leftover temp file.
    j2 = Journal(j.path, compact_min=1)
    j2.rewrite(loaded)
    assert j2.retain({LIVE}) is (step != "renamed") and Journal(j.path).load() == want
    assert not os.path.exists(j.path + ".new")
    j2.close()


def test_appends_after_a_failed_compaction_are_not_lost(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """If compaction fails before the rename, the journal keeps appending to the old file in place."""
    j = Journal(str(tmp_path / "j"), compact_min=1)
    want = fill(j, live=5, dead=50)

    def fail(name: str) -> None:
        if name == "synced":
            raise OSError(28, "No space left on device")

    j._step = fail
    with pytest.raises(OSError):
        j.retain({LIVE})
    j._step = lambda name: None
    j.append(oid(7777), LIVE)
    want[oid(7777)] = LIVE
    assert {k: v for k, v in Journal(j.path).load().items() if v == LIVE} == want
    assert j.records * REC == 56 * REC
    j.close()
