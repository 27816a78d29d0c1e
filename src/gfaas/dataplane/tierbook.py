"""Live bytes and objects per storage tier, kept as objects are recorded, moved and freed.

The node's stats stream (:mod:`gfaas.dataplane.nodestats`) must answer in O(tiers), never by a
pass over every object (``Store.stats`` sums ``nbytes`` over all of them, which is what made
polling it costly). So the store and its tiers tell this book each time an object appears on a
tier, leaves one, or moves between two: an integer add per event, on paths that already touch the
object.
"""

from __future__ import annotations

#: Tier keys: a GPU's ordinal (>= 0), host memory, and the spill directory on disk.
HOST = -1
DISK = -2


def tier_name(tier: int) -> str:
    """``"host"``, ``"disk"`` or ``"gpu<k>"``: the name a tier has in snapshots and metric labels."""
    if tier == HOST:
        return "host"
    if tier == DISK:
        return "disk"
    return f"gpu{tier}"


class TierBook:
    """Bytes and objects (being written or sealed) on each tier; missing tiers hold nothing."""

    __slots__ = ("nbytes", "objects")

    def __init__(self) -> None:
        self.nbytes: dict[int, int] = {}
        self.objects: dict[int, int] = {}

    def add(self, tier: int, nbytes: int, n: int = 1) -> None:
        self.nbytes[tier] = self.nbytes.get(tier, 0) + nbytes
        self.objects[tier] = self.objects.get(tier, 0) + n

    def remove(self, tier: int, nbytes: int, n: int = 1) -> None:
        self.add(tier, -nbytes, -n)

    def move(self, src: int, dst: int, nbytes: int, n: int) -> None:
        """``n`` objects of ``nbytes`` in all went from tier ``src`` to ``dst``."""
        if src != dst:
            self.remove(src, nbytes, n)
            self.add(dst, nbytes, n)

    def live(self, tier: int) -> tuple[int, int]:
        """(bytes, objects) on ``tier``."""
        return self.nbytes.get(tier, 0), self.objects.get(tier, 0)
