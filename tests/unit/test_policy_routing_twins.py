"""Route sets of identical nodes: on a cluster built by ``Topology.replicate`` the Router renames an
earlier node's same-node route set instead of solving the same maximum flows again (issue 24: a
Router on 128 nodes). The renamed sets must equal what ``route_set`` computes for the pair."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gfaas.policy import Router, RoutingOptions
from gfaas.policy.paths import route_set
from gfaas.policy.routing import _twin_nodes, _twin_route_set
from gfaas.sim.systems import SYSTEMS
from gfaas.topology import Device, Link, Topology, preset

# Every test here runs on each implementation (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("router_class")

OPTIONS = sorted({s.routing for s in SYSTEMS.values()} | {
    RoutingOptions(), RoutingOptions(max_flow=False), RoutingOptions(load_paths="all"),
    RoutingOptions(load_paths="greedy"), RoutingOptions(min_cost=False), RoutingOptions(max_hops=2),
    RoutingOptions(topology_aware=False)}, key=repr)


@pytest.mark.parametrize("name", ["dgx-a100*3", "dgx-v100*3", "4xa10*3"])
def test_renamed_route_sets_equal_route_set_on_every_pair(name: str) -> None:
    topo = preset(name)
    assert set(_twin_nodes(topo)) == {2}  # node 0 also holds the fabric; node 1 is the first copy
    checked = 0
    for opts in OPTIONS:
        for node in topo.nodes:
            ends = topo.of_kind("gpu", node) + topo.of_kind("host", node)[:1]
            for a in ends:
                for b in ends:
                    twin = _twin_route_set(topo, a, b, opts)
                    if a == b or node != 2:
                        assert twin is None
                        continue
                    assert twin == route_set(topo, a, b, opts), (a, b, opts)
                    checked += 1
    assert checked == len(OPTIONS) * (len(topo.of_kind("gpu", 2)) + 1) * len(topo.of_kind("gpu", 2))


def test_a_node_that_differs_is_not_a_twin() -> None:
    """Node 2 with one NVLink at another rate: its route sets are computed, not renamed."""
    topo = preset("dgx-v100*3")
    links = tuple(replace(ln, gbps=ln.gbps / 2) if (ln.a, ln.b) == ("n2.gpu0", "n2.gpu3") else ln
                  for ln in topo.links)
    assert links != topo.links
    odd = Topology("odd", topo.devices, links)
    assert dict(_twin_nodes(odd)) == {}
    assert _twin_route_set(odd, "n2.gpu0", "n2.gpu3", RoutingOptions()) is None


def test_router_plans_the_same_with_and_without_precomputed_route_sets() -> None:
    topo = preset("dgx-a100*3")
    lazy, eager = Router(topo, precompute=False), Router(topo)
    for i, (a, b) in enumerate([("n2.gpu0", "n2.gpu5"), ("n2.host", "n2.gpu1"), ("n2.gpu3", "n2.host"),
                                ("n1.gpu0", "n2.gpu0"), ("n0.gpu2", "n0.gpu7")]):
        assert lazy.plan(i, a, b) == eager.plan(i, a, b)


def test_devices_outside_the_prefix_scheme_get_no_twins() -> None:
    devs = (Device("host", "host", 0), Device("g", "gpu", 0), Device("h2", "host", 1), Device("g2", "gpu", 1))
    topo = Topology("flat", devs, (Link("host", "g", "pcie", 10), Link("h2", "g2", "pcie", 10)))
    assert dict(_twin_nodes(topo)) == {}
