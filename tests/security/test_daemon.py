"""Attacks on the node daemon's process and files (issue 14 rows 8, 9, 10, 14).

Idle connections and descriptor exhaustion (8), the journal grown by an ID loop (9), a run or state
directory planted by another user or symlinks in it (10), and a Redis password in argv (14).
"""

from __future__ import annotations

import os
import resource
import select
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gfaas
from gfaas import AuthenticationError, CapacityError, ConfigError
from gfaas.config import KiB
from gfaas.dataplane import protocol as P
from gfaas.dataplane.channel import Channel
from gfaas.dataplane.daemon import Daemon
from gfaas.dataplane.local import LocalNode, start_daemon
from gfaas.dataplane.peer_auth import generate_key_file
from gfaas.errors import QuotaExceeded

NOBODY = 65534


def raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    return s


def refusal(s: socket.socket, wait: float = 3.0) -> tuple[str, str] | None:
    """The (code, message) the daemon sent before closing ``s``; None if it is still open and silent."""
    if not select.select([s], [], [], wait)[0]:
        return None
    data = s.recv(P.MAX_FRAME)
    if not data:
        return ("EOF", "")
    r = P.decode_reply(data)
    assert isinstance(r, P.Error)
    assert s.recv(P.MAX_FRAME) == b""  # and then closed
    return r.code, r.message


def connect_eventually(node: Any, function: str = "f", timeout: float = 5.0) -> gfaas.Client:
    """A client of ``function``, retried while the daemon is still closing what the test released."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return node.connect(function)
        except CapacityError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def round_trip(node: Any) -> None:
    """A put by f and a get by g still work: the daemon serves."""
    f, g = connect_eventually(node, "f"), connect_eventually(node, "g")
    ref = f.put(np.arange(1000, dtype=np.int64), consumers=["g"])
    assert int(g.get(ref).sum()) == 499500


# ---- row 8: connections and descriptors ---------------------------------------------------------
@pytest.mark.node_config(max_connections=6, hello_timeout_s=60)
def test_connections_over_the_cap_are_refused_with_a_clear_error(node) -> None:  # type: ignore[no-untyped-def]
    """With max_connections=6 (the admin's is one), the 7th connection gets CapacityError naming the limit;
    once the idle ones close, a legitimate client is served again."""
    idle = [raw(node.config.socket_path) for _ in range(5)]
    for s in idle:
        assert refusal(s, 0.05) is None  # accepted, waiting for its Hello
    with pytest.raises(CapacityError, match=r"node n0 has 6 connections, its limit \(max_connections=6\)"):
        gfaas.connect(node.credentials("f"))
    for s in idle:
        s.close()
    round_trip(node)
    assert node.local.proc.poll() is None


@pytest.mark.node_config(max_connections_per_uid=3, hello_timeout_s=60)
def test_connections_per_user_are_capped(node) -> None:  # type: ignore[no-untyped-def]
    """One local user (SO_PEERCRED) may hold max_connections_per_uid connections; the next is refused by uid."""
    idle = [raw(node.config.socket_path) for _ in range(2)]  # + the admin's: 3
    uid = os.geteuid()
    with pytest.raises(CapacityError, match=rf"3 connections from uid {uid}, the limit per user"
                                            r" \(max_connections_per_uid=3\)"):
        gfaas.connect(node.credentials("f"))
    idle.pop().close()
    c = connect_eventually(node, "f")
    assert c.put(b"x") is not None
    for s in idle:
        s.close()


@pytest.mark.node_config(hello_timeout_s=0.3, max_connections=4)
def test_connections_without_hello_are_dropped_after_the_deadline(node) -> None:  # type: ignore[no-untyped-def]
    """Idle connections that never say Hello fill the cap only until hello_timeout_s, then are closed
    with an AuthenticationError; the admin's authenticated connection stays, and clients connect again."""
    idle = [raw(node.config.socket_path) for _ in range(3)]
    with pytest.raises(CapacityError, match="max_connections=4"):
        gfaas.connect(node.credentials("f"))
    for s in idle:
        assert refusal(s) == ("AuthenticationError", "no Hello within 0.3 s of connecting (hello_timeout_s);"
                              " connection closed: present credentials first")
        s.close()
    assert node.stats()["invocations"] == 1  # the admin connection was not dropped
    round_trip(node)


def _limit_fds(node: Any, spare: int) -> None:
    """Lower the running daemon's descriptor limit to what it uses now plus ``spare``."""
    n = node.open_fds() + spare
    resource.prlimit(node.pid, resource.RLIMIT_NOFILE, (n, n))


@pytest.mark.node_config(hello_timeout_s=1.0)
def test_descriptor_exhaustion_by_connections_is_refused_not_fatal(node) -> None:  # type: ignore[no-untyped-def]
    """Connections past the daemon's descriptor limit (EMFILE in accept) are refused with an error naming
    the cause; the daemon lives, and serves again once the idle ones time out."""
    _limit_fds(node, 24)
    socks = [raw(node.config.socket_path) for _ in range(60)]
    answers = [refusal(s) for s in socks]
    out_of_fds = [a for a in answers if a is not None and a[0] == "CapacityError"]
    # A descriptor the daemon held only while it was counted (a connection closing) frees a place or
    # two more under load: the bound allows for them.
    assert len(out_of_fds) >= 60 - 24 - 2
    assert all("node n0 is out of file descriptors (Too many open files)" in a[1] for a in out_of_fds)
    assert node.local.proc.poll() is None
    for s in socks:
        s.close()
    round_trip(node)  # the idle ones it had accepted were dropped at their Hello deadline
    assert node.local.proc.poll() is None


@pytest.mark.node_config(warm_pool_bytes=0)
def test_descriptor_exhaustion_by_allocations_fails_that_request_only(node) -> None:  # type: ignore[no-untyped-def]
    """~1,000 allocations of 200 KiB (each a segment with a descriptor) past the limit get CapacityError;
    the daemon lives, and once that function's connection goes, another invocation is served."""
    _limit_fds(node, 48)
    f = node.connect("f")
    bufs = []
    with pytest.raises(CapacityError, match=r"node n0 is out of file descriptors \(Too many open files\)"):
        for _ in range(1000):
            bufs.append(f.allocate(200 * KiB))
    assert 10 <= len(bufs) < 60
    assert node.local.proc.poll() is None
    del bufs
    f.close()  # its unsealed allocations are freed, and their descriptors with them
    other = node.open()
    deadline = time.monotonic() + 5
    while True:
        try:
            p = node.connect("f", other)
            c = node.connect("g", other)
            break
        except (CapacityError, gfaas.DataPlaneError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    ref = p.put(np.ones(300 * KiB, np.uint8), consumers=["g"])
    assert int(c.get(ref).sum()) == 300 * KiB


def test_segments_left_warm_by_one_workflow_do_not_lock_out_another(node) -> None:  # type: ignore[no-untyped-def]
    """Issue 37 row 4: a function fills the daemon's descriptors with objects of 200 KiB (each a segment
    with its memfd), inside every quota. When its invocation ends, the segments go to its workflow's
    warm pool, each still holding its descriptor: another workflow's put then failed, out of
    descriptors, for as long as they stayed warm. Now an allocation that runs out of descriptors
    gives the warm segments back first, and succeeds."""
    _limit_fds(node, 48)
    f = node.connect("f")
    refs = []
    with pytest.raises(CapacityError, match=r"out of file descriptors"):
        for _ in range(1000):
            refs.append(f.put(np.ones(200 * KiB, np.uint8), consumers=["g"]))
    assert 10 <= len(refs) < 60
    f.close()
    node.admin.end_invocation(node.inv)
    deadline = time.monotonic() + 5
    while node.stats()["invocations"] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    other = node.open(workflow="other")
    p = node.connect("f", other)
    c = node.connect("g", other)
    got = []
    for k in range(3):
        ref = p.put(np.full(300 * KiB, k, np.uint8), consumers=["g"])
        got.append(int(c.get(ref)[0]))
    assert got == [0, 1, 2]
    assert node.local.proc.poll() is None


@pytest.mark.node_config(quota_segments=8, warm_pool_bytes=0)
def test_an_invocation_holds_at_most_its_quota_of_segments(node) -> None:  # type: ignore[no-untyped-def]
    """Issue 37 row 4: the segments an invocation holds at once (one descriptor of the daemon's each) are a
    quota like its bytes: the ninth of 8 is refused naming ``quota_segments``; once one is freed, the
    next fits; another invocation has its own."""
    f = node.connect("f")
    held = [f.allocate(200 * KiB) for _ in range(8)]
    with pytest.raises(QuotaExceeded, match=r"shared-memory segments .* limit 8 \(quota_segments=8\)"):
        f.allocate(200 * KiB)
    f.delete(held.pop().seal())
    held.append(f.allocate(200 * KiB))
    other = node.open()
    g = node.connect("f", other)
    assert g.allocate(200 * KiB) is not None


# ---- row 9: the journal is compacted while the daemon runs ---------------------------------------
def test_journal_is_compacted_while_running(make_config, thread_daemon) -> None:  # type: ignore[no-untyped-def]
    """IDs issued in a loop to invocations that then end are dropped from the journal while the daemon
    runs (not only at restart); a restart after compaction still reports the live invocation's IDs lost."""
    cfg = make_config()
    with thread_daemon(cfg) as d:
        d.journal.compact_min = 4096  # the default waits for 32,768 dead records; the rule is the same
        adm = gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir)
        keep = adm.open_invocation("wf", ["f"])
        ch = Channel(cfg.socket_path)
        ch.handshake(P.Hello(keep.tokens["f"]))
        kept = ch.call(P.MoreIds(100))[0].ids  # type: ignore[attr-defined]
        ch.close()
        path = os.path.join(cfg.state_dir, "objects.journal")
        sizes = []
        for _ in range(12):
            inv = adm.open_invocation("wf", ["f"])
            ch = Channel(cfg.socket_path)
            ch.handshake(P.Hello(inv.tokens["f"]))
            for _ in range(2):
                ch.call(P.MoreIds(1024))
            ch.close()
            adm.end_invocation(inv)
            sizes.append(d.journal.records)
        assert d.journal.compactions >= 1
        assert max(sizes) <= 100 + 3 * 4096 + 2048 + 64  # never more than ~3x the threshold
        assert d.journal.records < 100 + 2 * 2048 + 64  # what is left: the live invocation and the last few
        live = d.journal.load()
        assert {k for k, v in live.items() if v == keep.id} >= set(kept)
        assert os.stat(path).st_mode & 0o777 == 0o600
        adm.close()
    with thread_daemon(cfg) as d2:
        assert set(kept) <= set(d2.store._lost)


# ---- row 10: run and state directories of another user, symlinks --------------------------------
def test_group_writable_or_symlinked_state_dir_is_refused(make_config, run_dir) -> None:  # type: ignore[no-untyped-def]
    """A state directory writable by others, or a symlink, is refused with its path, mode and the fix."""
    cfg = make_config()
    os.mkdir(cfg.state_dir, 0o700)
    os.chmod(cfg.state_dir, 0o777)
    with pytest.raises(ConfigError, match=rf"state directory {cfg.state_dir} has mode 0777, writable by group"
                                          rf" or others; run chmod 700 {cfg.state_dir}"):
        start_daemon(cfg)
    os.rmdir(cfg.state_dir)
    target = os.path.join(run_dir, "elsewhere")
    os.mkdir(target, 0o700)
    os.symlink(target, cfg.state_dir)
    with pytest.raises(ConfigError, match=rf"state directory {cfg.state_dir} is a symlink \(to '{target}'\)"):
        Daemon(cfg)
    assert os.listdir(target) == []


@pytest.mark.root
def test_run_dir_planted_by_another_user_is_refused(make_config, run_dir) -> None:  # type: ignore[no-untyped-def]
    """A state or socket directory owned by another uid (with an admin token its owner chose) is refused:
    the daemon does not start and the planted token is never accepted."""
    cfg = make_config()
    os.mkdir(cfg.state_dir, 0o700)
    with open(os.path.join(cfg.state_dir, "admin.token"), "w") as fh:
        fh.write("0" * 32)
    os.chown(cfg.state_dir, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=rf"state directory {cfg.state_dir} is owned by uid {NOBODY}, not by"
                                          rf" this user \(uid 0\): another user may have planted it;"
                                          rf" remove it \(rm -rf {cfg.state_dir}\)"):
        start_daemon(cfg)
    with pytest.raises(ConfigError, match=f"owned by uid {NOBODY}"):
        Daemon(cfg)  # the daemon's own check, whoever starts it
    sock_dir = os.path.join(run_dir, "sockets")
    os.mkdir(sock_dir, 0o700)
    os.chown(sock_dir, NOBODY, NOBODY)
    cfg2 = make_config(socket_path=os.path.join(sock_dir, "n.sock"), state_dir=os.path.join(run_dir, "st2"))
    with pytest.raises(ConfigError, match=rf"socket directory {sock_dir} is owned by uid {NOBODY}"):
        Daemon(cfg2)
    assert not os.path.exists(cfg2.socket_path)


def test_planted_symlinks_in_the_state_dir_are_not_followed(make_config, run_dir) -> None:  # type: ignore[no-untyped-def]
    """Symlinks at the pid file, admin token, registry and log are replaced or refused, never written through."""
    cfg = make_config()
    os.mkdir(cfg.state_dir, 0o700)
    victims = {}
    for name in ("daemon.pid", "admin.token", "invocations.journal", "invocations.json"):
        victim = os.path.join(run_dir, f"victim-{name}")
        with open(victim, "w") as fh:
            fh.write("precious")
        os.symlink(victim, os.path.join(cfg.state_dir, name))
        victims[name] = victim
    with LocalNode(cfg):
        with gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as adm:
            adm.open_invocation("wf", ["f"])
        for name, victim in victims.items():
            assert Path(victim).read_text() == "precious"
            assert not os.path.islink(os.path.join(cfg.state_dir, name))
    log = os.path.join(cfg.state_dir, "daemon.log")
    os.unlink(log)
    os.symlink(victims["daemon.pid"], log)
    with pytest.raises(ConfigError, match=f"log file {log} is a symlink"):
        start_daemon(cfg)
    assert Path(victims["daemon.pid"]).read_text() == "precious"


def test_admin_token_is_verified_against_its_keyed_hash(node) -> None:  # type: ignore[no-untyped-def]
    """The daemon checks admin tokens against admin.hash (HMAC under token.key), not the file's content:
    a token written into admin.token afterwards is refused; the registry holds no function token."""
    sd = node.config.state_dir
    for name in ("token.key", "admin.hash", "admin.token", "invocations.journal"):
        assert os.stat(os.path.join(sd, name)).st_mode & 0o777 == 0o600
    real = Path(os.path.join(sd, "admin.token")).read_text()
    with open(os.path.join(sd, "admin.token"), "w") as fh:
        fh.write("f" * 32)
    with pytest.raises(AuthenticationError, match="wrong admin token"):
        gfaas.Admin(node.config.socket_path, state_dir=sd)
    assert gfaas.Admin(node.config.socket_path, admin_token=real).stats()["invocations"] == 1
    registry = Path(os.path.join(sd, "invocations.journal")).read_text()
    assert all(t not in registry for t in node.inv.tokens.values()) and "token_hashes" in registry


def test_admin_client_refuses_a_token_file_open_to_others(node) -> None:  # type: ignore[no-untyped-def]
    """The admin client reads admin.token only as a 0600 regular file, never through a symlink."""
    path = os.path.join(node.config.state_dir, "admin.token")
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match=rf"admin token file {path} has mode 0644: group or others may read or"
                                          rf" change it; run chmod 600 {path}"):
        gfaas.Admin(node.config.socket_path, state_dir=node.config.state_dir)


# ---- row 14: secrets never in argv or logs ------------------------------------------------------
def test_redis_password_is_not_in_argv_or_the_log(make_config, run_dir) -> None:  # type: ignore[no-untyped-def]
    """A daemon whose redis_url holds a password shows it neither in /proc/PID/cmdline nor in its log."""
    key = os.path.join(run_dir, "cluster.key")
    generate_key_file(key)
    cfg = make_config(redis_url="redis://:s3cretpw@127.0.0.1:1/0", remote_timeout_s=0.2, cluster_key_file=key)
    assert "s3cretpw" not in repr(cfg) and "redis://:***@127.0.0.1:1/0" in repr(cfg)
    with LocalNode(cfg) as n:
        assert n.proc is not None
        cmdline = Path(f"/proc/{n.proc.pid}/cmdline").read_bytes()
        assert b"'gfaas.dataplane.node_main'" in cmdline and b"\0--config-fd\0" in cmdline
        with gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as adm:
            assert adm.stats()["invocations"] == 0
    log = Path(os.path.join(cfg.state_dir, "daemon.log")).read_bytes()
    assert b"node configuration: NodeConfig(node_id='n0'" in log and b"redis_url='redis://:***@127.0.0.1:1/0'" in log
    assert b"s3cretpw" not in cmdline and b"s3cretpw" not in log
