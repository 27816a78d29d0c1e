"""Issue 19's access rule and what it must not open: the dashboard's read-only views need no token from
the gateway's own user on loopback, but function code (a tenant uid on the same machine) still needs
it, and nothing that changes state is opened.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gfaas.runtime.gateway.peer import _hex_addr, peer_uid, same_user_on_loopback

pytestmark = pytest.mark.timeout(120)


def test_proc_net_addresses_decode() -> None:
    assert _hex_addr("0100007F:1F90") == ("127.0.0.1", 8080)
    assert _hex_addr("00000000000000000000000001000000:0050") == ("::1", 80)


def test_the_peer_of_a_loopback_connection_is_its_owner() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    conn, addr = srv.accept()
    try:
        assert peer_uid(addr, srv.getsockname()) == os.geteuid()
        assert same_user_on_loopback(addr, srv.getsockname())
        assert peer_uid(("127.0.0.1", 1), srv.getsockname()) is None  # no such connection: no one
        assert not same_user_on_loopback(("10.0.0.1", addr[1]), srv.getsockname())
    finally:
        for s in (conn, cli, srv):
            s.close()


@pytest.fixture
def gateway(make_config: Any) -> Iterator[Any]:
    from gfaas.dataplane.local import LocalNode
    from gfaas.runtime.gateway import serve
    from gfaas.runtime.local import LocalRuntime, NodeEndpoint, RuntimeConfig

    with LocalNode(make_config()) as node:
        ep = NodeEndpoint("n0", node.config.socket_path, node.config.state_dir)
        with LocalRuntime(RuntimeConfig(nodes=(ep,))) as rt, serve(rt, host="127.0.0.1", port=0) as gw:
            yield gw


def test_read_only_views_open_to_this_user_on_loopback_and_nothing_else(gateway: Any) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as c:
        for path in ("/dashboard", "/dashboard/static/dashboard.js", "/v1/dashboard/state", "/v1/results"):
            assert c.get(path).status_code == 200, path
        # state changes and other reads keep needing the token
        assert c.post("/v1/workflows", content="name: x", headers={"content-type": "application/yaml"}).status_code == 401
        assert c.get("/v1/workflows").status_code == 401
        assert c.get("/metrics").status_code == 401
        # a wrong token is not waved through by the loopback rule
        assert c.get("/v1/dashboard/state", headers={"authorization": "Bearer nope"}).status_code == 401
        # only the package's own files
        assert c.get("/dashboard/static/..%2F__init__.py").status_code in (401, 404)
        assert c.get("/v1/results/committed/../../../etc/passwd").status_code in (401, 404)


@pytest.mark.root
def test_a_tenant_uid_on_the_same_machine_needs_the_token(gateway: Any) -> None:
    """Function code runs as a tenant uid (runtime/sandbox.py); its loopback requests are not the gateway's user."""
    # Started as root and dropped to the tenant uid before asking, as the sandbox's workers are
    # (the interpreter under /root is not executable by a tenant uid).
    probe = ("import os, sys, urllib.request, urllib.error, encodings.idna, email.parser, http.client\n"
             "uid = int(sys.argv[2])\n"
             "if uid:\n    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)\n"
             "try:\n    print(urllib.request.urlopen(sys.argv[1], timeout=30).status)\n"
             "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    url = gateway.url + "/v1/dashboard/state"
    env = {"PATH": "/usr/bin:/bin", "no_proxy": "*"}
    out = subprocess.run([sys.executable, "-I", "-c", probe, url, "200777"], capture_output=True, text=True,
                         timeout=60, cwd="/", env=env)
    assert out.stdout.strip() == "401", out.stderr[-2000:]
    mine = subprocess.run([sys.executable, "-I", "-c", probe, url, "0"], capture_output=True, text=True, timeout=60,
                          cwd="/", env=env)
    assert mine.stdout.strip() == "200", mine.stderr[-2000:]  # the same probe as the gateway's user: open
