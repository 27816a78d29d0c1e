"""Transfer policy: path routing, SLO-aware bandwidth shares and workflow placement.

Everything here is pure decision logic (no clock, no I/O, no threads, randomness only through an
explicit seed); the simulator and the real runtime call the same objects.
"""

from .bandwidth import ChunkBatcher, Demand, PinnedRing, deadline_for, rate_least, slo_for, slo_rates
from .placement import group_nodes, pair_gbps, place_workflow, placement_cost
from .routing import MiB, Path, Plan, Router, RoutingOptions

__all__ = [
    "ChunkBatcher",
    "Demand",
    "MiB",
    "Path",
    "PinnedRing",
    "Plan",
    "Router",
    "RoutingOptions",
    "deadline_for",
    "group_nodes",
    "pair_gbps",
    "place_workflow",
    "placement_cost",
    "rate_least",
    "slo_for",
    "slo_rates",
]
