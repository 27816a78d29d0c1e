"""The node endpoints and the node figures on /metrics in front of the real local runtime and its daemon
(issue 19): a put shows on ``GET /v1/nodes`` and on ``gfaas_node_tier_bytes``, its object on
``GET /v1/nodes/rt0/objects/ID`` until its invocation ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

import gfaas
from gfaas.config import KiB, MiB
from gfaas.runtime.gateway import create_app
from gfaas.runtime.local import LocalRuntime, RuntimeConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOKEN = "integration-test-token-nodes-0123456789"
AUTH = {"authorization": f"Bearer {TOKEN}"}
BIG = 512 * KiB  # a segment of its own: sealed with a reply, so the next snapshot sees it


@pytest.fixture(scope="module")
def runtime() -> Iterator[LocalRuntime]:
    rt = LocalRuntime(RuntimeConfig(node_capacity_bytes=64 * MiB))
    try:
        yield rt
    finally:
        rt.close()


def host(node: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in node["tiers"] if t["name"] == "host")


def test_a_put_shows_on_the_node_endpoints_and_metrics(runtime: LocalRuntime) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with TestClient(create_app(runtime, token=TOKEN, sweep_interval_s=3600), headers=AUTH) as c:
        before = c.get("/v1/nodes").json()["nodes"]
        assert [(n["node"], n["node_id"]) for n in before] == [("rt0", "rt0")]
        assert runtime.node_snapshots()[0]["node_id"] == "rt0"
        inv = runtime.nodes.admin.open_invocation("wf", ["f", "g"])
        client = gfaas.connect(inv.credentials("f"))
        try:
            ref = client.put(np.ones(BIG, np.uint8), consumers=["g"])
            after = c.get("/v1/nodes").json()["nodes"]
            assert host(after[0])["bytes_live"] - host(before[0])["bytes_live"] == BIG
            r = c.get(f"/v1/nodes/rt0/objects/{ref.id.hex()}")
            assert r.status_code == 200
            assert {k: r.json()[k] for k in ("id", "producer", "consumers", "nbytes", "tier", "state")} == {
                "id": ref.id.hex(), "producer": "f", "consumers": ["g"], "nbytes": BIG, "tier": "host",
                "state": "sealed"}
            fams = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
            live = {s.labels["tier"]: s.value for s in fams["gfaas_node_tier_bytes"].samples
                    if s.labels["node"] == "rt0" and s.labels["state"] == "live"}
            assert live["host"] == host(c.get("/v1/nodes").json()["nodes"][0])["bytes_live"] >= BIG
            assert {s.labels["link"] for s in fams["gfaas_node_link_bytes"].samples} >= {"net-in", "net-out",
                                                                                       "disk-write", "disk-read"}
            runtime.nodes.admin.end_invocation(inv)
            r = c.get(f"/v1/nodes/rt0/objects/{ref.id.hex()}")
            assert r.status_code == 404 and ref.id.hex() in r.json()["message"]
            assert c.get(f"/v1/nodes/nope/objects/{ref.id.hex()}").status_code == 404
        finally:
            client.close()
