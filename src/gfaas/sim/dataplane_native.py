""":class:`NativeDataPlane`: :class:`~gfaas.sim.dataplane.PyDataPlane` with its transfer lifecycle in Rust.

At cluster scale most of a run's wall time was Python glue around native parts: per transfer, a plan
from the native router, ``Plan.split``, flows on the native network, then ``slo_rates`` and new caps on
every start and finish of a host transfer. ``gfaas_native.DataPlaneCore`` (``native/src/dataplane.rs``)
does all of it natively, calling the router core and the fluid network at the Rust level. What stays
here is set up once: the network, both routers (their wrappers still compile each pair's route set on
first use) and the device facts. The reference stays the specification; both give the same events
and floats (``tests/unit/test_sim_dataplane_native.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from ..native import native_class
from ..policy.routing_native import NativeRouter, native_router_available
from ..topology import Topology
from .kernel import Simulator
from .network import NativeNetwork
from .systems import PIN_S_PER_BYTE, TRANSFER_SETUP_S, SystemConfig

_Core: Any = native_class("DataPlaneCore")


def native_dataplane_available() -> bool:
    """Whether ``gfaas_native`` here has the data plane (and the router and network it drives)."""
    return _Core is not None and NativeNetwork is not None and native_router_available()


class NativeDataPlane:
    """The reference's contract (``move``, ``net``, ``router``, ``active``), run natively.

    ``router`` is the :class:`NativeRouter` whose core holds the plans, but the core is driven
    directly: the wrapper's own plan bookkeeping (``router.active``) is not kept here. ``active``
    maps each started, unfinished transfer to ``(src, dst, nbytes, host, managed, flows)``.
    """

    def __init__(self, sim: Simulator, topology: Topology, cfg: SystemConfig) -> None:
        if not native_dataplane_available():
            raise ConfigError("NativeDataPlane needs gfaas_native with DataPlaneCore: run `make setup` (needs "
                              "cargo) or `pip install ./native`; the pure-Python PyDataPlane runs the same events")
        from .dataplane import _DIRECT, CHUNK  # a cycle at import time: dataplane selects this class

        self.sim = sim
        self.topo = topology
        self.cfg = cfg
        self.net = NativeNetwork(sim, topology)
        self.router = NativeRouter(topology, cfg.routing, precompute=False)
        self._direct = NativeRouter(topology, _DIRECT, precompute=False)
        devices = [(d.name, d.kind, d.node) for d in topology.devices]
        self._core = _Core(sim, self.net, topology, self.router, self._direct, devices, _host_gbps(topology),
                           cfg.pinned, bool(cfg.slo_control), CHUNK, TRANSFER_SETUP_S, PIN_S_PER_BYTE)
        # Callers reach the core without a Python frame in between.
        self.move: Callable[..., None] = self._core.move

    @property
    def active(self) -> dict[int, tuple[Any, ...]]:
        return self._core.active


def _host_gbps(topology: Topology) -> dict[int, float]:
    """BW_all of the paper per node (every host uplink, one direction), summed as the reference does."""
    out: dict[int, float] = {}
    for e in topology.edges():
        if topology.device(e.src).kind == "host":
            node = topology.device(e.src).node
            out[node] = out.get(node, 0.0) + e.gbps
    return out
