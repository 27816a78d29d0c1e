"""The stats stream through a real daemon process (issue 19): ``Admin.snapshot()`` counts a put's bytes
exactly on the right tier and agrees with ``Admin.stats()``; ``Admin.object_info()`` describes one
object; both are refused without the admin token; bad references are errors naming the value."""

from __future__ import annotations

import socket
from typing import Any

import numpy as np
import pytest

from gfaas import AuthenticationError, InvalidDataRef
from gfaas.config import KiB, MiB
from gfaas.dataplane import protocol as P
from gfaas.errors import NotFound

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BIG = 512 * KiB  # over small_object_max (256 KiB with the fixture's 1 MiB slabs): sealed with a reply


def tier(snap: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in snap["tiers"] if t["name"] == name)


def test_a_put_adds_its_bytes_to_the_host_tier_and_a_read_removes_them(node: Any) -> None:
    before = node.admin.snapshot()
    assert before["node_id"] == "n0" and [t["name"] for t in before["tiers"]] == ["host", "disk"]
    assert tier(before, "host")["capacity_bytes"] == 256 * MiB
    f, g = node.connect("f"), node.connect("g")
    ref = f.put(np.ones(BIG, np.uint8), consumers=["g"])
    after = node.admin.snapshot()
    assert tier(after, "host")["bytes_live"] - tier(before, "host")["bytes_live"] == BIG
    assert tier(after, "host")["objects"] - tier(before, "host")["objects"] == 1
    assert tier(after, "host")["bytes_reserved"] >= BIG
    assert after["counters"]["invocations"] == 1 and after["counters"]["sessions"] == 2
    assert after["counters"]["connections"] >= 3  # the admin's and the two functions'
    assert after["time"] >= before["time"]
    st = node.stats()  # settles everything first: the cheap figures agree with it
    snap = node.admin.snapshot()
    assert tier(snap, "host")["bytes_live"] == st["bytes_live"] and tier(snap, "host")["bytes_reserved"] == st["bytes_reserved"]
    assert tier(snap, "host")["objects"] == st["objects"] + st["writing"]
    assert {k: snap["counters"][k] for k in ("evictions", "restores", "bytes_spilled")} == \
        {k: st[k] for k in ("evictions", "restores", "bytes_spilled")}
    g.get(ref)  # its one consumer read it: freed
    assert tier(node.admin.snapshot(), "host")["bytes_live"] == tier(before, "host")["bytes_live"]


@pytest.mark.node_config(capacity_bytes=2 * MiB, slab_bytes=256 * KiB, quota_reserved_bytes=2 * MiB,
                         quota_spill_bytes=1 << 40, spill_capacity_bytes=64 * MiB)
def test_evictions_to_disk_show_as_tier_bytes_spills_and_link_bytes(node: Any) -> None:
    f = node.connect("f")
    blob = 600 * KiB
    refs = [f.put(np.full(blob, i, np.uint8), consumers=["g"]) for i in range(6)]
    st = node.stats()  # waits for the spills in flight, so the snapshot below sees them finished
    snap = node.admin.snapshot()
    disk = tier(snap, "disk")
    assert st["evictions"] >= 1 and disk["objects"] == st["objects_on_disk"] and disk["bytes_live"] == \
        disk["objects"] * blob
    assert disk["bytes_reserved"] == st["bytes_on_disk"] and disk["capacity_bytes"] == 64 * MiB
    assert tier(snap, "host")["bytes_live"] + disk["bytes_live"] == 6 * blob
    c = snap["counters"]
    assert c["spills"] >= 1 and c["bytes_spilled"] == st["bytes_spilled"] == snap["links"]["disk-write"]
    g = node.connect("g")
    for i, ref in enumerate(refs):
        assert g.get(ref, copy=True)[0] == i
    snap = node.admin.snapshot()
    assert snap["counters"]["restores"] >= 1 and snap["links"]["disk-read"] == snap["counters"]["bytes_restored"] > 0


def test_object_info_of_a_put(node: Any) -> None:
    f = node.connect("f")
    ref = f.put(np.arange(BIG // 8, dtype=np.int64), consumers=["g", "h"])
    info = node.admin.object_info(ref)
    assert {k: info[k] for k in ("id", "invocation", "producer", "consumers", "readers_left", "nbytes", "shape",
                                 "state", "tier")} == {
        "id": ref.id.hex(), "invocation": node.inv.id, "producer": "f", "consumers": ["g", "h"],
        "readers_left": ["g", "h"], "nbytes": BIG, "shape": [BIG // 8], "state": "sealed", "tier": "host"}
    assert 0 <= info["age_s"] < 60
    assert node.admin.object_info(str(ref))["id"] == node.admin.object_info(ref.id.hex())["id"] == ref.id.hex()
    node.connect("g").get(ref)
    assert node.admin.object_info(ref)["readers_left"] == ["h"]


def test_object_info_errors_name_the_value(node: Any) -> None:
    with pytest.raises(InvalidDataRef, match="'not-a-ref' names no object"):
        node.admin.object_info("not-a-ref")
    with pytest.raises(InvalidDataRef, match="object ID 313233 is not 16 bytes"):
        node.admin.object_info(b"123")
    with pytest.raises(NotFound, match=f"object {'ab' * 16} is not on node n0"):
        node.admin.object_info("ab" * 16)
    # A malformed ID sent raw gets the daemon's own answer, naming it too.
    s = _admin_socket(node)
    try:
        s.send(P.encode(P.ObjectInfo(b"\x07" * 3)))
        r = P.decode_reply(s.recv(P.MAX_FRAME))
        assert isinstance(r, P.Error) and r.code == "InvalidDataRef" and "070707" in r.message
    finally:
        s.close()


def _admin_socket(node: Any) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(5)
    s.connect(node.config.socket_path)
    with open(f"{node.config.state_dir}/admin.token") as fh:
        s.send(P.encode(P.AdminHello(fh.read().strip())))
    assert isinstance(P.decode_reply(s.recv(P.MAX_FRAME)), P.AdminWelcome)
    return s


@pytest.mark.parametrize("request_", [P.Snapshot(), P.ObjectInfo(bytes(16))], ids=["Snapshot", "ObjectInfo"])
def test_a_function_connection_is_refused(node: Any, request_: P._Msg) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(5)
    s.connect(node.config.socket_path)
    try:
        s.send(P.encode(P.Hello(node.inv.tokens["f"])))
        assert isinstance(P.decode_reply(s.recv(P.MAX_FRAME)), P.Welcome)
        s.send(P.encode(request_))
        r = P.decode_reply(s.recv(P.MAX_FRAME))
        assert isinstance(r, P.Error) and r.code == AuthenticationError.__name__ and "admin token" in r.message
    finally:
        s.close()
    c = node.connect("g")  # and through the client, as its own error class
    with pytest.raises(AuthenticationError, match="needs the node's admin token"):
        c._call(request_)
