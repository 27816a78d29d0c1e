"""The node daemons' figures on ``/metrics``: storage tiers, eviction and restore totals, bytes moved
per link, read from the runtime's ``node_snapshots()`` (each daemon's ``Snapshot``: counters only).

Names follow Prometheus conventions: ``gfaas_node_`` prefix, bytes in ``_bytes``, counters in
``_total``, the daemon's ``node_id`` as the ``node`` label. Every family reads one shared list of
snapshots, fetched at most once per :data:`MAX_AGE_S`, so a scrape asks each daemon once, not once
per family. A runtime without ``node_snapshots`` (a test double) renders the families empty.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..metrics import Labels, Registry

log = logging.getLogger("gfaas.gateway")

MAX_AGE_S = 0.5  # a scrape renders every family within this: one Snapshot per daemon per scrape

#: (metric name, help, key in a snapshot's ``counters``): the node totals exported as counters.
NODE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("gfaas_node_evictions_total", "Objects moved down a tier (GPU to peer or host, host to disk).", "evictions"),
    ("gfaas_node_restores_total", "Objects moved back up a tier.", "restores"),
    ("gfaas_node_spills_total", "Segments written to the disk tier.", "spills"),
    ("gfaas_node_spilled_bytes_total", "Bytes written to the disk tier.", "bytes_spilled"),
    ("gfaas_node_restored_bytes_total", "Bytes read back from the disk tier.", "bytes_restored"),
    ("gfaas_node_released_unread_total", "Objects dropped under memory pressure because none of their readers "
     "was left.", "released_unread"),
    ("gfaas_node_migrations_total", "GPU evictions that went to a peer GPU.", "migrations"),
    ("gfaas_node_delivered_bytes_total", "Bytes copied between tiers for a reader on another one.",
     "bytes_delivered"),
)
#: (metric name, help, key): node gauges.
NODE_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("gfaas_node_connections", "Open connections to the node daemon.", "connections"),
    ("gfaas_node_invocations", "Invocations open on the node.", "invocations"),
)
TIER_STATES = ("live", "reserved", "target", "capacity")


class NodeFigures:
    """The latest snapshots of every node, shared by the families of one scrape."""

    def __init__(self, read: Callable[[], list[dict[str, Any]]] | None) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._snaps: list[dict[str, Any]] = []
        self._failing = False

    def snapshots(self) -> list[dict[str, Any]]:
        if self._read is None:
            return []
        with self._lock:  # one scrape at a time asks the daemons; the others reuse its answer
            now = time.monotonic()
            if now - self._at >= MAX_AGE_S:
                try:
                    self._snaps = list(self._read())
                    self._failing = False
                except Exception:
                    if not self._failing:  # once per stretch of failures, not every scrape
                        log.exception("runtime.node_snapshots() failed; /metrics omits the node figures")
                    self._failing = True
                    self._snaps = []
                self._at = now
            return self._snaps

    def tier_bytes(self) -> dict[Labels, float]:
        out: dict[Labels, float] = {}
        for s in self.snapshots():
            for t in s["tiers"]:
                for state in TIER_STATES:
                    v = t["capacity_bytes"] if state == "capacity" else t[f"bytes_{state}"]
                    if state != "capacity" or v:  # no cap (an unbounded disk tier): no series
                        out[(s["node_id"], t["name"], state)] = float(v)
        return out

    def tier_objects(self) -> dict[Labels, float]:
        return {(s["node_id"], t["name"]): float(t["objects"]) for s in self.snapshots() for t in s["tiers"]}

    def figure(self, key: str) -> Callable[[], dict[Labels, float]]:
        return lambda: {(s["node_id"],): float(s["counters"].get(key, 0)) for s in self.snapshots()}

    def deliveries(self) -> dict[Labels, float]:
        return {(s["node_id"], d): float(s["counters"].get(f"deliveries_to_{d}", 0)) for s in self.snapshots()
                for d in ("device", "host")}

    def links(self) -> dict[Labels, float]:
        return {(s["node_id"], link): float(n) for s in self.snapshots() for link, n in s["links"].items()}


def register_node_metrics(registry: Registry, runtime: Any) -> NodeFigures:
    """Add the node families to ``registry``, reading ``runtime.node_snapshots`` at each scrape."""
    figs = NodeFigures(getattr(runtime, "node_snapshots", None))
    registry.gauge_callback("gfaas_node_tier_bytes", "Bytes per storage tier (host, disk, gpuK) of a node, by "
                            "state: live (objects stored), reserved (memory or disk held), target (the pool's demand "
                            "target), capacity (its cap).", ["node", "tier", "state"], figs.tier_bytes)
    registry.gauge_callback("gfaas_node_tier_objects", "Objects stored per tier of a node (being written or sealed).",
                            ["node", "tier"], figs.tier_objects)
    for name, help, key in NODE_COUNTERS:
        registry.counter_callback(name, help, ["node"], figs.figure(key))
    registry.counter_callback("gfaas_node_deliveries_total", "Copies made for a reader on another tier, by where "
                              "they went (device: onto a GPU, host: into host memory).", ["node", "direction"],
                              figs.deliveries)
    registry.counter_callback("gfaas_node_link_bytes_total", "Bytes moved over each link of a node: h2d:gpuK, "
                              "d2h:gpuK, peer:gpuJ->gpuK, disk-write, disk-read, net-in, net-out.", ["node", "link"],
                              figs.links)
    for name, help, key in NODE_GAUGES:
        registry.gauge_callback(name, help, ["node"], figs.figure(key))
    return figs
