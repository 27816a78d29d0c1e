"""Chunked, pipelined staging: the pure planner, the modelled timeline and the threaded engine."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfaas.dataplane.staging import (
    D2H,
    H2D,
    CopyEngine,
    EmulatedOps,
    MiB,
    StagingModel,
    StagingPlanner,
    model_timeline,
)
from gfaas.errors import ConfigError


def test_batches_of_five_two_streams_and_whole_chunk_slots() -> None:
    p = StagingPlanner(20 * MiB)
    p.add("a", 11 * MiB)
    first = p.plan(0.0)
    assert [(o.index, o.offset, o.nbytes, o.stream) for o in first] == [
        (i, i * 2 * MiB, 2 * MiB, i % 2) for i in range(5)]
    assert [o.slot for o in first] == [i * 2 * MiB for i in range(5)]
    second = p.plan(0.0)
    assert [(o.offset, o.nbytes) for o in second] == [(10 * MiB, MiB)]
    assert p.plan(0.0) == []  # nothing left to hand out
    assert [p.done(o) for o in first + second] == [False] * 5 + [True]


def test_a_full_ring_blocks_planning_until_slots_come_back() -> None:
    p = StagingPlanner(10 * MiB)
    p.add("a", 40 * MiB)
    batch = p.plan(0.0)
    assert len(batch) == 5 and not p.can_plan()
    for o in batch[:4]:
        p.done(o)
    assert not p.can_plan()  # one slot still in flight: a whole batch does not fit yet
    p.done(batch[4])
    assert len(p.plan(0.0)) == 5


def test_a_tight_newcomer_takes_the_next_batch() -> None:
    p = StagingPlanner(40 * MiB, capacity_gbps=10.0)
    p.add("bulk", 200 * MiB, deadline=math.inf)
    assert {o.transfer for o in p.plan(0.0)} == {"bulk"}
    p.add("urgent", 20 * MiB, deadline=0.01)  # needs 2.1 GB/s of 10
    nxt = p.plan(0.001)
    assert [o.transfer for o in nxt].count("urgent") >= 4


def test_bad_planner_settings() -> None:
    for kw in ({"ring_bytes": 7 * MiB}, {"ring_bytes": 4 * MiB}, {"streams": 0}, {"capacity_gbps": 0.0}):
        with pytest.raises(ConfigError):
            StagingPlanner(**kw)  # type: ignore[arg-type]
    p = StagingPlanner()
    with pytest.raises(ConfigError, match="nbytes=0"):
        p.add("x", 0)
    p.add("x", 1)
    with pytest.raises(ConfigError, match="already queued"):
        p.add("x", 1)


def test_modelled_h2d_overlaps_staging_with_the_link() -> None:
    # One stager at 20 GB/s, link 10 GB/s: the link is the bottleneck, so 64 MiB takes about
    # 64 MiB / 10 GB/s plus one chunk of staging (the pipeline's fill), not the sum of the two.
    m = StagingModel(link_gbps=10.0, stage_gbps=20.0, stagers=1, launch_s=0.0)
    p = StagingPlanner(20 * MiB)
    p.add("t", 64 * MiB)
    steps, finish = model_timeline(p, H2D, m)
    link = 64 * MiB / 10e9
    fill = 2 * MiB / 20e9
    assert finish["t"] == pytest.approx(link + fill, rel=1e-9)
    for a, b in zip(steps, steps[1:], strict=False):
        assert b.stage_start < a.dma_end  # chunk i+1 is staged while chunk i is on the link
        assert b.dma_start >= a.dma_end  # one link: chunks do not overlap on it


def test_modelled_d2h_stages_after_the_copy() -> None:
    m = StagingModel(link_gbps=10.0, stage_gbps=5.0, stagers=4, launch_s=0.0)
    p = StagingPlanner(20 * MiB)
    p.add("t", 4 * MiB)
    steps, finish = model_timeline(p, D2H, m)
    assert [s.stage_start == s.dma_end for s in steps] == [True, True]
    assert finish["t"] == pytest.approx(2 * (2 * MiB / 10e9) + 2 * MiB / 5e9)


def test_modelled_newcomer_finishes_early_under_contention() -> None:
    m = StagingModel(link_gbps=10.0, stage_gbps=40.0, stagers=4, launch_s=0.0)
    p = StagingPlanner(20 * MiB, capacity_gbps=10.0)
    arrivals = [(0.0, "bulk", 400 * MiB, math.inf), (0.002, "urgent", 40 * MiB, 0.012)]
    _, finish = model_timeline(p, H2D, m, arrivals)
    assert finish["urgent"] < 0.012 < finish["bulk"]
    # Alone, it would take 40 MiB / 10 GB/s = 4.2 ms; sharing fairly would take twice that.
    assert finish["urgent"] - 0.002 < 1.6 * 40 * MiB / 10e9


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.01), st.integers(1, 30 * MiB), st.floats(0.001, 1.0)), min_size=1,
                max_size=6))
def test_modelled_every_byte_moves_once_and_the_ring_never_overflows(jobs: list[tuple[float, int, float]]) -> None:
    p = StagingPlanner(20 * MiB)
    arrivals = [(t, i, n, t + d) for i, (t, n, d) in enumerate(jobs)]
    steps, finish = model_timeline(p, H2D, StagingModel(), arrivals)
    assert set(finish) == set(range(len(jobs)))
    for i, (_, n, _) in enumerate(jobs):
        mine = sorted((s.op.offset, s.op.nbytes) for s in steps if s.op.transfer == i)
        assert sum(b for _, b in mine) == n
        assert all(a + b == c for (a, b), (c, _) in zip(mine, mine[1:], strict=False))
    # At any chunk start, the chunks holding slots at that moment fit in the ring.
    for s in steps:
        held = [x for x in steps if x.stage_start <= s.stage_start < x.dma_end]
        assert len({x.op.slot for x in held}) == len(held) and len(held) * 2 * MiB <= 20 * MiB


def _engine(nbytes: int, ring: int = 10 * MiB) -> tuple[CopyEngine, EmulatedOps, bytearray]:
    dev = bytearray(nbytes)
    ops = EmulatedOps(dev, ring)
    return CopyEngine(StagingPlanner(ring), ops, time.monotonic, stagers=2), ops, dev


def test_engine_moves_bytes_both_ways_in_chunks() -> None:
    eng, ops, dev = _engine(32 * MiB)
    try:
        src = np.random.default_rng(1).integers(0, 255, 9 * MiB + 7, dtype=np.uint8)
        eng.copy(H2D, 4096, memoryview(src))
        assert bytes(dev[4096 : 4096 + src.nbytes]) == src.tobytes()
        out = np.zeros_like(src)
        eng.copy(D2H, 4096, memoryview(out))
        assert np.array_equal(out, src)
        h2d = [e for e in ops.log if e[0] == H2D]
        assert [e[3] for e in h2d] == [2 * MiB] * 4 + [MiB + 7]
        assert [e[4] for e in h2d] == [0, 1, 0, 1, 0]
        assert eng.batches == 2
    finally:
        eng.close()


def test_engine_serves_concurrent_callers_through_one_small_ring() -> None:
    eng, ops, dev = _engine(64 * MiB, ring=10 * MiB)
    rng = np.random.default_rng(2)
    parts = [rng.integers(0, 255, 7 * MiB + i, dtype=np.uint8) for i in range(6)]
    errors: list[BaseException] = []

    def put(i: int) -> None:
        try:
            eng.copy(H2D, i * 8 * MiB, memoryview(parts[i]))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        for i, part in enumerate(parts):
            assert bytes(dev[i * 8 * MiB : i * 8 * MiB + part.nbytes]) == part.tobytes()
        assert {e[1] for e in ops.log} <= set(range(0, 10 * MiB, 2 * MiB))
    finally:
        eng.close()


class _Broken(EmulatedOps):
    def launch(self, kind: str, slot: int, device_addr: int, nbytes: int, stream: int) -> object:
        raise RuntimeError("DMA failed: device lost")


class _SecondLaunchFails(EmulatedOps):
    """The first chunk's DMA is launched (and not finished until waited on); the second's launch fails."""

    def __init__(self, device: bytearray, ring_bytes: int) -> None:
        super().__init__(device, ring_bytes)
        self.launches = 0
        self.waited: list[object] = []

    def launch(self, kind: str, slot: int, device_addr: int, nbytes: int, stream: int) -> object:
        self.launches += 1
        if self.launches == 2:
            raise RuntimeError("DMA failed: invalid argument")
        return super().launch(kind, slot, device_addr, nbytes, stream)

    def wait(self, token: object) -> None:
        self.waited.append(token)


def test_a_failed_batch_waits_for_its_launched_chunks_before_the_ring_is_reused() -> None:
    """A launch failing mid-batch fails the copy, but the chunk launched before it still uses its
    ring slot: the engine waits for it before the next transfer is staged into that slot."""
    dev = bytearray(8 * MiB)
    ops = _SecondLaunchFails(dev, 10 * MiB)
    eng = CopyEngine(StagingPlanner(10 * MiB), ops, time.monotonic)
    try:
        with pytest.raises(RuntimeError, match="invalid argument"):
            eng.copy(H2D, 0, memoryview(bytearray(3 * MiB)))  # two chunks in one batch
        assert ops.waited == [1]  # the first chunk's token, before the caller heard of the failure
        eng.copy(H2D, 0, memoryview(b"\x07" * 100))
        assert dev[:100] == b"\x07" * 100
    finally:
        eng.close()


def test_a_failed_copy_fails_its_caller_and_the_engine_keeps_serving() -> None:
    dev = bytearray(8 * MiB)
    eng = CopyEngine(StagingPlanner(10 * MiB), _Broken(dev, 10 * MiB), time.monotonic)
    try:
        with pytest.raises(RuntimeError, match="device lost"):
            eng.copy(H2D, 0, memoryview(bytearray(3 * MiB)))
        eng.ops = EmulatedOps(dev, 10 * MiB)
        eng.copy(H2D, 0, memoryview(b"\x07" * 100))
        assert dev[:100] == b"\x07" * 100
    finally:
        eng.close()
    with pytest.raises(ConfigError, match="closed"):
        eng.copy(H2D, 0, memoryview(b"x"))


class _SlowStageOut(EmulatedOps):
    """Copies out of the ring take 30 ms each; records how many ran at once."""

    def __init__(self, device: bytearray, ring_bytes: int, fail: bool = False) -> None:
        super().__init__(device, ring_bytes)
        self.running = self.most = 0
        self.fail = fail
        self._count = threading.Lock()

    def stage_out(self, slot: int, dst: memoryview) -> None:
        with self._count:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.03)
            if self.fail:
                raise RuntimeError("host copy failed")
            super().stage_out(slot, dst)
        finally:
            with self._count:
                self.running -= 1


def test_d2h_copies_out_of_the_ring_run_in_parallel_and_bytes_arrive() -> None:
    """A GPU -> host transfer's ring-to-host copies run on the stager threads together, not one at
    a time on the engine's thread (which held D2H through the ring below pageable memory)."""
    src = np.random.default_rng(5).integers(0, 255, 10 * MiB + 3, dtype=np.uint8)
    dev = bytearray(src.tobytes())
    ops = _SlowStageOut(dev, 10 * MiB)
    eng = CopyEngine(StagingPlanner(10 * MiB), ops, time.monotonic, stagers=4)
    try:
        out = np.zeros_like(src)
        eng.copy(D2H, 0, memoryview(out))
        assert np.array_equal(out, src)
        assert ops.most >= 2  # several chunks' copies out of the ring at once (one at a time before)
    finally:
        eng.close()


def test_a_failed_copy_out_of_the_ring_fails_its_caller_and_the_engine_keeps_serving() -> None:
    dev = bytearray(8 * MiB)
    ops = _SlowStageOut(dev, 10 * MiB, fail=True)
    eng = CopyEngine(StagingPlanner(10 * MiB), ops, time.monotonic, stagers=4)
    try:
        with pytest.raises(RuntimeError, match="host copy failed"):
            eng.copy(D2H, 0, memoryview(bytearray(3 * MiB)))
        ops.fail = False
        out = bytearray(100)
        dev[:100] = b"\x05" * 100
        eng.copy(D2H, 0, memoryview(out))
        assert out == b"\x05" * 100
    finally:
        eng.close()
