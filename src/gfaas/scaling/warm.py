"""The warm startup tier: a node's host-memory cache of models it served before (seed 002 §5).

Startup tiers of a node asked to serve a model: *hot* (loaded, serving now), *warm* (the packed
blocks are still in host memory from an earlier instance: restore them with a memory copy), *cold*
(fetch every block from other nodes by multicast). :class:`WarmCache` keeps models for
``keep_alive_s`` after their last use and, when ``capacity_bytes`` would be exceeded, evicts the
least recently used first. Pure: the caller passes the time.

Instead of one fixed ``keep_alive_s``, a cache may take a keep-alive policy by name (``keep_alive=
"gfaas"``, ``"hybrid"`` or ``"fixed:<minutes>"``, :func:`gfaas.policy.autoscale.keep_alive_policy`):
each model then gets its own policy object, told of every use, and is kept for that policy's
keep-alive after its last use, so one keep-alive policy governs workers and warm models alike. A
cache cannot load blocks back by itself, so a policy's pre-warm window counts as kept time here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..policy.autoscale import KeepAlive, keep_alive_policy


@dataclass
class _Entry:
    blocks: list[memoryview]
    nbytes: int
    last_used: float
    keep_s: float


class WarmCache:
    """Models by key (their blocks' buffers), with keep-alive and LRU eviction by bytes."""

    def __init__(self, capacity_bytes: int, keep_alive_s: float = 600.0, keep_alive: str | None = None) -> None:
        if capacity_bytes < 0 or not keep_alive_s >= 0:
            raise ConfigError(f"a warm cache needs capacity_bytes >= 0 and keep_alive_s >= 0, got "
                              f"{capacity_bytes} and {keep_alive_s}")
        if keep_alive is not None:
            keep_alive_policy(keep_alive)  # refuse a bad name now, not at the first put
        self.capacity_bytes = capacity_bytes
        self.keep_alive_s = keep_alive_s
        self.keep_alive = keep_alive
        self._policies: dict[str, KeepAlive] = {}
        self._items: OrderedDict[str, _Entry] = OrderedDict()

    def _used(self, key: str, now: float) -> float:
        """Tell the key's policy of a use; how long the model is now kept after it."""
        if self.keep_alive is None:
            return self.keep_alive_s
        pol = self._policies.get(key)
        if pol is None:
            pol = self._policies[key] = keep_alive_policy(self.keep_alive)
        pol.on_invocation(now)
        return pol.keep_alive_s(now) + (pol.prewarm_after_s(now) or 0.0)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._items.values())

    def keys(self) -> list[str]:
        """Keys from least to most recently used."""
        return list(self._items)

    def expire(self, now: float) -> list[str]:
        """Drop models unused for longer than the keep-alive; their keys."""
        gone = [k for k, e in self._items.items() if now - e.last_used > e.keep_s]
        for k in gone:
            del self._items[k]
        return gone

    def put(self, key: str, blocks: Sequence[memoryview], now: float) -> list[str]:
        """Keep ``blocks`` under ``key`` (replacing an older copy); returns the keys evicted to make
        room. A model larger than the whole cache is not kept (returns ``[key]``)."""
        size = sum(len(b) for b in blocks)
        self._items.pop(key, None)
        evicted = self.expire(now)
        if size > self.capacity_bytes:
            return [*evicted, key]
        while self.nbytes + size > self.capacity_bytes:
            evicted.append(self._items.popitem(last=False)[0])
        self._items[key] = _Entry(list(blocks), size, now, self._used(key, now))
        return evicted

    def get(self, key: str, now: float) -> list[memoryview] | None:
        """The model's blocks if still kept (and mark it used), else None."""
        self.expire(now)
        e = self._items.get(key)
        if e is None:
            return None
        e.last_used = now
        e.keep_s = self._used(key, now)
        self._items.move_to_end(key)
        return e.blocks


def warm_orders(nodes: int, blocks: int) -> list[list[int]]:
    """The order in which each of ``nodes`` warm nodes copies the model's blocks from its host cache:
    node ``j`` starts at block ``j * blocks // nodes`` and wraps around, so that partly loaded nodes
    hold different blocks and can form execution pipelines long before any holds the whole model
    (the rotation of k-way transmission, seed 002 Algorithm 1)."""
    if nodes < 1 or blocks < 1:
        raise ConfigError(f"nodes={nodes}, blocks={blocks}: pass at least one of each")
    return [[(j * blocks // nodes + i) % blocks for i in range(blocks)] for j in range(nodes)]
