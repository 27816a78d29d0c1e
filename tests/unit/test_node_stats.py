"""The node's stats stream in-process (issue 19): ``nodestats.snapshot`` reports exactly what a pass
over every object would, from counters kept as objects are stored, moved between tiers and freed;
``object_info`` names the object's tier; bad references are errors that name the value."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from test_store_elastic import CAP, OBJ, Env, _devices  # pytest puts this directory on sys.path

from gfaas.config import MiB
from gfaas.dataplane import nodestats
from gfaas.dataplane.store import WRITING, Store
from gfaas.errors import CapacityError, InvalidDataRef, NotFound


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def tiers(store: Store) -> dict[str, tuple[int, int]]:
    """name -> (bytes_live, objects) as the snapshot reports them."""
    snap = nodestats.snapshot(store, "n0", 0)
    return {t.name: (t.bytes_live, t.objects) for t in snap.tiers}


def oracle(store: Store) -> dict[str, tuple[int, int]]:
    """The same figures the slow way: a pass over every object, placing each by its segment."""
    out: dict[str, list[int]] = {"host": [0, 0], **{f"gpu{k}": [0, 0] for k in store.devices}}
    if store.spill is not None:
        out["disk"] = [0, 0]
    for rec in store.objects.values():
        if rec.segment in store.spilled:
            name = "disk"
        else:
            dev = store.segments[rec.segment].device
            name = "host" if dev < 0 else f"gpu{dev}"
        out[name][0] += rec.nbytes
        out[name][1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def test_puts_and_an_eviction_to_disk_move_exact_bytes(env: Env) -> None:
    st = env.store
    assert tiers(st) == {"host": (0, 0), "disk": (0, 0)}
    objs = [env.put(OBJ, consumers=["c1"]) for _ in range(3)]
    assert tiers(st) == {"host": (3 * OBJ, 3), "disk": (0, 0)}
    env.put(OBJ, consumers=["c1"])  # a fourth does not fit under the cap: one goes to disk
    assert tiers(st) == {"host": (3 * OBJ, 3), "disk": (OBJ, 1)}
    snap = nodestats.snapshot(st, "n0", 5)
    host = snap.tiers[0]
    assert (host.name, host.bytes_reserved, host.capacity_bytes) == ("host", st.reserved, CAP)
    assert host.bytes_target == st.tiers.host_target
    c = snap.counters
    assert (c["evictions"], c["spills"], c["bytes_spilled"], c["restores"]) == (1, 1, OBJ, 0)
    assert (c["connections"], c["invocations"], c["writing"]) == (5, 1, 0)
    assert snap.links["disk-write"] == OBJ and snap.links["disk-read"] == 0
    assert snap.links["net-in"] == snap.links["net-out"] == 0
    for o in objs:  # each read frees it (its one consumer): the spilled one comes back first
        env.read("c1", o)
        st.settle()
    assert tiers(st) == oracle(st)
    c = nodestats.snapshot(st, "n0", 0).counters
    assert c["restores"] >= 1 and nodestats.snapshot(st, "n0", 0).links["disk-read"] == c["bytes_restored"] > 0


def test_the_counters_agree_with_a_pass_over_the_objects_after_any_sequence(tmp_path: Path) -> None:
    """Random puts, reads, deletes, objects left half-written and ends of invocations, with evictions
    to disk and restores on the way: after each step the book equals the oracle, and the totals equal
    ``Store.stats()`` (which sums over every object)."""
    env = Env(tmp_path)
    st = env.store
    rng = random.Random(19)
    live: list[bytes] = []
    for step in range(300):
        op = rng.random()
        if op < 0.45 or not live:
            n = rng.choice([100, 5000, OBJ, OBJ // 2, 0])
            try:
                live.append(env.put(n, consumers=rng.choice([None, ["c1"], ["c1", "c2"]])))
            except CapacityError:
                pass  # objects left half-written hold the pool: a refusal must leave the books right too
        elif op < 0.7:
            oid = rng.choice(live)
            if (rec := st.objects.get(oid)) is not None:
                env.read(rng.choice(sorted(rec.consumers or ("c1", "c2"))), oid)
        elif op < 0.85:
            oid = live.pop(rng.randrange(len(live)))
            if oid in st.objects:
                st.delete(env.s["p"], oid)
        elif op < 0.95:
            try:
                n = rng.choice([10, OBJ // 4])
                st.allocate(env.s["x"], n, "raw", [n], None)  # left writing
            except CapacityError:
                pass
        else:
            st.end_invocation(env.inv.id)
            env.inv = st.open_invocation("wf", ["p", "c1", "c2", "x"])
            env.s = {fn: st.connect(t) for fn, t in env.inv.tokens.items()}
            live.clear()
        if rng.random() < 0.5:
            st.settle()
        assert tiers(st) == oracle(st), f"step {step}"
        stats = st.stats()
        snap = nodestats.snapshot(st, "n0", 0)
        assert sum(t.bytes_live for t in snap.tiers) == stats["bytes_live"]
        assert sum(t.objects for t in snap.tiers) == stats["objects"] + stats["writing"]
        assert snap.counters["writing"] == stats["writing"] == sum(r.state == WRITING for r in st.objects.values())
    assert nodestats.snapshot(st, "n0", 0).counters["evictions"] > 0  # the sequence did exercise the disk tier


def test_gpu_tiers_and_their_links(tmp_path: Path) -> None:
    """GPU pools are tiers of their own; an eviction to host memory is bytes over d2h, one to a faster peer
    bytes over the peer link, a restore bytes over h2d."""
    devs = _devices(peer_gbps=100.0)
    env = Env(tmp_path, devices=devs, capacity_bytes=16 * MiB, device_pool_floor_bytes=0)
    st = env.store
    objs = [env.put(2 * MiB, consumers=["c1"], device=0) for _ in range(4)]
    assert tiers(st)["gpu0"] == (8 * MiB, 4) and tiers(st)["gpu1"] == (0, 0)
    snap = nodestats.snapshot(st, "n0", 0)
    gpu0 = next(t for t in snap.tiers if t.name == "gpu0")
    assert (gpu0.bytes_reserved, gpu0.capacity_bytes, gpu0.bytes_target) == (devs[0].pool.held, 8 * MiB,
                                                                              devs[0].pool.target)
    objs.append(env.put(2 * MiB, consumers=["c1"], device=0))  # GPU 0 is full: one goes to GPU 1
    assert tiers(st)["gpu0"] == (8 * MiB, 4) and tiers(st)["gpu1"] == (2 * MiB, 1)
    snap = nodestats.snapshot(st, "n0", 0)
    assert snap.links["peer:gpu0->gpu1"] == 2 * MiB and snap.counters["migrations"] == 1
    assert snap.links["h2d:gpu0"] == snap.links["d2h:gpu0"] == 0

    env2 = Env(tmp_path / "b", devices=_devices(), capacity_bytes=16 * MiB, device_pool_floor_bytes=0,
               storage_policy="no-migration")
    st2 = env2.store
    objs2 = [env2.put(2 * MiB, consumers=["c1"], device=0) for _ in range(5)]  # one goes to host memory
    assert tiers(st2)["gpu0"] == (8 * MiB, 4) and tiers(st2)["host"] == (2 * MiB, 1)
    assert nodestats.snapshot(st2, "n0", 0).links["d2h:gpu0"] == 2 * MiB
    away = next(o for o in objs2 if st2.segments[st2.objects[o].segment].device == -1)
    st2.get(env2.s["c1"], next(o for o in objs2 if o != away))  # frees a block on GPU 0 ...
    assert st2.resident(st2.objects[away], 0).device == 0  # ... and a read there brings it back over h2d
    assert tiers(st2) == oracle(st2) == {"host": (0, 0), "gpu0": (8 * MiB, 4), "gpu1": (0, 0), "disk": (0, 0)}
    assert nodestats.snapshot(st2, "n0", 0).links["h2d:gpu0"] == 2 * MiB


def test_object_info_names_the_tier_and_the_bad_value(env: Env) -> None:
    st = env.store
    oid = env.put(OBJ, consumers=["c1", "c2"])
    env.clock.advance(2.5)
    info = nodestats.object_info(st, oid)
    assert (info.id, info.producer, info.consumers, info.readers_left) == (oid, "p", ["c1", "c2"], ["c1", "c2"])
    assert (info.nbytes, info.tier, info.state, info.invocation, info.age_s) == (OBJ, "host", "sealed", env.inv.id, 2.5)
    env.read("c1", oid)
    assert nodestats.object_info(st, oid).readers_left == ["c2"]
    objs = [oid] + [env.put(OBJ, consumers=["c1"]) for _ in range(3)]
    down = [o for o in objs if env.on_disk(o)]
    assert len(down) == 1 and nodestats.object_info(st, down[0]).tier == "disk"
    assert {nodestats.object_info(st, o).tier for o in objs if o != down[0]} == {"host"}
    with pytest.raises(InvalidDataRef, match="object ID 0102 is not 16 bytes"):
        nodestats.object_info(st, b"\x01\x02")
    with pytest.raises(InvalidDataRef, match="'zz'"):
        nodestats.object_info(st, "zz")
    gone = bytes(16)
    with pytest.raises(NotFound, match=f"object {gone.hex()} is not on node n0"):
        nodestats.object_info(st, gone)


def test_a_snapshot_reads_no_object(env: Env, monkeypatch: Any) -> None:
    """O(tiers), not O(objects): the snapshot never iterates the store's objects or segments."""
    for _ in range(5):
        env.put(100, consumers=["c1"])

    class NoIteration(dict):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            raise AssertionError("snapshot iterated a per-object table")

        def values(self) -> Any:
            raise AssertionError("snapshot iterated a per-object table")

        def items(self) -> Any:
            raise AssertionError("snapshot iterated a per-object table")

    monkeypatch.setattr(env.store, "objects", NoIteration(env.store.objects))
    monkeypatch.setattr(env.store, "segments", NoIteration(env.store.segments))
    snap = nodestats.snapshot(env.store, "n0", 0)
    assert snap.tiers[0].objects == 5 and snap.tiers[0].bytes_live == 500
