"""Candidate routes between two devices, enumerated once per (source, destination) pair.

The router never searches the graph while it plans: every route a transfer between two devices
could use is listed here once, ranked statically, and the router only evaluates live residual
bandwidth over those lists. What a route *may* look like follows the two seed papers:

* GPU to GPU on one node: loop-free NVLink routes of up to ``max_hops`` GPU-to-GPU hops (seed 000
  §6.2, seed 001 §4.3.3), the one-hop route being the *direct* link; crossing an NVSwitch counts as
  a single hop. PCIe peer-to-peer is the fallback when no NVLink route can carry anything.
* Host and GPU on one node: the GPU's own PCIe path, plus *route GPUs* on other PCIe switches that
  forward over NVLink (seed 001 §4.3.1, "gFn-host"), one per switch because two GPUs behind one
  switch share its single uplink (seed 001 §3.2.2).
* Across nodes: GPUDirect through the NIC on the GPU's own switch, plus the other NICs reached
  through route GPUs on their switches, pairing NICs of the same index on both ends (seed 001
  §4.3.1, "cross-node gFn-gFn").

Topology-oblivious harvesting (``topology_aware=False``, what DeepPlan+ does) uses every peer GPU
whatever its switch or NVLink; a peer without NVLink then forwards over PCIe through the root
complex, and the route lists those hops honestly (the host device and a switch may appear twice,
each directed edge once), so the contention it causes on the target's own link is visible.

**Max-flow path sets.** Enumerating short routes and taking them greedily is not enough: on
dgx-v100 it left gpu0 -> gpu5 at 120 GB/s where the NVLink mesh carries 144. So for GPU pairs
(multipath) and for host <-> GPU (topology-aware route GPUs) the first candidates are the paths of
a maximum flow on the idle machine (:func:`flow_paths`), each with the rate it carries there
(``Route.share``). The flow runs over the links a route of that kind may use:

* GPU to GPU: NVLink edges between GPUs and NVSwitches of the node;
* host to GPU: PCIe edges going *down* (host -> switch, switch -> switch, switch -> GPU), then
  NVLink; GPU to host is the mirror image (NVLink, then PCIe *up*), computed on the reverse
  directions' own capacities (``gbps_back``), not by reversing the forward answer.

So no route goes up and down the PCIe tree or through host memory. The pair's direct path is
filled first and kept whole (for a direct link this costs nothing, since every cut between the two
ends crosses it; for two-edge direct paths, through an NVSwitch or a PCIe switch, the property
tests check the result against a brute-force minimum cut).
Paths are loop-free but their length is not bounded: ``max_hops`` bounds only the extra,
enumerated routes that the planner falls back on when links are busy. The one-route-GPU-per-switch
rule is not needed for the flow paths: a switch's uplink is an edge of the flow, so two route GPUs
behind one switch never get more than the uplink carries (on the presets the target's own path
already fills its switch's uplink, so no flow path uses a GPU on the target's switch).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from ..errors import ConfigError
from ..topology import Edge, Topology
from .maxflow import max_flow, min_cost_max_flow

if TYPE_CHECKING:
    from .routing_options import RoutingOptions

Hops = tuple[str, ...]
RouteKind = Literal["same", "gpu-gpu", "host", "cross"]

#: NVLink routes kept per (GPU, route GPU) pair in a harvesting leg; more only slow planning down.
_LEGS_PER_PEER = 2
#: Candidates kept per harvesting group: per PCIe switch (host routes) and per NIC (cross-node
#: routes, which are long, so fewer alternatives keep planning fast).
_PER_GROUP = 4
_PER_NIC = 2


@dataclass(frozen=True)
class Route:
    """One candidate route.

    ``tier`` orders the search: the planner exhausts lower tiers before looking at higher ones.
    ``group`` names a shared resource of which a transfer may use only one route (one route GPU
    per PCIe switch, one path per NIC). ``cap`` bounds the rate whatever the residuals are (the
    PCIe peer-to-peer rate). ``direct`` marks the transfer's own link, which has priority over
    other transfers' harvested (indirect) routes. ``share`` is the rate the route carries in the
    idle machine's maximum flow (inf for routes outside that flow).
    """

    hops: Hops
    tier: int
    group: str | None = None
    cap: float = math.inf
    direct: bool = False
    share: float = math.inf


@dataclass(frozen=True)
class RouteSet:
    """Everything the router may use for one (source, destination) pair, in preference order."""

    kind: RouteKind
    direct: tuple[Route, ...] = ()
    #: The idle maximum flow's paths besides ``direct``, in order: each is taken up to its ``share``.
    flow: tuple[Route, ...] = ()
    tiers: tuple[tuple[Route, ...], ...] = ()
    fallback: tuple[Route, ...] = ()
    #: Topology-oblivious harvesting: all of ``direct`` and ``tiers`` at once, shared max-min fairly.
    fair: bool = False
    #: NVLink edges out of the source / into the destination: once either side has no residual
    #: left, no further NVLink route can carry anything, so the search stops early.
    stop_out: tuple[tuple[str, str], ...] = ()
    stop_in: tuple[tuple[str, str], ...] = ()
    #: Whether busy-path balancing (seed 001 Algorithm 1 lines 8-14) applies.
    balance: bool = False
    #: The idle machine's maximum flow over the links this kind of route may use (0 if not computed).
    flow_gbps: float = 0.0
    #: Whether ``load_tiers`` replace ``flow`` and ``tiers`` once other transfers hold links.
    load: bool = False
    #: Under load: short routes only, tier by tier (see :func:`route_set`).
    load_tiers: tuple[tuple[Route, ...], ...] = ()


# ---- small topology helpers ---------------------------------------------------------------------------
def gpus_on_switch(topo: Topology, switch: str) -> list[str]:
    return [e.dst for e in topo.out_edges(switch) if e.kind == "pcie" and topo.device(e.dst).kind == "gpu"]


def local_name(name: str) -> str:
    """``n1.nic2`` -> ``nic2``: the per-node name used to pair NICs of the same index."""
    return name.rpartition(".")[2]


# ---- NVLink and PCIe routes -------------------------------------------------------------------------
def nvlink_routes(topo: Topology, a: str, b: str, max_hops: int) -> list[tuple[Hops, int, float]]:
    """Loop-free NVLink routes a -> b as ``(hops, gpu_hops, static width)``, best first.

    A GPU-to-GPU hop is an edge into a GPU; passing an NVSwitch adds no hop (it is a crossbar, and
    ``Topology.nvlink_gbps`` counts it as direct). Ranking: fewer hops, then wider, then by name.
    """
    node = topo.device(a).node
    found: list[tuple[Hops, int, float]] = []

    def walk(path: Hops, hops: int, width: float) -> None:
        for e in topo.out_edges(path[-1]):
            if e.kind != "nvlink" or e.dst in path:
                continue
            d = topo.device(e.dst)
            if d.node != node:
                continue
            w = min(width, e.gbps)
            if d.kind == "gpu":
                if e.dst == b:
                    found.append((path + (b,), hops + 1, w))
                elif hops + 2 <= max_hops:  # an intermediate GPU needs at least one more hop after it
                    walk(path + (e.dst,), hops + 1, w)
            elif d.kind == "nvswitch":
                walk(path + (e.dst,), hops, w)

    walk((a,), 0, math.inf)
    found.sort(key=lambda r: (r[1], -r[2], r[0]))
    return found


def pcie_p2p_route(topo: Topology, a: str, b: str) -> Hops | None:
    """GPU a -> GPU b over PCIe: through their shared switch, else up through the root complex."""
    sa, sb = topo.pcie_switch_of(a), topo.pcie_switch_of(b)
    if sa is None or sb is None:
        return None
    if sa == sb:
        return (a, sa, b)
    return (a, sa, topo.host_of(topo.device(a).node), sb, b)


def _leg_via_p2p(topo: Topology, r: str, t: str) -> Hops | None:
    """GPU r -> GPU t over PCIe when they have no NVLink, as hops (the part after r)."""
    p = pcie_p2p_route(topo, r, t)
    return None if p is None else p[1:]


# ---- maximum-flow path sets -------------------------------------------------------------------------
FlowKind = Literal["nvlink", "down", "up"]


def _relay(topo: Topology, name: str, node: int) -> bool:
    d = topo.device(name)
    return d.node == node and d.kind in ("gpu", "nvswitch")


def flow_edge_ok(topo: Topology, e: Edge, kind: FlowKind, node: int) -> bool:
    """Whether directed edge ``e`` may carry a route of ``kind`` on ``node`` (see the module docstring).

    ``nvlink``: GPU to GPU, NVLink between GPUs and NVSwitches. ``down``: host to GPU, PCIe from
    the host or a switch to a switch or a GPU, plus NVLink. ``up``: GPU to host, the mirror image.
    """
    if e.kind == "nvlink":
        return _relay(topo, e.src, node) and _relay(topo, e.dst, node)
    if kind == "nvlink" or e.kind != "pcie":
        return False
    a, b = topo.device(e.src), topo.device(e.dst)
    if a.node != node or b.node != node:
        return False
    if kind == "down":
        return a.kind in ("host", "pcie") and b.kind in ("pcie", "gpu")
    return a.kind in ("gpu", "pcie") and b.kind in ("pcie", "host")


def flow_edges(topo: Topology, kind: FlowKind, node: int) -> list[tuple[str, str, float]]:
    """The directed edges ``(a, b, GB/s)`` a maximum flow of ``kind`` on ``node`` runs over."""
    # Only same-node edges can qualify; scanning just those keeps a cluster's Router build linear.
    return [(e.src, e.dst, e.gbps) for e in topo.node_edges(node) if flow_edge_ok(topo, e, kind, node)]


@lru_cache(maxsize=4096)
def flow_paths(topo: Topology, src: str, dst: str, first: tuple[Hops, ...] = (), min_cost: bool = True
               ) -> tuple[float, tuple[tuple[Hops, float], ...]]:
    """Maximum flow src -> dst on the idle machine, as loop-free paths with rates (``first`` first).

    Which links count depends on the endpoints (same node only): GPU to GPU over NVLink; host to
    GPU down the PCIe tree then NVLink; GPU to host the reverse, on the reverse capacities.
    Computed once per topology and pair (cached), when a :class:`~gfaas.policy.Router` first
    plans the pair or, for all same-node pairs, when it is built.
    """
    ds, dd = topo.device(src), topo.device(dst)
    if src == dst or ds.node != dd.node:
        raise ConfigError(f"flow_paths({src!r}, {dst!r}): give two different devices on one node")
    kinds = {("gpu", "gpu"): "nvlink", ("host", "gpu"): "down", ("gpu", "host"): "up"}
    kind = kinds.get((ds.kind, dd.kind))
    if kind is None:
        raise ConfigError(
            f"flow_paths({src!r}, {dst!r}): endpoints are a {ds.kind} and a {dd.kind};"
            " use two GPUs, or the host and a GPU"
        )
    solve = min_cost_max_flow if min_cost else max_flow
    value, paths = solve(flow_edges(topo, kind, ds.node), src, dst, first)  # type: ignore[arg-type]
    return value, tuple(paths)


# ---- route sets -------------------------------------------------------------------------------------
def route_set(topo: Topology, src: str, dst: str, opts: RoutingOptions) -> RouteSet:
    """All candidate routes src -> dst under ``opts``; raises ConfigError for endpoints it cannot serve."""
    ds, dd = topo.device(src), topo.device(dst)
    for d in (ds, dd):
        if d.kind not in ("gpu", "host"):
            raise ConfigError(
                f"cannot route a transfer from {src!r} to {dst!r}: {d.name!r} is a {d.kind};"
                " transfer endpoints must be a gpu or host device"
            )
    if src == dst:
        return RouteSet("same")
    if ds.node != dd.node:
        return _cross_node(topo, src, dst, opts)
    if ds.kind == "gpu" and dd.kind == "gpu":
        rs = _gpu_gpu(topo, src, dst, opts)
    elif ds.kind == "host":
        rs = _host_gpu(topo, dst, opts, reverse=False)
    else:
        rs = _host_gpu(topo, src, opts, reverse=True)
    if not (opts.max_flow and rs.flow and opts.load_paths != "all"):
        return rs
    # Under load: the greedy planner's enumerated routes instead of the idle flow's detours.
    greedy = route_set(topo, src, dst, replace(opts, max_flow=False))
    tiers = greedy.tiers
    if opts.load_paths == "short":
        limit = 2 if rs.kind == "gpu-gpu" else 1
        tiers = tuple(tuple(r for r in t if nvlink_hops(topo, r.hops) <= limit) for t in tiers)
    return replace(rs, load=True, load_tiers=tuple(t for t in tiers if t))


def nvlink_hops(topo: Topology, hops: Hops) -> int:
    """NVLink hops of a route that end at a GPU (passing an NVSwitch adds none)."""
    n = 0
    for a, b in zip(hops, hops[1:], strict=False):
        if topo.device(b).kind == "gpu" and topo.device(a).kind in ("gpu", "nvswitch"):
            n += 1
    return n


def _gpu_gpu(topo: Topology, src: str, dst: str, opts: RoutingOptions) -> RouteSet:
    limit = opts.max_hops if opts.multipath else 1
    routes = nvlink_routes(topo, src, dst, limit)
    direct = tuple(Route(h, 0, direct=True) for h, k, _ in routes if k == 1)
    flow: tuple[Route, ...] = ()
    tiers: list[tuple[Route, ...]] = []
    value = 0.0
    if opts.multipath and not opts.max_flow:
        for k in range(2, limit + 1):
            tiers.append(tuple(Route(h, k - 1) for h, n, _ in routes if n == k))
    elif opts.multipath:
        value, paths = flow_paths(topo, src, dst, tuple(r.hops for r in direct), opts.min_cost)
        direct_hops = {r.hops for r in direct}
        flow = tuple(Route(h, 1, share=g) for h, g in paths if h not in direct_hops)
        # Busy links: the flow paths may take more than their idle share, and the enumerated
        # short routes (up to max_hops) are the alternatives; one tier, widest first.
        seen = {r.hops for r in flow} | direct_hops
        extra = tuple(Route(h, 2) for h, n, _ in routes if n > 1 and h not in seen)
        tiers.append(tuple(Route(r.hops, 2) for r in flow) + extra)
    p2p = pcie_p2p_route(topo, src, dst)
    fallback = () if p2p is None else (Route(p2p, len(tiers) + 1, cap=topo.pcie_p2p_gbps),)
    out_e = tuple((src, e.dst) for e in topo.out_edges(src) if e.kind == "nvlink")
    in_e = tuple((e.dst, dst) for e in topo.out_edges(dst) if e.kind == "nvlink")
    return RouteSet("gpu-gpu", direct=direct, flow=flow, tiers=tuple(t for t in tiers if t), fallback=fallback,
                    stop_out=out_e, stop_in=in_e, balance=opts.multipath and opts.balance_busy, flow_gbps=value)


def _host_gpu(topo: Topology, gpu: str, opts: RoutingOptions, reverse: bool) -> RouteSet:
    """host -> gpu routes (for gpu -> host the same shapes, hop by hop reversed; the flow paths
    are computed on the reverse directions' own capacities)."""
    node = topo.device(gpu).node
    host = topo.host_of(node)
    own = topo.pcie_switch_of(gpu)
    if own is None:
        raise ConfigError(f"GPU {gpu!r} has no PCIe link in {topo.name!r}; give it one to move data to the host")
    direct = Route((host, own, gpu), 0, direct=True)
    peers: list[Route] = []
    flow: list[Route] = []
    value = 0.0
    if opts.route_gpus and opts.topology_aware:
        leg_hops = max(1, opts.max_hops - 1)
        ranked: list[tuple[tuple[int, float, str, str, Hops], Hops, str]] = []
        for r in topo.of_kind("gpu", node):
            sw = topo.pcie_switch_of(r)
            if r == gpu or sw is None or sw == own:  # same switch: shares the target's uplink
                continue
            for hops, k, w in nvlink_routes(topo, r, gpu, leg_hops)[:_LEGS_PER_PEER]:
                full = (host, sw) + hops
                ranked.append(((k, -w, sw, r, full), full, sw))
        ranked.sort(key=lambda x: x[0])
        per_group: dict[str, int] = {}
        for _, full, sw in ranked:
            if per_group.get(sw, 0) < _PER_GROUP:
                per_group[sw] = per_group.get(sw, 0) + 1
                peers.append(Route(full, 1, group=sw))
    if opts.route_gpus and opts.topology_aware and opts.max_flow:
        d_hops = direct.hops[::-1] if reverse else direct.hops
        value, paths = (flow_paths(topo, gpu, host, (d_hops,), opts.min_cost) if reverse
                        else flow_paths(topo, host, gpu, (d_hops,), opts.min_cost))
        flow = [Route(h[::-1] if reverse else h, 1, share=g) for h, g in paths if h != d_hops]
        # Busy links: the flow paths beyond their idle share, then the route-GPU alternatives.
        seen = {r.hops for r in flow}
        peers = [Route(r.hops, 2) for r in flow] + [Route(p.hops, 2, p.group) for p in peers if p.hops not in seen]
    elif opts.route_gpus and not opts.topology_aware:
        for r in topo.of_kind("gpu", node):
            sw = topo.pcie_switch_of(r)
            if r == gpu or sw is None:
                continue
            nv = nvlink_routes(topo, r, gpu, 1)
            if nv:
                peers.append(Route((host, sw) + nv[0][0], 1, group=r))
                continue
            leg = _leg_via_p2p(topo, r, gpu)
            if leg is not None:
                peers.append(Route((host, sw, r) + leg, 1, group=r, cap=topo.pcie_p2p_gbps))
    if reverse:
        direct = Route(direct.hops[::-1], 0, direct=True)
        peers = [Route(p.hops[::-1], p.tier, p.group, p.cap) for p in peers]
        flow = [Route(f.hops[::-1], f.tier, share=f.share) for f in flow]
    return RouteSet("host", direct=(direct,), flow=tuple(flow), tiers=(tuple(peers),) if peers else (),
                    fair=opts.route_gpus and not opts.topology_aware, flow_gbps=value)


def _nic_legs(topo: Topology, end: str, nic: str, opts: RoutingOptions, harvest: bool
              ) -> list[tuple[Hops, int, float]]:
    """Ways from endpoint ``end`` (host or GPU) to ``nic`` on its node as ``(hops, NVLink hops,
    NVLink width)``, best first (the PCIe and NIC edges are the same for every way to one NIC).

    For the direct path (``harvest=False``) a GPU uses its own switch's NIC, or reaches another
    switch's NIC through the root complex when its switch has none. Harvesting legs go over NVLink
    to a route GPU on the NIC's switch (never through the root complex when topology-aware: that
    would load the source's own PCIe link, seed 001 §3.2.2).
    """
    sw = topo.pcie_switch_of(nic)
    if sw is None:
        return []
    d = topo.device(end)
    if d.kind == "host":
        return [((end, sw, nic), 0, math.inf)]
    own = topo.pcie_switch_of(end)
    host = topo.host_of(d.node)
    legs: list[tuple[Hops, int, float]] = []
    if own == sw:
        legs.append(((end, sw, nic), 0, math.inf))
    if not harvest:
        if not legs and own is not None:
            legs.append(((end, own, host, sw, nic), 0, math.inf))
        return legs
    peers = [g for g in gpus_on_switch(topo, sw) if g != end]
    if opts.topology_aware:
        for r in peers:
            for hops, k, w in nvlink_routes(topo, end, r, max(1, opts.max_hops - 1))[:_LEGS_PER_PEER]:
                legs.append((hops + (sw, nic), k, w))
    elif not legs and own is not None:
        nv = nvlink_routes(topo, end, peers[0], 1) if peers else []
        if nv:
            legs.append((nv[0][0] + (sw, nic), nv[0][1], nv[0][2]))
        else:
            legs.append(((end, own, host, sw, nic), 0, math.inf))
    legs.sort(key=lambda x: (x[1], -x[2], x[0]))
    return legs


def _combine(src_legs: Iterable[tuple[Hops, int, float]], dst_legs: Iterable[tuple[Hops, int, float]]
             ) -> list[Hops]:
    """Source leg + fabric + reversed destination leg, ranked by NVLink hops then width."""
    out: list[tuple[int, float, Hops]] = []
    dl = list(dst_legs)[:_LEGS_PER_PEER]
    for sh, sk, sw in list(src_legs)[:_LEGS_PER_PEER]:
        for dh, dk, dw in dl:
            out.append((sk + dk, min(sw, dw), sh + ("fabric",) + dh[::-1]))
    out.sort(key=lambda x: (x[0], -x[1], x[2]))
    return [h for _, _, h in out]


def _cross_node(topo: Topology, src: str, dst: str, opts: RoutingOptions) -> RouteSet:
    ns, nd = topo.device(src).node, topo.device(dst).node
    if "fabric" not in topo:
        raise ConfigError(f"{src!r} and {dst!r} are on different nodes but {topo.name!r} has no fabric device")
    s_nics = [n for n in topo.nics_of(ns) if topo.edge(n, "fabric") is not None]
    d_nics = [n for n in topo.nics_of(nd) if topo.edge("fabric", n) is not None]
    if not s_nics or not d_nics:
        raise ConfigError(
            f"no network path from {src!r} (node {ns}) to {dst!r} (node {nd}) in {topo.name!r}:"
            " both nodes need a NIC linked to the fabric"
        )

    def first_nic(end: str, nics: list[str]) -> str:
        own = topo.pcie_switch_of(end) if topo.device(end).kind == "gpu" else None
        mine = [n for n in nics if own is not None and topo.pcie_switch_of(n) == own]
        if not mine:
            return nics[0]
        # GPUs sharing a switch with several NICs each get their own (GPU i -> NIC i mod k), as
        # GPUDirect deployments pair them; the first NIC for all would leave the others idle.
        peers = gpus_on_switch(topo, own) if own is not None else []
        return mine[peers.index(end) % len(mine)] if end in peers else mine[0]

    n0, m0 = first_nic(src, s_nics), first_nic(dst, d_nics)
    direct_routes = _combine(_nic_legs(topo, src, n0, opts, False), _nic_legs(topo, dst, m0, opts, False))
    direct = (Route(direct_routes[0], 0, direct=True),) if direct_routes else ()
    peers: list[Route] = []
    if opts.nic_harvest:
        spare_s = [n for n in s_nics if n != n0]
        spare_d = [m for m in d_nics if m != m0]
        pairs: list[tuple[str, str]] = []
        by_local = {local_name(m): m for m in spare_d}
        rest_s: list[str] = []
        for n in spare_s:  # same NIC index on both ends where possible (seed 001 §4.3.1)
            m = by_local.pop(local_name(n), None)
            if m is None:
                rest_s.append(n)
            else:
                pairs.append((n, m))
        left_d = [m for m in spare_d if m in by_local.values()]
        pairs += list(zip(rest_s, left_d, strict=False))
        pairs.sort(key=lambda p: s_nics.index(p[0]))
        for n, m in pairs:
            combos = _combine(_nic_legs(topo, src, n, opts, True), _nic_legs(topo, dst, m, opts, True))
            keep = combos[:1] if not opts.topology_aware else combos[:_PER_NIC]
            peers += [Route(h, 1, group=n) for h in keep]
    # Busy-path balancing applies to harvested NICs too: without it the first of two concurrent
    # shards from GPUs on one PCIe switch keeps every NIC and the second gets none.
    return RouteSet("cross", direct=direct, tiers=(tuple(peers),) if peers else (),
                    fair=opts.nic_harvest and not opts.topology_aware,
                    balance=opts.nic_harvest and opts.topology_aware and opts.multipath and opts.balance_busy)


@lru_cache(maxsize=32)
def node_route_sets(topo: Topology, opts: RoutingOptions) -> dict[tuple[str, str], RouteSet]:
    """Route sets of every ordered pair of transfer endpoints (GPUs, host) on one node, computed
    once per topology and options (the maximum flows included) when a Router is built."""
    out: dict[tuple[str, str], RouteSet] = {}
    for node in topo.nodes:
        ends = topo.of_kind("gpu", node) + topo.of_kind("host", node)[:1]
        for a in ends:
            for b in ends:
                if a == b:
                    continue
                try:
                    out[(a, b)] = route_set(topo, a, b, opts)
                except ConfigError:  # e.g. a GPU without PCIe: reported when a transfer asks for it
                    continue
    return out
