"""The node's stats stream: :class:`~gfaas.dataplane.protocol.SnapshotReply` and
:class:`~gfaas.dataplane.protocol.ObjectInfoReply`, built from what the store already keeps.

Cost is the point (issue 19: under 2% of the daemon's time at one snapshot a second). A snapshot
reads counters only: the :class:`~gfaas.dataplane.tierbook.TierBook`, the tiers' and GPU pools'
totals, each GPU's link counters. It never waits for a spill, drains a connection, scans a slab
directory or settles the tiers, so what it reports may trail a put whose seal is still queued
(``Admin.stats()`` settles first, and costs that much more). Call both under the daemon's lock.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import InvalidDataRef, NotFound
from . import protocol as P
from .ids import ID_BYTES
from .tierbook import DISK, HOST, TierBook, tier_name

if TYPE_CHECKING:
    from .store import Store


def snapshot(store: Store, node_id: str, connections: int) -> P.SnapshotReply:
    """The node's figures now; ``connections``: the daemon's open sockets (admin ones included)."""
    book, tiers = store.book, store.tiers
    out = [_tier(book, HOST, store.reserved, tiers.host_target, store.config.capacity_bytes, store.pooled_bytes)]
    for k in sorted(store.devices):
        pool = store.devices[k].pool
        out.append(_tier(book, k, pool.held, pool.target, pool.cap, pool.held - pool.used))
    spill = tiers.spill
    if spill is not None:
        out.append(_tier(book, DISK, spill.bytes_on_disk, 0, spill.capacity_bytes or 0, 0))
    counters = {**tiers.counters, **store.device_counters, "connections": connections,
                "sessions": len(store.sessions), "invocations": len(store.registry),
                "writing": store.writing_count, "segments": len(store.segments), "lost": len(store._lost)}
    links = {"disk-write": tiers.counters["bytes_spilled"], "disk-read": tiers.counters["bytes_restored"],
             **store.net_bytes}
    for k in sorted(store.devices):
        h2d, d2h, peers = store.devices[k].moved()
        links[f"h2d:{tier_name(k)}"] = h2d
        links[f"d2h:{tier_name(k)}"] = d2h
        for src, n in sorted(peers.items()):
            links[f"peer:{tier_name(src)}->{tier_name(k)}" if src != k else f"d2d:{tier_name(k)}"] = n
    return P.SnapshotReply(node_id, time.time(), out, counters, links)


def _tier(book: TierBook, tier: int, reserved: int, target: int, capacity: int, pooled: int) -> P.TierFigures:
    nbytes, objects = book.live(tier)
    return P.TierFigures(tier_name(tier), nbytes, reserved, target, capacity, objects, pooled)


def object_info(store: Store, oid: object) -> P.ObjectInfoReply:
    """One object's size, tier, producer, readers and age; errors name the ID asked for."""
    if not isinstance(oid, bytes) or len(oid) != ID_BYTES:
        shown = oid.hex() if isinstance(oid, bytes) else repr(oid)
        raise InvalidDataRef(f"object ID {shown[:80]} is not {ID_BYTES} bytes; pass the 32 hex digits of a DataRef")
    rec = store.objects.get(oid)
    if rec is None:
        raise NotFound(f"object {oid.hex()} is not on node {store.config.node_id}: it was never stored here, or"
                       " it was freed (read by its consumers, deleted, or its invocation ended)")
    if rec.segment in store.tiers.spilled:
        tier = DISK
    else:
        seg = store.segments.get(rec.segment)
        tier = seg.device if seg is not None else HOST
    return P.ObjectInfoReply(rec.id, rec.invocation, rec.producer,
                             sorted(rec.consumers) if rec.consumers is not None else None,
                             sorted(rec.pending) if rec.pending is not None else None,
                             rec.nbytes, rec.dtype, list(rec.shape), rec.state, tier_name(tier),
                             max(0.0, store.clock.now() - rec.created))
