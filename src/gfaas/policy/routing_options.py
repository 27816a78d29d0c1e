"""The options of the multi-path router, in a module of their own so that the route enumeration
(:mod:`gfaas.policy.paths`) and the router (:mod:`gfaas.policy.routing`) can both use them
without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError


@dataclass(frozen=True)
class RoutingOptions:
    """Switches of the one planner; each baseline or ablation is a combination of them.

    ``multipath``: parallel NVLink paths for GPU-to-GPU transfers (off: the widest direct link,
    else PCIe peer-to-peer; ablation "TA"). ``topology_aware``: off means harvesting (route GPUs,
    NICs) ignores PCIe switches and NVLink, as DeepPlan+ does; it does not change GPU-to-GPU
    routing. ``route_gpus``: host<->GPU transfers also go through peer GPUs' PCIe links (ablation
    "BH"). ``nic_harvest``: cross-node transfers also use peer GPUs' NICs. ``max_hops``: NVLink
    GPU-to-GPU hops per *enumerated* path (harvesting legs use one fewer); the maximum-flow paths
    are not bounded by it. ``reroute_direct``: claim a direct path back from transfers using it as
    an indirect hop. ``balance_busy``: Algorithm 1 lines 8-14. ``max_flow``: GPU-to-GPU
    (multipath) and host<->GPU (topology-aware route GPUs) plans start from the idle machine's
    maximum-flow paths (:func:`gfaas.policy.paths.flow_paths`); off, only the enumerated short
    routes are searched, greedily (the planner before issue 12, kept as an ablation).
    """

    multipath: bool = True
    topology_aware: bool = True
    route_gpus: bool = True
    nic_harvest: bool = True
    max_hops: int = 3
    reroute_direct: bool = True
    balance_busy: bool = True
    max_flow: bool = True
    min_cost: bool = True
    load_paths: Literal["all", "short", "greedy"] = "short"

    def __post_init__(self) -> None:
        if not 1 <= self.max_hops <= 6:
            raise ConfigError(
                f"max_hops={self.max_hops} is out of range; use 1 to 6 (3 is the default, 4 still plans fast)"
            )
        if self.load_paths not in ("all", "short", "greedy"):
            raise ConfigError(f"load_paths={self.load_paths!r}; use 'all', 'short' or 'greedy'")
