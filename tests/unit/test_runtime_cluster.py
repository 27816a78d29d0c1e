"""The runtime's view of a multi-machine cluster (gfaas.runtime.cluster): joined nodes found in the
directory (forged entries refused), input locations from MACed entries, nodes left out while down."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gfaas.dataplane.peer_auth import PeerKey
from gfaas.errors import AuthenticationError
from gfaas.runtime import cluster as C

KEY = PeerKey(b"k" * 32)


class FakeRedis:
    """The few Redis calls the runtime makes, on a dict (GET, SCAN, HGETALL in a pipeline)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self._batch: list[str] = []

    def scan_iter(self, match: str, count: int) -> list[str]:
        return [k for k in self.data if k.startswith(match.rstrip("*"))]

    def get(self, k: str) -> Any:
        return self.data.get(k)

    def pipeline(self, transaction: bool = False) -> FakeRedis:
        self._batch = []
        return self

    def hgetall(self, k: str) -> None:
        self._batch.append(k)

    def execute(self) -> list[Any]:
        return [dict(self.data.get(k) or {}) for k in self._batch]


def info(node: str, key: PeerKey = KEY, **change: str) -> str:
    fields = {"address": f"10.0.0.{len(node)}:7070", "socket": f"/run/gfaas/{node}.sock"}
    fields["mac"] = key.entry_mac("nodeinfo", node, fields)
    fields.update(change)
    return json.dumps(fields)


def test_discover_lists_registered_nodes_and_refuses_a_forged_one() -> None:
    """Entries MACed with the key are listed; one written without it (or edited) stops the join, naming it."""
    r = FakeRedis({"gfaas:nodeinfo:m1": info("m1"), "gfaas:nodeinfo:m2": info("m2")})
    assert C.discover(r, KEY) == [{"node": "m1", "address": "10.0.0.2:7070", "socket": "/run/gfaas/m1.sock"},
                                  {"node": "m2", "address": "10.0.0.2:7070", "socket": "/run/gfaas/m2.sock"}]
    for bad in (info("m3", PeerKey(b"x" * 32)), info("m3", address="6.6.6.6:1"), "not json"):
        with pytest.raises(AuthenticationError, match="m3"):
            C.discover(FakeRedis({"gfaas:nodeinfo:m3": bad}), KEY)


def _obj(oid: str, node: str, nbytes: int, key: PeerKey = KEY) -> dict[str, str]:
    fields = {"node": node, "invocation": "ab" * 16, "producer": "a", "nbytes": str(nbytes)}
    fields["mac"] = key.entry_mac("obj", oid, fields)
    return fields


def test_input_bytes_come_from_verified_directory_entries() -> None:
    """Bytes per node from the directory (runtime names for node IDs); an unknown or forged entry counts
    one byte on the node its reference names."""
    a, b, c = "11" * 16, "22" * 16, "33" * 16
    r = FakeRedis({f"gfaas:obj:{a}": _obj(a, "n-1", 4096), f"gfaas:obj:{b}": _obj(b, "m2", 100),
                   f"gfaas:obj:{c}": _obj(c, "m2", 1 << 30, PeerKey(b"x" * 32))})
    cl = C.Cluster(KEY, r, node_ids={"n-1": "m1"})
    refs = [f"gfaas://n-1/{a}", f"gfaas://m2/{b}", f"gfaas://m3/{c}", f"gfaas://m3/{'44' * 16}", "redis:x"]
    assert cl.input_bytes(refs) == {"m1": 4096, "m2": 100, "m3": 2}


def test_a_down_node_is_left_out_until_its_daemon_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Marked down: out for DOWN_S; then one probe per period decides; a failing probe keeps it out."""
    now = [100.0]
    monkeypatch.setattr(C.time, "monotonic", lambda: now[0])
    answers: list[bool] = []

    def probe(node: str) -> None:
        answers.append(True)
        if len(answers) == 1:
            raise ConnectionRefusedError(node)

    cl = C.Cluster(KEY, probe=probe)
    assert cl.up("m2")
    cl.mark_down("m2", "test")
    assert not cl.up("m2")
    now[0] += C.DOWN_S
    assert not cl.up("m2") and len(answers) == 1  # probed, refused
    assert not cl.up("m2") and len(answers) == 1  # not probed again within the period
    now[0] += C.DOWN_S
    assert cl.up("m2") and len(answers) == 2
    assert cl.up("m2") and len(answers) == 2  # up: no probe


def test_ray_nodes_need_a_live_ray_node_with_cpus() -> None:
    """A gfaas node counts under Ray only if a live Ray node with CPUs advertises its resource."""

    class FakeRay:
        @staticmethod
        def nodes() -> list[dict[str, Any]]:
            return [{"Alive": True, "Resources": {"CPU": 0.0, "gfaas_node_head": 1000.0}},
                    {"Alive": True, "Resources": {"CPU": 2.0, "gfaas_node_m1": 1000.0}},
                    {"Alive": False, "Resources": {"CPU": 2.0, "gfaas_node_m2": 1000.0}}]

    assert C.Cluster(KEY).ray_nodes(FakeRay(), ["head", "m1", "m2", "gateway"]) == {"m1"}


def test_runtime_config_names_a_join_without_key_or_with_nodes() -> None:
    """join needs the cluster key; join and explicit nodes are exclusive: each error names the fix."""
    from gfaas.errors import ConfigError
    from gfaas.runtime.local import NodeEndpoint, RuntimeConfig

    with pytest.raises(ConfigError, match="cluster_key_file"):
        RuntimeConfig(join="redis://h:6379/0")
    with pytest.raises(ConfigError, match="not both"):
        RuntimeConfig(join="redis://h:6379/0", cluster_key_file="/k", nodes=(NodeEndpoint("a", "/s"),))
