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


def test_discover_can_skip_a_forged_entry_and_keep_the_others(caplog: pytest.LogCaptureFixture) -> None:
    """A running gateway's look (skip_bad): a forged entry is left out with a warning naming it; the
    genuine ones are listed (at start, the same entry stops the join: the test above)."""
    r = FakeRedis({"gfaas:nodeinfo:m1": info("m1"), "gfaas:nodeinfo:m3": info("m3", PeerKey(b"x" * 32))})
    assert [n["node"] for n in C.discover(r, KEY, skip_bad=True)] == ["m1"]
    assert "m3" in caplog.text and "MAC" in caplog.text


@pytest.mark.parametrize(("members", "joined", "listed", "failed", "add", "remove"), [
    ({"gw"}, set(), {"m1", "m2"}, {}, ["m1", "m2"], []),  # two new nodes
    ({"gw", "m1"}, {"m1"}, {"m1"}, {}, [], []),  # nothing changed
    ({"gw", "m1", "m2"}, {"m1", "m2"}, {"m2"}, {}, [], ["m1"]),  # m1's entry went: it left
    ({"gw", "m1"}, {"m1"}, set(), {}, [], ["m1"]),  # the directory is empty: every joined node left...
    ({"gw", "a"}, {"m1"}, set(), {}, [], []),  # ...but nodes given or started by the runtime stay
    ({"gw"}, set(), {"m1"}, {"m1": 95.0}, [], []),  # failed 5 s ago: not tried again yet
    ({"gw"}, set(), {"m1"}, {"m1": 90.0}, ["m1"], []),  # failed 10 s ago: tried again
])
def test_membership_changes(members: set[str], joined: set[str], listed: set[str], failed: dict[str, float],
                            add: list[str], remove: list[str]) -> None:
    assert C.membership_changes(members, joined, listed, failed, now=100.0, retry_s=10.0) == (add, remove)


class FakeAdmin:
    """A node's control connection: records what it was asked; ``fail`` makes snapshot raise."""

    def __init__(self, node_id: str, fail: bool = False) -> None:
        self.node_id, self.fail = node_id, fail
        self.opened: list[tuple[str, list[str], str, dict[str, str] | None]] = []
        self.closed = False

    def snapshot(self) -> dict[str, Any]:
        if self.fail:
            from gfaas.errors import DaemonUnavailable

            raise DaemonUnavailable("connection refused")
        return {}

    def open_invocation(self, workflow: str, functions: list[str], inv: str,
                        tokens: dict[str, str] | None = None) -> None:
        self.opened.append((workflow, functions, inv, tokens))

    def close(self) -> None:
        self.closed = True


def test_refresh_adds_a_joined_node_with_the_invocations_in_flight_and_removes_one_that_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that registers is connected, opens every invocation open now (with the key's tokens), and
    joins the node maps as new dicts; one that does not answer is retried only after RETRY_JOIN_S; a
    node whose entry goes is removed, marked left (never up), its connection closed, and on_change told."""
    from gfaas.runtime.config import NodeEndpoint, RuntimeConfig
    from gfaas.runtime.nodes import Nodes

    nodes = Nodes(RuntimeConfig(), [])
    data: dict[str, Any] = {}
    nodes.cluster = C.Cluster(KEY, FakeRedis(data))
    gw = FakeAdmin("gw")
    nodes.nodes, nodes.admins, nodes.admin = {"gw": NodeEndpoint("gw", "/s")}, {"gw": gw}, gw
    nodes._track = True
    admins = {"m1": FakeAdmin("m1"), "m2": FakeAdmin("m2", fail=True)}
    monkeypatch.setattr(nodes, "connect_admin", lambda n: admins[n.name])
    changes: list[tuple[list[str], list[str]]] = []
    nodes.on_change = lambda added, removed: changes.append((added, removed))

    nodes.open("wf", ["a", "b"], "inv1")
    nodes.open("wf", ["a", "b"], "inv2")
    nodes.end(type("Inv", (), {"id": "inv2", "kind": "gfaas", "refs": {}})())  # inv2 ended: not in flight
    data["gfaas:nodeinfo:m1"], data["gfaas:nodeinfo:m2"] = info("m1"), info("m2")
    before = nodes.nodes
    assert nodes.refresh(now=100.0) == (["m1"], [])
    assert admins["m1"].opened == [("wf", ["a", "b"], "inv1", KEY.function_tokens("inv1", ["a", "b"]))]
    assert list(nodes.nodes) == ["gw", "m1"] and list(before) == ["gw"]  # a new dict: iterators unharmed
    assert nodes.cluster.node_ids == {"gw": "gw", "m1": "m1"}
    assert nodes.refresh(now=105.0) == ([], [])  # m2 failed at 100: not before 110
    admins["m2"].fail = False
    assert nodes.refresh(now=110.0) == (["m2"], [])
    nodes.open("wf", ["a"], "inv3")  # opened on every member, m2 included
    assert admins["m2"].opened[-1][2] == "inv3"

    del data["gfaas:nodeinfo:m1"]
    assert nodes.refresh(now=111.0) == ([], ["m1"])
    assert "m1" not in nodes.nodes and "m1" not in nodes.admins and admins["m1"].closed
    assert not nodes.cluster.up("m1")
    assert changes == [(["m1"], []), (["m2"], []), ([], ["m1"])]
    data["gfaas:nodeinfo:m1"] = info("m1")  # it comes back
    assert nodes.refresh(now=112.0) == (["m1"], []) and nodes.cluster.up("m1")
    # With invocations opened lazily (key and locality), a node that joins opens nothing now: each
    # in-flight invocation opens there with its first task (a second open would be refused there).
    nodes.locality = True
    admins["m3"] = FakeAdmin("m3")
    data["gfaas:nodeinfo:m3"] = info("m3")
    assert nodes.refresh(now=113.0) == (["m3"], []) and admins["m3"].opened == []
