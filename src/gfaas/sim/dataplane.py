"""The simulated data plane: turns "move N bytes from device A to device B" into flows.

It is driven by the policy objects of :mod:`gfaas.policy`: a :class:`~gfaas.policy.Router` picks
the paths (its reservations steer the paths later transfers get; the daemon does not route across
GPUs yet),
:func:`~gfaas.policy.slo_rates` shares host links by SLO, and :meth:`~gfaas.policy.Plan.split`
sizes each path's share. The simulator only adds physics: the :class:`~gfaas.sim.network.Network`
decides how fast bytes actually move, max-min fairly over the chosen paths, so bandwidth a finished
transfer frees is used at once (work conserving) rather than left idle behind a stale reservation.

:class:`PyDataPlane` below is the reference; :class:`NativeDataPlane` runs the same per-transfer
lifecycle in Rust (``native/src/dataplane.rs``), with the same events and floats.
``DataPlane`` is the native one where the simulator's core is native (``kernel.CORE``) and the
extension has it; ``GFAAS_SIM_DATAPLANE=python`` keeps the reference under the native core.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..native import choose, native_class
from ..policy import Demand, Path, Plan, Router, RoutingOptions, slo_rates
from ..policy.routing import _twin_nodes
from ..policy.routing_native import NativeRouter, native_router_available
from ..topology import Topology
from .kernel import CORE, Simulator
from .network import Flow, NativeNetwork, Network
from .systems import PIN_S_PER_BYTE, TRANSFER_SETUP_S, SystemConfig

log = logging.getLogger(__name__)

CHUNK = 2 << 20
_DIRECT = RoutingOptions(multipath=False, topology_aware=False, route_gpus=False, nic_harvest=False,
                         reroute_direct=False, balance_busy=False)


@dataclass
class Transfer:
    ident: int
    src: str
    dst: str
    nbytes: int
    on_done: Callable[[], None]
    deadline: float
    plan: Plan | None = None
    flows: list[tuple[Flow, Path]] = field(default_factory=list)
    pending: int = 0
    host: bool = False
    managed: bool = False


def router_class() -> type[Router]:
    """The router the simulator plans with: the native one (the same plans, in Rust) when the
    simulator's core is native (``kernel.CORE``) and it is built, else the reference."""
    return NativeRouter if CORE == "native" and native_router_available() else Router


class PyDataPlane:
    """One node-or-cluster's data movement under one :class:`SystemConfig` (the reference)."""

    def __init__(self, sim: Simulator, topology: Topology, cfg: SystemConfig) -> None:
        self.sim = sim
        self.topo = topology
        self.cfg = cfg
        self.net = Network(sim, topology)
        # Route sets are compiled per pair on first use: a cluster uses few of its pairs.
        routers = router_class()
        self.router = routers(topology, cfg.routing, precompute=False)
        self._direct = routers(topology, _DIRECT, precompute=False)
        _share_twins(topology, self.router, self._direct)
        self._ids = itertools.count(1)
        self.active: dict[int, Transfer] = {}
        # Per-device facts looked up on every transfer, so that no lookup scans the cluster.
        self._kind = {d.name: d.kind for d in topology.devices}
        self._node_of = {d.name: d.node for d in topology.devices}
        self._p2p: dict[tuple[str, ...], bool] = {}  # path hops -> _p2p_over_pcie
        # Active host transfers per node (insertion order = start order, as in ``active``).
        self._host_active: dict[int, dict[int, Transfer]] = {}
        # BW_all of the paper, per node: every host uplink of that node, one direction.
        self._host_gbps: dict[int, float] = {}
        for e in topology.edges():
            if topology.device(e.src).kind == "host":
                node = topology.device(e.src).node
                self._host_gbps[node] = self._host_gbps.get(node, 0.0) + e.gbps

    # ---- public ---------------------------------------------------------------------------------
    def move(self, src: str, dst: str, nbytes: int, on_done: Callable[[], None], deadline: float = 0.0) -> None:
        """Move ``nbytes`` from device ``src`` to ``dst``; ``on_done()`` when the last byte lands."""
        t = Transfer(next(self._ids), src, dst, int(nbytes), on_done, deadline)
        if src == dst or nbytes <= 0:
            self.sim.schedule(TRANSFER_SETUP_S if src == dst else 0.0, on_done)
            return
        kind = self._kind
        if src not in kind or dst not in kind:
            self.topo.device(src), self.topo.device(dst)  # raises the ConfigError naming the device
        t.host = kind[src] == "host" or kind[dst] == "host"
        delay = TRANSFER_SETUP_S
        if t.host and self.cfg.pinned == "alloc":
            delay += nbytes * PIN_S_PER_BYTE
        self.sim.schedule(delay, self._start, t)

    # ---- internals ------------------------------------------------------------------------------
    def _start(self, t: Transfer) -> None:
        plan = self.router.plan(t.ident, t.src, t.dst)
        t.managed = True
        if not plan.paths:
            # Every path is reserved by others: go the direct way and share it fairly.
            self.router.release(t.ident)
            t.managed = False
            plan = self._direct.plan(t.ident, t.src, t.dst)
            self._direct.release(t.ident)
        t.plan = plan
        self.active[t.ident] = t
        if t.host:
            self._host_active.setdefault(self._node(t), {})[t.ident] = t
        net = self.net
        net.begin()  # one re-allocation of rates for the launch, the re-routes and the new shares
        try:
            self._launch(t, t.nbytes)
            self._apply_changes()
            if t.host and self.cfg.slo_control:
                self._rebalance_host(t)
        finally:
            net.commit()

    def _launch(self, t: Transfer, nbytes: float) -> None:
        assert t.plan is not None
        shares = t.plan.split(int(nbytes), CHUNK)
        for path, share in zip(t.plan.paths, shares, strict=True):
            if share <= 0:
                continue
            t.pending += 1
            flow = self.net.start(path.hops, share, partial(self._flow_done, t), self._cap(t, path))
            t.flows.append((flow, path))

    def _cap(self, t: Transfer, path: Path) -> float | None:
        cap: float | None = None
        if self._p2p_over_pcie(path):
            cap = self.topo.pcie_p2p_gbps  # a physical limit (root-complex P2P), whatever the policy
        if t.host and self.cfg.pinned == "pageable":
            cap = min(cap or self.topo.pageable_gbps, self.topo.pageable_gbps)
        return cap

    def _p2p_over_pcie(self, path: Path) -> bool:
        hops = tuple(path.hops)
        p2p = self._p2p.get(hops)
        if p2p is None:
            kinds = [self._kind[h] for h in hops]
            p2p = self._p2p[hops] = (kinds[0] == "gpu" and kinds[-1] == "gpu" and "pcie" in kinds
                                     and "nic" not in kinds)
        return p2p

    def _flow_done(self, t: Transfer) -> None:
        t.pending -= 1
        if not t.pending:
            self._finish(t)

    def _finish(self, t: Transfer) -> None:
        self.active.pop(t.ident, None)
        if t.host:
            self._host_active[self._node(t)].pop(t.ident, None)
        net = self.net
        net.begin()
        try:
            if t.managed:
                self.router.release(t.ident)
                self._apply_changes()
            if t.host and self.cfg.slo_control:
                self._rebalance_host(t)
        finally:
            net.commit()
        # Each flow's callback holds the transfer: letting go of the flows here frees both by
        # reference counting, not by the cycle collector (docs/design/simulator.md).
        t.flows = []
        t.on_done()

    def _apply_changes(self) -> None:
        """Other transfers the router re-routed: move their remaining bytes onto the new paths."""
        for plan in self.router.changed():
            t = self.active.get(plan.transfer)  # type: ignore[call-overload]
            if t is None or not t.flows:
                continue
            left = 0.0
            for flow, _ in t.flows:
                if not flow.done:
                    left += self.net.cancel(flow)
            t.flows = []
            t.pending = 0
            t.plan = plan
            if plan.paths and left > 0:
                self._launch(t, left)
            elif left > 0:  # nothing left for it: fall back to its direct path
                t.managed = False
                t.plan = self._direct.plan(("fallback", t.ident), t.src, t.dst)
                self._direct.release(("fallback", t.ident))
                self._launch(t, left)
            else:  # its flows had all landed: it is complete
                self.sim.schedule(0.0, self._finish, t)

    def _node(self, t: Transfer) -> int:
        """The node whose host memory a host transfer touches."""
        end = t.src if self._kind[t.src] == "host" else t.dst
        return self._node_of[end]

    def _rebalance_host(self, changed: Transfer) -> None:
        """SLO-aware shares of a node's host links among its host transfers (seed 001 §4.3.2)."""
        node = self._node(changed)
        host = [t for t in self._host_active.get(node, {}).values() if t.flows]
        if not host:
            return
        capacity = self._host_gbps[node]
        demands = [Demand(t.ident, int(sum(self.net.left(f) for f, _ in t.flows if not f.done)),
                          max(t.deadline, self.sim.now + 1e-6)) for t in host]
        rates = slo_rates(demands, capacity, self.sim.now)
        caps: list[tuple[Flow, float | None]] = []
        for t in host:
            live = [(f, p) for f, p in t.flows if not f.done]
            total = sum(p.gbps for _, p in live) or 1.0
            caps += [(f, max(rates[t.ident] * p.gbps / total, 1e-3)) for f, p in live]
        self.net.set_caps(caps)


_Core: Any = native_class("DataPlaneCore")


def native_dataplane_available() -> bool:
    """Whether ``gfaas_native`` here has the data plane (and the router and network it drives)."""
    return _Core is not None and NativeNetwork is not None and native_router_available()


class NativeDataPlane:
    """:class:`PyDataPlane`'s contract (``move``, ``net``, ``router``, ``active``), run natively.

    At cluster scale most of a run's wall time was Python glue around native parts: per transfer a
    plan from the native router, ``Plan.split``, flows on the native network, then ``slo_rates`` and
    new caps whenever a host transfer starts or ends. ``gfaas_native.DataPlaneCore`` does all of it,
    calling the router core and the fluid network at the Rust level. What stays here is set up once:
    the network, both routers (their wrappers still compile each pair's route set on first use) and
    the device facts (``tests/unit/test_sim_dataplane_native.py`` holds it to the reference).

    ``router``'s core holds the plans, but the core is driven directly, so the wrapper's own plan
    bookkeeping (``router.active``) is not kept. ``active`` maps each started, unfinished transfer to
    ``(src, dst, nbytes, host, managed, flows)``.
    """

    def __init__(self, sim: Simulator, topology: Topology, cfg: SystemConfig) -> None:
        if not native_dataplane_available():
            raise ConfigError("NativeDataPlane needs gfaas_native with DataPlaneCore: run `make setup` (needs "
                              "cargo) or `pip install ./native`; the pure-Python PyDataPlane runs the same events")
        self.sim = sim
        self.topo = topology
        self.cfg = cfg
        self.net = NativeNetwork(sim, topology)
        self.router = NativeRouter(topology, cfg.routing, precompute=False)
        self._direct = NativeRouter(topology, _DIRECT, precompute=False)
        _share_twins(topology, self.router, self._direct)
        devices = [(d.name, d.kind, d.node) for d in topology.devices]
        self._core = _Core(sim, self.net, topology, self.router, self._direct, devices, _host_gbps(topology),
                           cfg.pinned, bool(cfg.slo_control), CHUNK, TRANSFER_SETUP_S, PIN_S_PER_BYTE)
        # Callers reach the core without a Python frame in between.
        self.move: Callable[..., None] = self._core.move

    @property
    def active(self) -> dict[int, tuple[Any, ...]]:
        return self._core.active


def _share_twins(topology: Topology, *routers: Router) -> None:
    """Both routers' map of copied nodes (``routing._twin_nodes``, which each would compute on its first
    route set of a copied node), computed once: the same map, half the work at cluster scale."""
    twins = _twin_nodes(topology)
    for r in routers:
        r._twins = twins


def _host_gbps(topology: Topology) -> dict[int, float]:
    """BW_all of the paper per node (every host uplink, one direction), summed as the reference does."""
    out: dict[int, float] = {}
    for e in topology.edges():
        if topology.device(e.src).kind == "host":
            node = topology.device(e.src).node
            out[node] = out.get(node, 0.0) + e.gbps
    return out


def _choose() -> type[Any]:
    """The data plane the simulator runs: the native one where the core is native and it is built.
    ``GFAAS_SIM_DATAPLANE`` chooses under the native core only: the Python core stays all reference
    (a benchmark's reference child inherits the variable)."""
    if CORE != "native":
        choose("GFAAS_SIM_DATAPLANE", True, "DataPlaneCore")  # a bad value is an error either way
        return PyDataPlane
    native = choose("GFAAS_SIM_DATAPLANE", native_dataplane_available(), "DataPlaneCore") == "native"
    return NativeDataPlane if native else PyDataPlane


if TYPE_CHECKING:
    DataPlane = PyDataPlane
else:
    DataPlane = _choose()
