"""Policy: path routing, SLO-aware bandwidth shares, workflow placement, elastic storage,
model scaling (block multicast schedules, execution pipelines), and autoscaling (worker counts,
keep-alive and pre-warm).

Everything here is pure decision logic (no clock, no I/O, no threads, randomness only through an
explicit seed); the simulator and the real runtime call the same objects.
"""

from .autoscale import ConcurrencyScaler, KeepAlive, ScalingSpec, keep_alive_policy, parse_scaling
from .bandwidth import (
    SLO_FACTOR,
    ChunkBatcher,
    Demand,
    PinnedRing,
    deadline_for,
    input_deadline,
    rate_least,
    slo_for,
    slo_rates,
)
from .multicast import Schedule, Transfer
from .multicast import plan as plan_multicast
from .pipelines import Pipeline, PipelineChange, PipelinePlanner, Stage, assign_stages, pipeline_changes
from .placement import group_nodes, pair_gbps, place_replicas, place_workflow, placement_cost
from .pooling import Grant, PoolModel
from .resources import Candidate, Ledger, Resources, choose_evictions, parse_resources
from .routing import MiB, Path, Plan, Router, RoutingOptions
from .storage import (
    STORAGE_POLICIES,
    DemandPlan,
    DemandTracker,
    Peer,
    QueueBook,
    Reservation,
    Resident,
    SlidingQuantile,
    StorageOptions,
    eviction_order,
    migration_target,
    plan_eviction,
    plan_restore,
    pool_target,
    positions_by_consumer,
    storage_policy,
    unneeded,
)
from .workerpool import PoolDecision, WorkerPoolPolicy, WorkerView

__all__ = [
    "Candidate",
    "Ledger",
    "PoolDecision",
    "Resources",
    "WorkerPoolPolicy",
    "WorkerView",
    "choose_evictions",
    "parse_resources",
    "ConcurrencyScaler",
    "KeepAlive",
    "ScalingSpec",
    "keep_alive_policy",
    "parse_scaling",
    "SLO_FACTOR",
    "STORAGE_POLICIES",
    "ChunkBatcher",
    "Demand",
    "DemandPlan",
    "DemandTracker",
    "Grant",
    "Peer",
    "Pipeline",
    "PipelineChange",
    "PipelinePlanner",
    "PoolModel",
    "QueueBook",
    "Reservation",
    "Resident",
    "Schedule",
    "SlidingQuantile",
    "Stage",
    "StorageOptions",
    "assign_stages",
    "Transfer",
    "eviction_order",
    "migration_target",
    "plan_eviction",
    "plan_restore",
    "pool_target",
    "positions_by_consumer",
    "storage_policy",
    "unneeded",
    "MiB",
    "Path",
    "PinnedRing",
    "Plan",
    "Router",
    "RoutingOptions",
    "deadline_for",
    "group_nodes",
    "input_deadline",
    "pair_gbps",
    "pipeline_changes",
    "place_replicas",
    "place_workflow",
    "placement_cost",
    "plan_multicast",
    "rate_least",
    "slo_for",
    "slo_rates",
]
