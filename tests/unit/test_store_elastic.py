"""The store's tiers driven in-process with a manual clock: host memory (real memfd segments, so
bytes can be compared) over a spill directory, and modelled GPU pools (null-gpu) over host memory.

Every eviction, restore and pool size here is decided by ``gfaas.policy.storage``; these tests pin
down that the store feeds it the right facts and carries out its answers exactly.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gfaas import AccessDenied, CapacityError, ConfigError, DataDeleted, ManualClock, NodeConfig
from gfaas.config import KiB, MiB
from gfaas.dataplane.backends import HostBackend, NullDeviceBackend
from gfaas.dataplane.spill import SpillDir
from gfaas.dataplane.store import SEALED, Store
from gfaas.errors import DataLost, NotFound

CAP = 1 * MiB
SLAB = 64 * KiB
OBJ = 300 * KiB  # three fit under the cap, a fourth needs an eviction


class Env:
    """A store on real shared memory with one invocation (p, c1, c2, x) and a session per function."""

    def __init__(self, tmp: Path, spill: bool = True, spill_dir: str | None = None,
                 devices: dict[int, Any] | None = None, **cfg: Any) -> None:
        kw: dict[str, Any] = {"node_id": "n0", "socket_path": "/tmp/unused.sock", "state_dir": str(tmp / "state"),
                              "capacity_bytes": CAP, "slab_bytes": SLAB, "ids_per_lease": 4}
        kw.update(cfg)
        self.config = NodeConfig(**kw)
        self.backend = HostBackend()
        self.clock = ManualClock(100.0)
        self.spill = SpillDir(spill_dir or self.config.spill_dir) if spill else None
        self.store = Store(self.config, self.backend, self.clock, spill=self.spill, devices=devices)
        self.inv = self.store.open_invocation("wf", ["p", "c1", "c2", "x"])
        self.s = {fn: self.store.connect(t) for fn, t in self.inv.tokens.items()}

    def put(self, nbytes: int = OBJ, consumers: list[str] | None = None, fill: int | None = None,
            device: int = -1) -> bytes:
        """allocate + write + seal, as a client's large put does; bytes are a pattern unless ``fill``."""
        self.clock.advance(1.0)
        rec, seg = self.store.allocate(self.s["p"], nbytes, "raw", [nbytes], consumers, device)
        if device < 0:
            view = self.backend.host_view(seg.handle)
            assert view is not None
            view[rec.offset : rec.offset + nbytes] = self.pattern(rec.id, nbytes) if fill is None else bytes([fill]) * nbytes
        self.store.seal(self.s["p"], rec.id)
        return rec.id

    @staticmethod
    def pattern(oid: bytes, nbytes: int) -> bytes:
        return (oid * (nbytes // len(oid) + 1))[:nbytes]

    def read(self, fn: str, oid: bytes) -> bytes:
        def export(rec: Any, seg: Any) -> bytes:
            view = self.backend.host_view(seg.handle)
            assert view is not None
            return bytes(view[rec.offset : rec.offset + rec.nbytes])

        self.clock.advance(1.0)
        out: bytes = self.store.get(self.s[fn], oid, export)
        return out

    def on_disk(self, oid: bytes) -> bool:
        return self.store.objects[oid].segment in self.store.spilled

    def disk_files(self) -> list[str]:
        assert self.spill is not None
        return sorted(os.listdir(self.spill.path)) if os.path.isdir(self.spill.path) else []


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


# ---- host memory -> disk ----------------------------------------------------------------------
def test_eviction_follows_queue_hints_furthest_back_first(env: Env) -> None:
    """Victims leave in the order of their consumers' queue positions, the furthest back first; an
    object whose consumer is not queued at all counts as furthest back."""
    st = env.store
    a, b, c = env.put(consumers=["c1"]), env.put(consumers=["c2"]), env.put(consumers=["x"])
    st.queue_hint(env.inv.id, {"c1": 0, "c2": 5, "x": 2})
    d = env.put(consumers=["x"])
    assert [env.on_disk(o) for o in (a, b, c, d)] == [False, True, False, False]
    e = env.put(consumers=["c1"])  # c and d tie (x at 2): the one stored last goes first
    assert [env.on_disk(o) for o in (a, b, c, d, e)] == [False, True, False, True, False]
    # c2 leaves the queue (unknown position): its objects go before any queued consumer's.
    st.queue_hint(env.inv.id, {"c1": 0, "x": 2})
    f = env.put(consumers=["c2"])  # evicts c (x at 2)
    g = env.put(consumers=["c1"])  # evicts f, whose reader is not queued
    assert [env.on_disk(o) for o in (a, c, e, f, g)] == [False, True, False, True, False]
    stats = st.stats()
    assert (stats["evictions"], stats["objects_on_disk"], stats["bytes_on_disk"]) == (4, 4, 4 * OBJ)
    assert stats["bytes_spilled"] == 4 * OBJ and stats["restores"] == 0
    assert st.reserved == 3 * OBJ <= CAP
    assert len(env.disk_files()) == 4


@pytest.mark.parametrize(("policy", "victim"), [("lru", "b"), ("gfaas", "a")])
def test_lru_evicts_least_recently_used_queue_policy_most_recently_stored(tmp_path: Path, policy: str,
                                                                          victim: str) -> None:
    """With no hints every position is unknown: ``gfaas`` then evicts the most recently touched
    (its request came last), ``lru`` the least recently used."""
    env = Env(tmp_path, storage_policy=policy)
    objs = {"a": env.put(consumers=["c1", "c2"]), "b": env.put(consumers=["c1", "c2"]),
            "c": env.put(consumers=["c1", "c2"])}
    env.read("c1", objs["a"])  # a is the most recently used now; b the least
    env.read("c1", objs["c"])
    env.read("c1", objs["a"])
    env.put(consumers=["c1"])
    assert [k for k, o in objs.items() if env.on_disk(o)] == [victim]


def test_objects_nobody_will_read_are_released_not_spilled(env: Env) -> None:
    """An object whose remaining consumers are all done goes first, and is dropped, not written."""
    st = env.store
    a, b, c = env.put(consumers=["c1"]), env.put(consumers=["c2", "x"]), env.put(consumers=["x"])
    env.read("c2", b)  # only x is left to read b
    st.queue_hint(env.inv.id, {"c1": 9, "x": 0}, done=["c2"])
    env.put(consumers=["c1"])
    assert b in st.objects and not env.on_disk(b) and env.on_disk(a)  # x still wants b: a (pos 9) goes
    st.queue_hint(env.inv.id, {"c1": 9}, done=["c2", "x"])  # x finished without reading b and c
    env.put(consumers=["c1"])  # b and c are unneeded: taken before a queued reader's object, dropped
    with pytest.raises(DataDeleted, match="none of its remaining consumers will read it"):
        st.get(env.s["x"], b)
    stats = st.stats()
    assert (stats["released_unread"], stats["evictions"], stats["objects_on_disk"]) == (1, 1, 1)
    assert c in st.objects and not env.on_disk(c)  # one release freed enough


def test_get_of_an_evicted_object_restores_identical_bytes(env: Env) -> None:
    """A get reads the object back from disk and returns exactly the bytes put; the cap may be
    overshot by that one segment until settle() evicts after the reply."""
    st = env.store
    objs = [env.put(consumers=["c1", "c2"]) for _ in range(3)]
    st.queue_hint(env.inv.id, {"c1": 0})
    objs.append(env.put(consumers=["c1", "c2"]))
    spilled = [o for o in objs if env.on_disk(o)]
    assert len(spilled) == 1
    oid = spilled[0]
    assert env.read("c1", oid) == Env.pattern(oid, OBJ)
    assert not env.on_disk(oid) and st.stats()["restores"] == 1 and st.stats()["bytes_restored"] == OBJ
    assert st.reserved == 4 * OBJ > CAP  # the get did not wait for another eviction
    st.settle()
    assert st.reserved == 3 * OBJ and st.stats()["evictions"] == 2
    for o in objs:
        assert env.read("c1", o) == Env.pattern(o, OBJ)
        st.settle()
    for o in objs:
        assert env.read("c2", o) == Env.pattern(o, OBJ)  # the last read frees each
        st.settle()
    assert st.objects == {} and st.spilled == {} and env.disk_files() == []


def test_freed_memory_brings_spilled_objects_back(env: Env) -> None:
    """When an object is freed, settle() restores spilled ones into the room, soonest reader first."""
    st = env.store
    st.queue_hint(env.inv.id, {"c1": 0, "c2": 3, "x": 7})
    a, b, c = env.put(consumers=["c1"]), env.put(consumers=["c2"]), env.put(consumers=["x"])
    d = env.put(consumers=["c1"])
    e = env.put(consumers=["c2"])
    assert [env.on_disk(o) for o in (a, b, c, d, e)] == [False, True, True, False, False]
    assert env.read("c1", a) == Env.pattern(a, OBJ)  # frees a; b (position 3) comes back, not c (7)
    assert env.on_disk(b)
    st.settle()
    assert not env.on_disk(b) and env.on_disk(c)
    assert st.stats()["restores"] == 1 and len(env.disk_files()) == 1
    assert env.read("c2", b) == Env.pattern(b, OBJ)


def test_no_restore_policy_leaves_objects_on_disk_until_read(tmp_path: Path) -> None:
    env = Env(tmp_path, storage_policy="queue-no-restore")
    st = env.store
    a, b, c = env.put(consumers=["c1"]), env.put(consumers=["c2"]), env.put(consumers=["x"])
    st.queue_hint(env.inv.id, {"c1": 0, "c2": 3, "x": 7})
    env.put(consumers=["c1"])
    env.read("c1", a)
    st.settle()
    assert env.on_disk(c) and st.stats()["restores"] == 0
    assert env.read("x", c) == Env.pattern(c, OBJ)
    assert b in st.objects


def test_pinned_objects_are_never_evicted(env: Env) -> None:
    """A segment some client holds a view of stays in memory; with everything pinned the put fails
    with CapacityError naming the numbers and why, and nothing is lost."""
    st = env.store
    objs = [env.put(consumers=["c1"]) for _ in range(3)]
    st.queue_hint(env.inv.id, {"c1": 0})
    seg0 = st.segments[st.objects[objs[0]].segment]
    st.pin(env.s["c2"], seg0)  # a view outlives any queue position
    st.queue_hint(env.inv.id, {})  # all positions unknown: the pinned one would be first otherwise
    for _ in range(2):
        env.put(consumers=["c1"])
    assert not env.on_disk(objs[0])
    for g in list(st.segments.values()):
        st.pin(env.s["c2"], g)
    with pytest.raises(CapacityError) as ei:
        env.put(consumers=["c1"])
    msg = str(ei.value)
    assert msg.startswith(f"allocation of {OBJ} bytes failed on n0/host: pool {CAP}, in use {3 * OBJ},"
                          f" free {CAP - 3 * OBJ}; {3 * OBJ} bytes cannot be evicted: readers hold views")
    assert msg.endswith("or raise capacity_bytes")
    assert not env.on_disk(objs[0]) and env.read("c1", objs[0]) == Env.pattern(objs[0], OBJ)


def test_unusable_spill_dir_is_refused_at_start(tmp_path: Path) -> None:
    """A spill directory that cannot be created (a file is in the way) is refused when the disk
    tier is set up, with a ConfigError naming the directory and the fix, not at the first eviction."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError) as ei:
        Env(tmp_path, spill_dir=str(blocker / "spill"))
    msg = str(ei.value)
    assert f"spill_dir {blocker}/spill is not a directory" in msg
    assert "point spill_dir at a directory of the daemon's own user" in msg


def test_spill_capacity_limits_the_disk_tier(tmp_path: Path) -> None:
    env = Env(tmp_path, spill=False, quota_spill_bytes=10 * OBJ)  # the tier's cap binds, not the quota
    env.spill = SpillDir(str(tmp_path / "sp"), capacity_bytes=OBJ)
    env.store.tiers.spill = env.spill
    objs = [env.put(consumers=["c1"]) for _ in range(4)]
    assert sum(env.on_disk(o) for o in objs) == 1
    with pytest.raises(CapacityError, match=f"would exceed spill_capacity_bytes={OBJ}"):
        env.put(consumers=["c1"])
    assert len(env.store.objects) == 4


def test_unreadable_spill_file_is_data_lost_for_that_object_only(env: Env) -> None:
    st = env.store
    objs = [env.put(consumers=["c1"]) for _ in range(4)]
    (oid,) = [o for o in objs if env.on_disk(o)]
    assert env.spill is not None
    for name in os.listdir(env.spill.path):
        os.truncate(os.path.join(env.spill.path, name), 10)
    with pytest.raises(DataLost, match="could not be read"):
        env.read("c1", oid)
    with pytest.raises(DataDeleted, match="lost: its spilled copy"):
        env.read("c1", oid)
    assert st.reserved == 3 * OBJ and env.disk_files() == []
    for o in objs:
        if o != oid:
            assert env.read("c1", o) == Env.pattern(o, OBJ)


def test_without_a_disk_tier_a_full_pool_says_so(tmp_path: Path) -> None:
    env = Env(tmp_path, spill=False)
    for _ in range(3):
        env.put(consumers=["c1"])
    with pytest.raises(CapacityError, match="there is no disk tier to evict to \\(spill_capacity_bytes=0\\)"):
        env.put(consumers=["c1"])


def test_small_objects_in_slabs_spill_and_restore_together(env: Env) -> None:
    """A closed slab is one victim: all its objects go to disk at their offsets and come back."""
    st, s = env.store, env.s["p"]
    st.lease(s, 0)
    small = []
    for i in range(3):
        rec, seg = st.allocate(s, 1000, "raw", [1000], ["c2"])
        view = env.backend.host_view(seg.handle)
        assert view is not None
        view[rec.offset : rec.offset + 1000] = bytes([i + 1]) * 1000
        st.seal(s, rec.id)
        small.append(rec.id)
    assert st.objects[small[0]].segment == st.objects[small[2]].segment  # packed into one slab
    st.lease(s, 0)  # closes the slab (a new one opens)
    st.queue_hint(env.inv.id, {"c1": 0})  # the large objects' reader is queued, the slab's (c2) is not
    for _ in range(3):
        env.put(consumers=["c1"])
    assert all(env.on_disk(o) for o in small)
    assert st.stats()["evictions"] == 3 and st.stats()["bytes_on_disk"] == 2 * 1024 + 1000  # up to its last object
    assert [env.read("c2", o) for o in small] == [bytes([i + 1]) * 1000 for i in range(3)]
    assert st.stats()["restores"] == 3


def test_end_invocation_removes_spill_files_and_close_removes_the_dir(env: Env) -> None:
    objs = [env.put(consumers=["c1"]) for _ in range(5)]
    assert len(env.disk_files()) == 2 and sum(env.on_disk(o) for o in objs) == 2
    env.store.end_invocation(env.inv.id)
    assert env.disk_files() == [] and env.store.spilled == {} and env.store.stats()["bytes_on_disk"] == 0
    assert env.spill is not None
    env.store.close()
    assert not os.path.exists(env.spill.path)


def test_stale_spill_files_of_a_dead_daemon_are_cleared(tmp_path: Path) -> None:
    d = tmp_path / "spill"
    d.mkdir()
    (d / "7.spill").write_bytes(b"x" * 100)
    (d / "keep.txt").write_text("not ours")
    sp = SpillDir(str(d))
    assert sp.clear() == 1
    assert sorted(os.listdir(d)) == ["keep.txt"]


# ---- queue hints ------------------------------------------------------------------------------
def test_queue_hint_errors_name_the_bad_value(env: Env) -> None:
    st = env.store
    for bad in ("0" * 32, "../../etc/passwd", "", 42, None):
        with pytest.raises(NotFound, match="no such open invocation on node n0"):
            st.queue_hint(bad, {})
    with pytest.raises(ConfigError, match=r"'nope' is not one of its functions \(p, c1, c2, x\)"):
        st.queue_hint(env.inv.id, {"nope": 1})
    with pytest.raises(ConfigError, match="'zz' is not one of its functions"):
        st.queue_hint(env.inv.id, {}, done=["zz"])
    for pos in (-1, True, 1.5, "3"):
        with pytest.raises(ConfigError, match=f"position {pos!r} of 'c1' is invalid"):
            st.queue_hint(env.inv.id, {"c1": pos})  # type: ignore[dict-item]
    st.queue_hint(env.inv.id, {"c1": 2}, done=["x"])
    st.end_invocation(env.inv.id)
    with pytest.raises(NotFound):
        st.queue_hint(env.inv.id, {"c1": 2})
    assert env.inv.id not in st.tiers.queues and len(st.tiers.queues) == 0


def test_evicted_objects_keep_access_control(env: Env) -> None:
    other = env.store.open_invocation("wf", ["p", "c1"])
    stranger = env.store.connect(other.tokens["c1"])
    objs = [env.put(consumers=["c1"]) for _ in range(4)]
    (oid,) = [o for o in objs if env.on_disk(o)]
    with pytest.raises(AccessDenied):
        env.store.get(stranger, oid)
    with pytest.raises(AccessDenied):
        env.store.get(env.s["c2"], oid)
    assert env.on_disk(oid)  # a refused get restores nothing


# ---- demand-sized pools -------------------------------------------------------------------------
def _devices(peer_gbps: float = 25.0) -> dict[int, Any]:
    return {k: NullDeviceBackend(k, cap_bytes=8 * MiB, arena_bytes=2 * MiB, target_bytes=0, peer_gbps=peer_gbps)
            for k in (0, 1)}


def test_device_pool_target_follows_demand(tmp_path: Path) -> None:
    """settle() sets each GPU pool's target to its DemandTracker's (R_size x R_con of the active
    functions) and pre-warms it; the target drops when the functions' windows expire."""
    devs = _devices()
    env = Env(tmp_path, devices=devs, capacity_bytes=16 * MiB, device_pool_floor_bytes=0)
    st = env.store
    objs = [env.put(1 * MiB, consumers=["c1"], device=0) for _ in range(3)]
    st.settle()
    assert devs[0].pool.target == 3 * MiB  # p stores 1 MiB, three of its executions are live
    assert devs[1].pool.target == 0 and st.stats()["device_pool_target"] == 3 * MiB
    assert devs[0].pool.held >= 3 * MiB
    assert st.next_settle() == 160.0  # opened at 100 s, default R_window 60 s: settle again then
    st.get(env.s["c1"], objs[0])
    env.clock.advance(61.0)  # one request seen: R_window is the default 60 s
    st.settle()
    assert devs[0].pool.target == 0


def test_device_pool_at_cap_evicts_to_host_and_get_restores(tmp_path: Path) -> None:
    """A full GPU pool moves victims to host memory; a get on that GPU brings them back once there
    is room, and freed GPU memory brings them back proactively."""
    devs = _devices()
    env = Env(tmp_path, devices=devs, capacity_bytes=16 * MiB, device_pool_floor_bytes=0)
    st = env.store
    st.queue_hint(env.inv.id, {"c1": 0, "c2": 4})
    a = env.put(2 * MiB, consumers=["c1"], device=0)
    b = env.put(2 * MiB, consumers=["c2"], device=0)
    c = env.put(2 * MiB, consumers=["c1"], device=0)
    d = env.put(2 * MiB, consumers=["c1"], device=0)
    e = env.put(2 * MiB, consumers=["c1"], device=0)  # the pool holds four: b (position 4) leaves
    dev_of = {o: st.segments[st.objects[o].segment].device for o in (a, b, c, d, e)}
    assert dev_of == {a: 0, b: -1, c: 0, d: 0, e: 0}
    assert st.stats()["evictions"] == 1 and st.stats()["migrations"] == 0
    assert [t.kind for t in devs[0].log] == ["copy_out"]
    # No room on GPU 0: a get there serves b from host memory as it is.
    assert st.resident(st.objects[b], 0).device == -1
    st.get(env.s["c1"], a)  # frees a block on GPU 0
    assert st.resident(st.objects[b], 0).device == 0  # a get for GPU 0 restores it
    assert st.stats()["restores"] == 1 and [t.kind for t in devs[0].log] == ["copy_out", "copy_in"]
    f = env.put(2 * MiB, consumers=["c2"], device=0)  # full again: the furthest-back reader's object goes
    assert st.segments[st.objects[f].segment].device == -1 or st.segments[st.objects[b].segment].device == -1
    st.get(env.s["c1"], c)
    st.settle()  # freed GPU memory: the evicted one comes back without a get
    assert {st.segments[st.objects[o].segment].device for o in (b, d, e, f)} == {0}


def test_device_eviction_prefers_a_faster_peer_with_room(tmp_path: Path) -> None:
    devs = _devices(peer_gbps=100.0)  # NVLink-like: faster than the 25 GB/s host link
    env = Env(tmp_path, devices=devs, capacity_bytes=16 * MiB, device_pool_floor_bytes=0)
    st = env.store
    objs = [env.put(2 * MiB, consumers=["c1"], device=0) for _ in range(5)]
    where = [st.segments[st.objects[o].segment].device for o in objs]
    assert sorted(where) == [0, 0, 0, 0, 1]
    assert st.stats()["migrations"] == 1 and st.stats()["evictions"] == 1
    assert [t.kind for t in devs[1].log] == ["transfer"]
    env2 = Env(tmp_path / "b", devices=_devices(peer_gbps=100.0), capacity_bytes=16 * MiB,
               device_pool_floor_bytes=0, storage_policy="no-migration")
    objs = [env2.put(2 * MiB, consumers=["c1"], device=0) for _ in range(5)]
    assert sorted(env2.store.segments[env2.store.objects[o].segment].device for o in objs) == [-1, 0, 0, 0, 0]


def test_device_objects_go_down_to_disk_and_back(tmp_path: Path) -> None:
    """GPU -> host -> disk: a host tier too small for the GPU's victims spills them further."""
    devs = _devices()
    env = Env(tmp_path, devices=devs, capacity_bytes=2 * MiB + 64 * KiB, slab_bytes=64 * KiB,
              device_pool_floor_bytes=0)
    st = env.store
    objs = [env.put(2 * MiB, consumers=["c1"], device=0) for _ in range(6)]
    tiers = sorted("disk" if env.on_disk(o) else str(st.segments[st.objects[o].segment].device) for o in objs)
    assert tiers == ["-1", "0", "0", "0", "0", "disk"]
    for o in objs:
        rec = st.get(env.s["c1"], o)
        assert rec.state == SEALED
        st.settle()
    assert st.objects == {} and env.disk_files() == []


@pytest.mark.parametrize(("policy", "pooled"), [("gfaas", OBJ), ("caching", OBJ), ("no-pool", 0)])
def test_host_warm_cache_follows_the_pooling_policy(tmp_path: Path, policy: str, pooled: int) -> None:
    env = Env(tmp_path, storage_policy=policy)
    env.read("c1", env.put(consumers=["c1"]))
    env.store.settle()
    assert env.store.pooled_bytes == pooled and env.store.reserved == pooled


def test_warm_pool_bytes_is_a_floor_of_warm_bytes_not_of_warm_plus_in_use(tmp_path: Path) -> None:
    """Bytes in use do not eat into ``warm_pool_bytes``: with 400 KiB in use and a demand target
    of 800 KiB, both freed 300 KiB segments stay warm (600 KiB = warm_pool_bytes). Counting the
    bytes in use against it retired every freed 256 MiB segment of a stream with two objects in
    flight (issue 12)."""
    env = Env(tmp_path, warm_pool_bytes=2 * OBJ)
    st = env.store
    a, b = env.put(consumers=["c1"]), env.put(consumers=["c1"])
    env.read("c1", a)
    env.read("c1", b)
    env.put(400 * KiB, consumers=["c1"])  # too large for a warm segment: 400 KiB more in use
    st.settle()
    # p: R_size = 400 KiB (p99 of 300, 300, 400), R_con = 2 (p99 of 1, 2, 1): target 800 KiB.
    assert st.host_target == 800 * KiB and st.warm_limit() == 2 * OBJ
    assert st.pooled_bytes == 2 * OBJ and st.reserved == 2 * OBJ + 400 * KiB


def test_a_burst_keeps_more_warm_until_its_reservation_lapses(tmp_path: Path) -> None:
    """Demand raises the warm cache above ``warm_pool_bytes`` while a function is active (three
    objects alive at once: R_con 3), and settle() trims it back to the floor once the function's
    reservation has lapsed."""
    env = Env(tmp_path, warm_pool_bytes=OBJ)
    st = env.store
    ids = [env.put(consumers=["c1"]) for _ in range(3)]
    st.settle()  # as the daemon does after each reply
    assert st.host_target == 3 * OBJ
    for oid in ids:
        env.read("c1", oid)
    st.settle()
    assert st.pooled_bytes == 3 * OBJ
    env.clock.advance(700.0)  # past R_window (60 s default) and the histograms' 600 s window
    st.settle()
    assert st.host_target == OBJ and st.warm_limit() == OBJ
    assert st.pooled_bytes == OBJ and st.reserved == OBJ


def test_config_of_the_tiers_is_validated() -> None:
    c = NodeConfig(state_dir="/tmp/gx/state", socket_path="/tmp/gx/s.sock")
    assert (c.storage_policy, c.spill_dir, c.spill_capacity_bytes) == ("gfaas", "/tmp/gx/state/spill", None)
    assert c.storage_options().eviction == "queue"
    assert NodeConfig(storage_policy="lru", socket_path="/tmp/gx/s.sock").storage_options().eviction == "lru"
    with pytest.raises(ConfigError, match="storage_policy='fifo' is unknown; choose one of gfaas, queue-no-restore"):
        NodeConfig(storage_policy="fifo")
    with pytest.raises(ConfigError, match="spill_capacity_bytes=-1 is invalid: give an integer >= 0"):
        NodeConfig(spill_capacity_bytes=-1)
    with pytest.raises(ConfigError, match="spill_dir=5 must be a path"):
        NodeConfig(spill_dir=5)  # type: ignore[arg-type]


def test_a_hint_that_all_readers_finished_drops_their_objects_at_once(env: Env) -> None:
    """settle() after a hint naming finished functions releases what only they were left to read,
    in memory and on disk, without any memory pressure; other objects stay."""
    st = env.store
    a, b, c = env.put(consumers=["c1"]), env.put(consumers=["c2", "x"]), env.put(consumers=["x"])
    d = env.put(consumers=["c1"])  # no hints: all tie, the most recently stored (c) goes to disk
    assert [env.on_disk(o) for o in (a, b, c, d)] == [False, False, True, False]
    st.queue_hint(env.inv.id, {"c1": 0}, done=["c2", "x"])
    st.settle()
    for o in (b, c):
        with pytest.raises(DataDeleted, match="none of its remaining consumers will read it"):
            st.lookup(env.inv.id, "x", o)
    assert set(st.objects) == {a, d} and st.spilled == {} and env.disk_files() == []
    assert st.stats()["released_unread"] == 2 and st.reserved == 2 * OBJ


def test_a_read_that_leaves_only_finished_readers_releases_the_object(env: Env) -> None:
    """An object whose readers left are all done goes at the next settle after the read that left
    them (the hint named x done while c1 had still to read): no memory pressure needed. Objects of
    other invocations are not looked at."""
    st = env.store
    b = env.put(consumers=["c1", "x"])
    st.queue_hint(env.inv.id, {"c1": 0}, done=["x"])
    st.settle()
    assert b in st.objects  # c1 has still to read it
    env.read("c1", b)
    st.settle()
    assert b not in st.objects and st.stats()["released_unread"] == 1


def test_queue_state_places_waiters_by_ticket_and_queue_head(env: Env) -> None:
    """The runtime's batched hints: the consumer with ticket 8 of a queue whose head is 3 waits
    behind the one with ticket 4, so its object is evicted first; moving the head moves every waiter
    of that queue with one number."""
    st = env.store
    a, b = env.put(consumers=["c1"]), env.put(consumers=["c2"])
    assert st.queue_state([(env.inv.id, {"c1": ("wf/c1", 4), "c2": ("wf/c2", 8)}, ["x"], [])],
                          {"wf/c1": 3, "wf/c2": 3}) == 1
    assert st.tiers.queues.positions(env.inv.id) == {"c1": 1, "c2": 5, "x": 0}
    st.queue_state([], {"wf/c2": 8})
    assert st.tiers.queues.positions(env.inv.id) == {"c1": 1, "c2": 0, "x": 0}
    st.queue_state([], {"wf/c2": 3})  # a late message never moves a head back
    assert st.tiers.queues.positions(env.inv.id)["c2"] == 0
    st.queue_state([(env.inv.id, {"c1": ("wf/c1", 4), "c2": ("wf/c2", 12)}, [], [])], {})
    env.put(consumers=["c1"])
    env.put(consumers=["c1"])  # the fourth: one goes to disk, c2's (4 ahead of it) before c1's (1)
    assert env.on_disk(b) and not env.on_disk(a)
    assert st.queue_state([("f" * 32, {"c1": ("q", 1)}, [], [])], {}) == 0  # not open: skipped


def test_pool_targets_are_recomputed_only_when_what_they_depend_on_moved(env: Env) -> None:
    """settle() runs after every reply; it recomputes the pool targets (quantiles of every function's
    histograms) only after a demand event or a change in the bytes in use or pooled, at a
    reservation's end or a sample's expiry, and at most every RETARGET_S: not on every idle settle."""
    from gfaas.dataplane.store import RETARGET_S

    st = env.store
    calls: list[float] = []
    real = st.tiers._retarget
    st.tiers._retarget = lambda now: (calls.append(now), real(now))[1]  # type: ignore[method-assign]
    env.put(consumers=["c1"])
    st.settle()
    assert len(calls) == 1 and st.next_settle() == 160.0  # opened at 100 s: R_window 60 s
    for _ in range(20):  # replies that change nothing the targets depend on
        env.clock.advance(1.0)
        st.settle()
    assert len(calls) == 1
    env.put(consumers=["c1"])  # a store: the demand moved
    st.settle()
    st.settle()
    assert len(calls) == 2
    env.clock.advance(RETARGET_S / 2)
    st.tiers.demand[-1].request("wf/c1", env.clock.now())
    st.settle()
    assert len(calls) == 2  # at most every RETARGET_S, as before
    env.clock.advance(RETARGET_S)
    st.settle()
    assert len(calls) == 3
    env.clock.advance(170.0 - env.clock.now())  # a reservation ended: recomputed with no event
    st.settle()
    assert len(calls) == 4


# ---- evictions written off the event loop (the daemon's spill_runner) -----------------------------
def _async(env: Env) -> list[Any]:
    jobs: list[Any] = []
    env.store.spill_runner = jobs.append  # the daemon hands these to a worker thread
    return jobs


def _write(env: Env, job: Any) -> None:
    assert env.spill is not None
    env.spill.write_file(job.key, job.data)
    env.store.finish_spill(job, None)


def test_async_spill_lets_the_put_go_on_and_keeps_the_victim_readable(env: Env) -> None:
    jobs = _async(env)
    ids = [env.put(consumers=["c1"]) for _ in range(3)]
    env.store.queue_hint(env.inv.id, {"c1": 0})
    fourth = env.put(consumers=["c1"])  # over the cap: a victim starts to leave, the put does not wait
    assert len(jobs) == 1 and env.store.counters["evictions"] == 0
    victim = next(i for i in ids if env.store.objects[i].segment == jobs[0].seg.id)
    assert env.store.reserved > CAP and env.store.spilling_bytes == jobs[0].seg.size  # overshoot = in flight
    _write(env, jobs[0])
    assert env.on_disk(victim) and env.store.reserved <= CAP and env.store.spilling_bytes == 0
    assert env.store.counters["evictions"] == 1 and len(env.disk_files()) == 1
    for i in [*ids, fourth]:
        assert env.read("c1", i) == env.pattern(i, OBJ)  # the victim comes back from disk


def test_async_spill_of_an_object_freed_meanwhile_is_dropped(env: Env) -> None:
    jobs = _async(env)
    ids = [env.put(consumers=["c1"]) for _ in range(4)]
    assert len(jobs) == 1
    victim = next(i for i in ids if env.store.objects[i].segment == jobs[0].seg.id)
    assert env.read("c1", victim) == env.pattern(victim, OBJ)  # read while being written: freed after
    _write(env, jobs[0])
    assert env.store.counters["evictions"] == 0 and env.disk_files() == [] and not env.store.spilled
    assert env.spill is not None and env.spill.bytes_on_disk == 0 and env.spill.pending == 0


def test_async_spill_that_fails_keeps_the_segment(env: Env) -> None:
    jobs = _async(env)
    ids = [env.put(consumers=["c1"]) for _ in range(4)]
    env.store.finish_spill(jobs[0], CapacityError("disk full"))
    assert env.store.counters["evictions"] == 0 and not env.store.spilled and env.store.spill_error
    assert all(env.read("c1", i) == env.pattern(i, OBJ) for i in ids)
