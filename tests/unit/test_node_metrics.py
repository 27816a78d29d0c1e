"""The node daemons' figures through the gateway (issue 19): ``GET /v1/nodes``, ``GET
/v1/nodes/{node}/objects/{ref}``, and ``/metrics`` parsed whole by ``prometheus_client``'s own parser:
the node families, their types, label sets, units and values."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_gateway import AUTH, SPEC, TOKEN, FakeRuntime  # pytest puts this directory on sys.path

from gfaas.dataplane.ids import object_id
from gfaas.errors import NotFound
from gfaas.runtime.gateway import create_app
from gfaas.runtime.gateway.node_metrics import MAX_AGE_S, NODE_COUNTERS

OID = "0123456789abcdef0123456789abcdef"


def snap(node_id: str, live: int) -> dict[str, Any]:
    return {
        "node": node_id, "node_id": node_id, "time": 1700000000.5,
        "tiers": [
            {"name": "host", "bytes_live": live, "bytes_reserved": 4096, "bytes_target": 1024,
             "capacity_bytes": 1 << 30, "objects": 3, "bytes_pooled": 0},
            {"name": "gpu0", "bytes_live": 10, "bytes_reserved": 2048, "bytes_target": 2048,
             "capacity_bytes": 1 << 20, "objects": 1, "bytes_pooled": 512},
            {"name": "disk", "bytes_live": 7, "bytes_reserved": 7, "bytes_target": 0, "capacity_bytes": 0,
             "objects": 1, "bytes_pooled": 0},
        ],
        "counters": {"evictions": 5, "restores": 2, "spills": 1, "bytes_spilled": 700, "bytes_restored": 300,
                     "released_unread": 0, "migrations": 1, "bytes_delivered": 64, "deliveries_to_device": 2,
                     "deliveries_to_host": 1, "connections": 4, "invocations": 2, "writing": 0},
        "links": {"h2d:gpu0": 11, "d2h:gpu0": 12, "peer:gpu1->gpu0": 13, "disk-write": 700, "disk-read": 300,
                  "net-in": 0, "net-out": 9},
    }


class NodeRuntime(FakeRuntime):
    """The gateway's fake runtime, with two nodes' snapshots and one object on n1."""

    def __init__(self) -> None:
        super().__init__()
        self.snaps = [snap("n0", 100), snap("n1", 200)]
        self.snapshot_calls = 0

    def node_snapshots(self) -> list[dict[str, Any]]:
        self.snapshot_calls += 1
        return copy.deepcopy(self.snaps)

    def node_object(self, node: str, ref: Any) -> dict[str, Any]:
        if node not in ("n0", "n1"):
            raise NotFound(f"no node {node!r} is used by this runtime; its nodes: ['n0', 'n1']")
        oid = object_id(ref)  # InvalidDataRef for a ref that names no object
        if node != "n1" or oid.hex() != OID:
            raise NotFound(f"object {oid.hex()} is not on node {node}")
        return {"id": OID, "invocation": "ab" * 16, "producer": "f", "consumers": ["g"], "readers_left": ["g"],
                "nbytes": 40, "dtype": "<f4", "shape": [10], "state": "sealed", "tier": "gpu0", "age_s": 1.25}


@pytest.fixture
def nrt() -> NodeRuntime:
    r = NodeRuntime()
    r.deploy(SPEC)
    return r


@pytest.fixture
def client(nrt: NodeRuntime) -> Iterator[TestClient]:
    with TestClient(create_app(nrt, token=TOKEN, sweep_interval_s=3600), headers=AUTH) as c:
        yield c


def families(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def series(fam: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value for s in fam.samples}


def test_the_whole_metrics_text_parses_and_has_the_node_families(client: TestClient) -> None:
    r = client.get("/metrics")
    assert r.status_code == 200
    fams = families(r.text)  # raises on any line prometheus_client cannot read
    assert {f.name for f in fams.values()} >= {"gfaas_invocations", "gfaas_queue_depth"}  # the others are still there
    tb = fams["gfaas_node_tier_bytes"]
    assert tb.type == "gauge" and tb.unit in ("", "bytes")
    got = series(tb)
    assert {dict(k[1])["state"] for k in got} == {"live", "reserved", "target", "capacity"}
    assert {frozenset(dict(k[1])) for k in got} == {frozenset({"node", "tier", "state"})}
    lbl = lambda **kw: ("gfaas_node_tier_bytes", frozenset(kw.items()))  # noqa: E731
    assert got[lbl(node="n0", tier="host", state="live")] == 100
    assert got[lbl(node="n1", tier="host", state="live")] == 200
    assert got[lbl(node="n0", tier="gpu0", state="reserved")] == 2048
    assert got[lbl(node="n0", tier="host", state="capacity")] == 1 << 30
    assert lbl(node="n0", tier="disk", state="capacity") not in got  # no cap: no series, rather than a 0
    objs = series(fams["gfaas_node_tier_objects"])
    assert fams["gfaas_node_tier_objects"].type == "gauge"
    assert objs[("gfaas_node_tier_objects", frozenset({"node": "n1", "tier": "gpu0"}.items()))] == 1
    expected = {"gfaas_node_evictions": 5, "gfaas_node_restores": 2, "gfaas_node_spills": 1,
                "gfaas_node_spilled_bytes": 700, "gfaas_node_restored_bytes": 300, "gfaas_node_migrations": 1,
                "gfaas_node_released_unread": 0, "gfaas_node_delivered_bytes": 64}
    assert {n.removesuffix("_total") for n, _, _ in NODE_COUNTERS} == set(expected)
    for name, value in expected.items():
        fam = fams[name]  # the parser names a counter family without its _total
        assert fam.type == "counter", name
        assert series(fam) == {(name + "_total", frozenset({"node": n}.items())): value for n in ("n0", "n1")}
    dl = fams["gfaas_node_deliveries"]
    assert dl.type == "counter" and series(dl)[("gfaas_node_deliveries_total",
                                                frozenset({"node": "n0", "direction": "device"}.items()))] == 2
    links = fams["gfaas_node_link_bytes"]
    assert links.type == "counter"
    got = series(links)
    assert {frozenset(dict(k[1])) for k in got} == {frozenset({"node", "link"})}
    assert got[("gfaas_node_link_bytes_total", frozenset({"node": "n1", "link": "peer:gpu1->gpu0"}.items()))] == 13
    assert len(got) == 2 * 7
    for name, value in (("gfaas_node_connections", 4), ("gfaas_node_invocations", 2)):
        assert fams[name].type == "gauge" and series(fams[name])[(name, frozenset({"node": "n0"}.items()))] == value
    for line in r.text.splitlines():  # every node series has its family's HELP and TYPE lines
        if line.startswith("gfaas_node_"):
            name = line.split("{")[0].split(" ")[0]
            assert f"# HELP {name} " in r.text and f"# TYPE {name} " in r.text, line


def test_a_scrape_asks_the_runtime_once_for_all_families(client: TestClient, nrt: NodeRuntime) -> None:
    client.get("/metrics")
    assert nrt.snapshot_calls == 1
    client.get("/metrics")  # within MAX_AGE_S: the same figures
    assert nrt.snapshot_calls == 1 and MAX_AGE_S > 0


def test_a_failing_runtime_leaves_the_families_empty_not_the_scrape(client: TestClient, nrt: NodeRuntime,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list[dict[str, Any]]:
        raise RuntimeError("daemon gone")

    monkeypatch.setattr(nrt, "node_snapshots", broken)
    c = TestClient(create_app(nrt, token=TOKEN, sweep_interval_s=3600), headers=AUTH)
    r = c.get("/metrics")
    assert r.status_code == 200 and "# TYPE gfaas_node_tier_bytes gauge" in r.text
    assert "gfaas_node_tier_bytes{" not in r.text
    families(r.text)


def test_nodes_endpoint_lists_the_snapshots(client: TestClient) -> None:
    r = client.get("/v1/nodes")
    assert r.status_code == 200
    body = r.json()
    assert [n["node_id"] for n in body["nodes"]] == ["n0", "n1"]
    assert body["nodes"][0] == snap("n0", 100)


def test_object_endpoint(client: TestClient) -> None:
    r = client.get(f"/v1/nodes/n1/objects/{OID}")
    assert r.status_code == 200 and r.json()["tier"] == "gpu0" and r.json()["nbytes"] == 40
    r = client.get(f"/v1/nodes/n0/objects/{OID}")
    assert r.status_code == 404 and r.json()["error"] == "not_found" and OID in r.json()["message"]
    r = client.get(f"/v1/nodes/zz/objects/{OID}")
    assert r.status_code == 404 and "'zz'" in r.json()["message"]
    r = client.get("/v1/nodes/n1/objects/xyz")
    assert r.status_code == 400 and r.json()["error"] == "bad_request" and "'xyz'" in r.json()["message"]


def test_node_routes_need_the_token_and_a_runtime_that_reports(client: TestClient) -> None:
    assert TestClient(client.app).get("/v1/nodes").status_code == 401
    bare = FakeRuntime()  # no node_snapshots, no node_object
    with TestClient(create_app(bare, token=TOKEN, sweep_interval_s=3600), headers=AUTH) as c:
        r = c.get("/v1/nodes")
        assert r.status_code == 501 and r.json()["error"] == "not_implemented"
        assert c.get(f"/v1/nodes/n0/objects/{OID}").status_code == 501
        text = c.get("/metrics").text
        assert "# TYPE gfaas_node_link_bytes_total counter" in text and "gfaas_node_link_bytes_total{" not in text
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/nodes", "/v1/nodes/{node}/objects/{ref}"} <= set(paths)
