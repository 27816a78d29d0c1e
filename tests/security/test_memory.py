"""Issue 14, rows 2, 3, 9, 10 (spill half) and 11: sealed shared memory, request ranges,
per-invocation quotas and the disk tier, attacked through a real daemon process."""

from __future__ import annotations

import array
import errno
import mmap
import os
import socket
from typing import Any

import numpy as np
import pytest

import gfaas
from gfaas import CapacityError
from gfaas.config import KiB, MiB
from gfaas.dataplane import memfd
from gfaas.dataplane import protocol as P
from gfaas.dataplane.spill import DEFAULT_FREE_SHARE, SpillDir
from gfaas.errors import ConfigError, QuotaExceeded

pytestmark = pytest.mark.timeout(60)

BIG = 1 * MiB  # above the slab limit: a segment of its own


class Client:
    """A bare connection that keeps the descriptors the daemon sends (what an attacker holds)."""

    def __init__(self, node: Any, function: str, inv: Any = None) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.s.settimeout(10)
        self.s.connect(node.config.socket_path)
        self.fds: list[int] = []
        r = self.call(P.Hello(node.credentials(function, inv).token))
        assert isinstance(r, P.Welcome), r

    def call(self, msg: P._Msg) -> P.Reply:
        self.s.send(P.encode(msg))
        data, anc, _, _ = self.s.recvmsg(P.MAX_FRAME, socket.CMSG_SPACE(64))
        self.fds = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                self.fds += list(array.array("i", payload[: len(payload) - len(payload) % 4]))
        return P.decode_reply(data)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.s.close()


def still_serving(node: Any, function: str = "g", inv: Any = None) -> None:
    c = gfaas.connect(node.credentials(function, inv))
    ref = c.put(np.arange(1000))
    np.testing.assert_array_equal(c.get(ref), np.arange(1000))
    c.delete(ref)
    c.close()


def assert_eperm(call: Any) -> None:
    with pytest.raises(OSError) as ei:
        call()
    assert ei.value.errno in (errno.EPERM, errno.EACCES), ei.value


def reopen_rw(fd: int) -> int:
    """What row 2's attacker did: reopen a read-only descriptor read-write through /proc (as the
    same uid, after giving the inode its write bit back if it has to)."""
    path = f"/proc/self/fd/{fd}"
    try:
        return os.open(path, os.O_RDWR)
    except PermissionError:
        os.fchmod(fd, 0o600)  # the owner may; the write seal still holds
        return os.open(path, os.O_RDWR)


def _reopen_as(uid: int, fd: int) -> int:
    """In a child that has become ``uid`` (as the sandbox does: dumpable, so /proc/self is its own),
    try to reopen ``fd`` read-write, then read-only; returns the errno of the first failure, 0 if both open."""
    import ctypes

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, as runtime.sandbox does
            code = 0
            for flags in (os.O_RDWR, os.O_RDONLY):
                os.close(os.open(f"/proc/self/fd/{fd}", flags))
        except OSError as exc:
            code = exc.errno or 98
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.root
def test_a_sandboxed_reader_cannot_reopen_its_descriptor_at_all(node: Any) -> None:
    """Row 2 with the function sandbox (default settings, writes of the segment not sealed): a
    reader under another uid cannot reopen its read-only descriptor, neither read-write nor
    read-only (the memfd is the daemon's, mode 0400). The same reopen of a memfd left at its
    default mode succeeds, so the probe can tell."""
    data = np.arange(BIG // 8, dtype=np.int64)
    ref = node.connect("f").put(data, consumers=["g", "h"])
    g = Client(node, "g")
    assert isinstance(g.call(P.Get(ref.id)), P.Located) and len(g.fds) == 1
    assert memfd.seals(g.fds[0]) & memfd.F_SEAL_FUTURE_WRITE == 0  # reusable when warm
    assert _reopen_as(65534, g.fds[0]) == errno.EACCES
    plain = os.memfd_create("control", os.MFD_CLOEXEC)
    os.fchmod(plain, 0o666)
    assert _reopen_as(65534, plain) == 0
    os.close(plain)
    g.close()
    np.testing.assert_array_equal(node.connect("h").get(ref), data)


@pytest.mark.node_config(seal_writes=True)
def test_reader_reopening_a_sealed_object_cannot_write_or_truncate_it(node: Any) -> None:
    """With seal_writes (the defence without the sandbox): a reader's read-only memfd reopened
    O_RDWR: write, pwrite, a shared writable mmap and ftruncate all fail; another reader still
    gets the producer's bytes."""
    data = np.arange(BIG // 8, dtype=np.int64)
    ref = node.connect("f").put(data, consumers=["g", "h"])
    g = Client(node, "g")
    loc = g.call(P.Get(ref.id))
    assert isinstance(loc, P.Located) and len(g.fds) == 1
    ro = g.fds[0]
    assert memfd.seals(ro) & (memfd.F_SEAL_FUTURE_WRITE | memfd.SIZE_SEALS) == \
        memfd.F_SEAL_FUTURE_WRITE | memfd.SIZE_SEALS
    rw = reopen_rw(ro)
    try:
        assert_eperm(lambda: os.write(rw, b"\xff" * 64))
        assert_eperm(lambda: os.pwrite(rw, b"\xff" * 64, loc.offset))
        assert_eperm(lambda: mmap.mmap(rw, BIG, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
        assert_eperm(lambda: os.ftruncate(rw, 0))
        assert_eperm(lambda: os.ftruncate(rw, 4 * BIG))
    finally:
        os.close(rw)
        g.close()
    np.testing.assert_array_equal(node.connect("h").get(ref), data)


@pytest.mark.node_config(seal_writes=True)
def test_producer_cannot_resize_and_writes_only_through_its_own_mapping(node: Any) -> None:
    """The producer's read-write descriptor cannot truncate or grow its segment, before or after
    the seal; after the seal, write() and new writable mappings fail; what remains true is that
    the mapping it made before the seal still writes its own object."""
    f = Client(node, "f")
    a = f.call(P.Allocate(BIG, "raw", [BIG], ["g"]))
    assert isinstance(a, P.Allocated) and len(f.fds) == 1
    fd = f.fds[0]
    assert_eperm(lambda: os.ftruncate(fd, 0))
    assert_eperm(lambda: os.ftruncate(fd, 8 * BIG))
    mine = mmap.mmap(fd, BIG, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    mine[a.offset : a.offset + 4] = b"good"
    assert isinstance(f.call(P.SealAllocated(a.id)), P.Ok)
    assert_eperm(lambda: os.pwrite(fd, b"evil", a.offset))
    assert_eperm(lambda: mmap.mmap(fd, BIG, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
    assert_eperm(lambda: os.ftruncate(fd, 0))
    mine[a.offset : a.offset + 4] = b"mine"  # the documented caveat: its own pre-seal mapping
    got = node.connect("g").get(gfaas.DataRef(a.id, node.config.node_id))
    assert bytes(got[:4]) == b"mine"
    mine.close()
    f.close()


def test_truncate_then_get_with_device_below_minus_two_is_refused_and_daemon_survives(node: Any) -> None:
    """Row 3: after a (failed) truncate, Get(device=-3) is refused naming the value and the valid
    values; the daemon serves afterwards and the object is intact."""
    data = np.full(BIG, 7, np.uint8)
    ref = node.connect("f").put(data, consumers=["g", "h"])
    g = Client(node, "g")
    assert isinstance(g.call(P.Get(ref.id, device=P.HOST)), P.Located)
    rw = reopen_rw(g.fds[0])
    assert_eperm(lambda: os.ftruncate(rw, 0))
    os.close(rw)
    for bad in (-3, -(2**40)):
        r = g.call(P.Get(ref.id, device=bad))
        assert isinstance(r, P.Error) and r.code == "ProtocolError", r
        assert f"Get.device={bad} is out of range" in r.message
        assert "-2 (wherever it lives), -1 (host memory) or a GPU ordinal >= 0" in r.message
    g.close()
    assert node.local.proc.poll() is None
    still_serving(node)
    np.testing.assert_array_equal(node.connect("h").get(ref), data)


@pytest.mark.parametrize(("msg", "field"), [
    (P.Allocate(8, "raw", [8], None, device=-2), "Allocate.device=-2"),
    (P.Get(b"x" * 16, expect_nbytes=-5), "Get.expect_nbytes=-5"),
    (P.Derive(-1, 0, 8, "raw", [8], None), "Derive.segment=-1"),
    (P.SealAllocated(b"x" * 16, b"e" * 65), "SealAllocated.event has 65 bytes"),
])
def test_out_of_range_fields_are_refused_before_any_handler(node: Any, msg: P._Msg, field: str) -> None:
    """Every request field out of its range gets a ProtocolError naming the field and value."""
    f = Client(node, "f")
    r = f.call(msg)
    assert isinstance(r, P.Error) and r.code == "ProtocolError" and field in r.message, r
    assert node.stats()["writing"] == 0
    f.close()


@pytest.mark.node_config(quota_unsealed_objects=3, quota_reserved_bytes=4 * MiB)
def test_quota_exhaustion_by_one_invocation_leaves_others_serving(node: Any) -> None:
    """Tenant A allocating without sealing stops at its quotas (errors name quota, value and knob);
    tenant B still allocates, writes and reads."""
    a = node.connect("f")
    bufs = [a.allocate(BIG) for _ in range(3)]
    with pytest.raises(QuotaExceeded) as ei:
        a.allocate(BIG)
    assert "objects allocated and not sealed: 3 held, 1 more asked, limit 3 (quota_unsealed_objects=3)" \
        in str(ei.value)
    bufs[0].seal()
    with pytest.raises(QuotaExceeded, match=r"bytes reserved .* limit 4194304 \(quota_reserved_bytes=4194304\)"):
        a.allocate(3 * MiB)
    inv_b = node.open(workflow="other")
    b = node.connect("f", inv_b)
    for _ in range(3):
        buf = b.allocate(BIG)
        buf.array[:] = 5
        ref = buf.seal()
        assert int(np.asarray(node.connect("g", inv_b).get(ref)).sum()) == 5 * BIG
    still_serving(node, "g", inv_b)
    assert isinstance(ei.value, CapacityError)  # callers that handle a full pool handle this too


@pytest.mark.node_config(quota_issued_ids=4096)
def test_more_ids_in_a_loop_stops_at_the_quota_with_rss_bounded(node: Any) -> None:
    """Row 9: MoreIds in a loop is refused once the invocation holds quota_issued_ids unused IDs;
    the daemon's memory stays flat however long the loop runs; other tenants keep serving."""
    f = Client(node, "f")
    got = 0
    for _ in range(4):
        r = f.call(P.MoreIds(1024))
        assert isinstance(r, P.Ids)
        got += len(r.ids)
    assert got == 4096

    def rss_kib() -> int:
        with open(f"/proc/{node.pid}/status") as st:
            return next(int(line.split()[1]) for line in st if line.startswith("VmRSS:"))

    before = rss_kib()
    for _ in range(2000):
        r = f.call(P.MoreIds(1024))
        assert isinstance(r, P.Error) and r.code == "QuotaExceeded", r
    assert "issued IDs not used yet: 4096 held, 1024 more asked, limit 4096 (quota_issued_ids=4096)" in r.message
    assert rss_kib() - before < 4 * 1024  # 2 M IDs before the fix grew it by ~200 MiB
    f.close()
    still_serving(node, "g", node.open())


# ---- the disk tier (row 10, spill half; row 11) ---------------------------------------------
def test_group_writable_spill_dir_is_refused(tmp_path: Any) -> None:
    """A spill_dir writable by group or others is refused with a ConfigError naming path, mode and fix."""
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o770)
    with pytest.raises(ConfigError) as ei:
        SpillDir(str(d))
    msg = str(ei.value)
    assert f"spill_dir {d} has mode 0770, writable by group or others; run chmod 700 {d}" in msg
    assert "another user could plant or swap spill files there" in msg


def test_symlinked_spill_dir_is_refused(tmp_path: Any) -> None:
    """A spill_dir that is a symlink is not followed."""
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(ConfigError, match=rf"spill_dir {tmp_path}/link is a symlink \(to '{tmp_path}/real'\); it is refused"):
        SpillDir(str(tmp_path / "link"))


@pytest.mark.root
def test_spill_dir_of_another_user_is_refused(tmp_path: Any) -> None:
    """A spill_dir owned by another uid (here nobody, 65534) is refused naming the owner."""
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    with pytest.raises(ConfigError, match=f"spill_dir {d} is owned by uid 65534, not by this user \\(uid {os.geteuid()}\\)"):
        SpillDir(str(d))


def test_planted_and_swapped_spill_files_are_never_followed_or_read(tmp_path: Any) -> None:
    """A symlink planted where a spill file goes is replaced, not written through; a file swapped
    after the write (a symlink or another file with the same bytes) is refused on read-back."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    sp = SpillDir(str(tmp_path / "spill"))
    os.symlink(victim, tmp_path / "spill" / "1.spill")
    sp.write_file(1, memoryview(b"object-bytes"))
    sp.commit(1, 12)
    assert victim.read_bytes() == b"precious"
    assert not os.path.islink(tmp_path / "spill" / "1.spill")
    out = bytearray(12)
    sp.read_into(1, memoryview(out))
    assert out == b"object-bytes"
    for swap in ("symlink", "copy"):
        os.unlink(tmp_path / "spill" / "1.spill")
        if swap == "symlink":
            os.symlink(victim, tmp_path / "spill" / "1.spill")
        else:
            (tmp_path / "spill" / "1.spill").write_bytes(b"forged-bytes")
        with pytest.raises(OSError):
            sp.read_into(1, memoryview(out))
        assert out == b"object-bytes"
    sp.close()


def test_disk_tier_is_finite_by_default(thread_daemon: Any, make_config: Any) -> None:
    """With spill_capacity_bytes unset the daemon's disk tier is min(capacity, 25% of free space)."""
    cfg = make_config(capacity_bytes=64 * MiB)
    assert cfg.spill_capacity_bytes is None
    with thread_daemon(cfg) as d:
        st = os.statvfs(cfg.spill_dir)
        free_share = int(st.f_bavail * st.f_frsize * DEFAULT_FREE_SHARE)
        cap = d.store.spill.capacity_bytes
        assert cap is not None and 0 < cap <= 64 * MiB
        assert abs(cap - min(64 * MiB, free_share)) <= 64 * MiB // 100  # free space moves a little
        assert stat_mode(cfg.spill_dir) == 0o700


def stat_mode(path: str) -> int:
    return os.stat(path).st_mode & 0o777


@pytest.mark.node_config(capacity_bytes=8 * MiB, slab_bytes=256 * KiB, quota_reserved_bytes=8 * MiB,
                         spill_capacity_bytes=16 * MiB, quota_spill_bytes=3 * MiB)
def test_spill_quota_stops_one_invocation_not_the_others(node: Any) -> None:
    """Unread puts of one invocation go to disk until its spill quota, then its allocations are
    refused naming quota_spill_bytes; another invocation still puts and reads."""
    a = node.connect("f")
    refs = []
    with pytest.raises(QuotaExceeded, match=r"bytes on disk: \d+ held, 0 more asked, limit 3145728 "
                                            r"\(quota_spill_bytes=3145728\)"):
        for _ in range(64):
            refs.append(a.put(np.ones(2 * MiB, np.uint8), consumers=["g"]))
            node.stats()  # settles the writes to disk
    assert 3 * MiB <= node.stats()["bytes_on_disk"] <= 3 * MiB + 4 * MiB
    inv_b = node.open(workflow="other")
    b = node.connect("f", inv_b)
    ref = b.put(np.full(2 * MiB, 9, np.uint8), consumers=["g"])
    assert int(np.asarray(node.connect("g", inv_b).get(ref))[-1]) == 9
    assert int(np.asarray(node.connect("g").get(refs[0])).sum()) == 2 * MiB  # A's first object, from disk
