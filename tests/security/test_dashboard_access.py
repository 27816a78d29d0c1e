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


class _NoWorkflows:
    def workflows(self) -> list[str]:
        return []


def test_the_results_browser_follows_no_link_and_offers_no_folder_others_can_write(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37 rows 5 and 11: another local user who can write to ``./out`` plants links there to a
    file only the gateway's user may read (``/etc/shadow`` in the review). None is listed or served:
    not a linked file, not a file under a linked directory, not a listed file swapped for a link after
    the listing (before: each served the secret). And a ``./out`` that others may write to is not
    offered at all; one only its owner may write to is."""
    import json
    from pathlib import Path

    from fastapi.testclient import TestClient

    from gfaas.runtime.gateway import create_app
    from gfaas.runtime.gateway.result_files import NotInside, default_results_dirs, read_inside

    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"provenance": {"commit": "s" * 40}, "password": "hunter2"}))
    secret.chmod(0o600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "inner.json").write_text(json.dumps({"password": "hunter2"}))
    out = tmp_path / "out"
    (out / "run").mkdir(parents=True)
    (out / "run" / "ok.json").write_text(json.dumps({"rows": []}))
    (out / "swapped.json").write_text(json.dumps({"rows": []}))
    (out / "link.json").symlink_to(secret)
    (out / "dirlink").symlink_to(elsewhere, target_is_directory=True)
    (out / "run" / "fig.png").symlink_to(secret)

    app = create_app(_NoWorkflows(), token="t", results_dirs=[("local", str(out))])  # type: ignore[arg-type]
    with TestClient(app, headers={"authorization": "Bearer t"}) as c:
        ids = sorted(e["id"] for e in c.get("/v1/results").json())
        assert ids == ["local/run/ok.json", "local/swapped.json"]
        assert all(e["figure"] is None for e in c.get("/v1/results").json())
        for rid in ("local/link.json", "local/dirlink/inner.json"):
            assert c.get(f"/v1/results/{rid}").status_code == 404
        assert c.get("/v1/results/local/run/ok.json/figure").status_code == 404
        # listed, then swapped for a link before it is read
        (out / "swapped.json").unlink()
        (out / "swapped.json").symlink_to(secret)
        r = c.get("/v1/results/local/swapped.json")
        assert r.status_code == 404 and "hunter2" not in r.text
        # a directory on the way swapped for a link
        (out / "run" / "ok.json").unlink()
        (out / "run" / "fig.png").unlink()
        (out / "run").rmdir()
        (out / "run").symlink_to(elsewhere, target_is_directory=True)
        (elsewhere / "ok.json").write_text(json.dumps({"password": "hunter2"}))
        r = c.get("/v1/results/local/run/ok.json")
        assert r.status_code == 404 and "hunter2" not in r.text
    # what reads them, between a listing and a read: a link, last or on the way, is never followed
    for rel in ("swapped.json", "run/ok.json", "link.json", "dirlink/inner.json", "../secret.json"):
        with pytest.raises(NotInside):
            read_inside(out, rel, 1 << 20)
    assert read_inside(elsewhere, "inner.json", 1 << 20) == (elsewhere / "inner.json").read_bytes()

    cwd = tmp_path / "cwd"
    (cwd / "out").mkdir(parents=True)
    monkeypatch.chdir(cwd)
    cwd.chmod(0o755)
    (cwd / "out").chmod(0o777)  # anyone may plant files
    assert "local" not in dict(default_results_dirs())
    (cwd / "out").chmod(0o755)
    assert dict(default_results_dirs()).get("local") == str(Path(cwd / "out"))
    cwd.chmod(0o777)  # anyone may rename it away and put their own in its place
    assert "local" not in dict(default_results_dirs())
    cwd.chmod(0o1777)  # sticky, as /tmp: only its owner may
    assert dict(default_results_dirs()).get("local") == str(Path(cwd / "out"))
