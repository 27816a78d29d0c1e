"""Per-invocation quotas of a node: what one invocation may hold at once, so that it cannot take
the node from the others (issue 14, rows 9 and 11).

Pure bookkeeping (no I/O, no store): the store charges and releases, this module keeps the sums and
raises :class:`~gfaas.errors.QuotaExceeded` naming the quota, the usage, the limit and the
``NodeConfig`` knob that sets it. Charges are keyed (an object ID, a slab, a spilled segment), so
releasing one twice, or one that was never charged, changes nothing.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from ..errors import QuotaExceeded

RESERVED = "reserved_bytes"  # host/GPU bytes held for writing: unsealed objects' segments, open slabs
UNSEALED = "unsealed_objects"  # objects allocated and not yet sealed
IDS = "issued_ids"  # IDs handed out for small puts and not used yet
SPILL = "spill_bytes"  # bytes of the invocation's objects on disk
SEGMENTS = "segments"  # host shared-memory segments it holds: each is a descriptor of the daemon's

KNOB = {RESERVED: "quota_reserved_bytes", UNSEALED: "quota_unsealed_objects", IDS: "quota_issued_ids",
        SPILL: "quota_spill_bytes", SEGMENTS: "quota_segments"}
WHAT = {RESERVED: "bytes reserved for objects being written and open slabs",
        UNSEALED: "objects allocated and not sealed", IDS: "issued IDs not used yet",
        SPILL: "bytes on disk", SEGMENTS: "shared-memory segments (one file descriptor of the node's each)"}


@dataclass(frozen=True)
class Limits:
    reserved_bytes: int
    unsealed_objects: int
    issued_ids: int
    spill_bytes: int
    segments: int = 1 << 30

    def of(self, kind: str) -> int:
        return int(getattr(self, kind))


class Quotas:
    """Usage per (invocation, kind) against :class:`Limits`."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._use: dict[tuple[str, str], int] = {}
        self._held: dict[Hashable, tuple[str, str, int]] = {}  # key -> (invocation, kind, amount)
        self._keys: dict[str, set[Hashable]] = {}  # invocation -> its keys in _held

    def usage(self, invocation: str, kind: str) -> int:
        return self._use.get((invocation, kind), 0)

    def check(self, invocation: str, kind: str, n: int, limit: int | None = None) -> None:
        """Raise QuotaExceeded if ``n`` more would take ``invocation`` over its ``kind`` quota
        (``limit``: instead of the configured one)."""
        used = self.usage(invocation, kind)
        limit = self.limits.of(kind) if limit is None else limit
        if used + n > limit:
            raise QuotaExceeded(
                f"invocation {invocation} is over its quota of {WHAT[kind]}: {used} held, {n} more asked,"
                f" limit {limit} ({KNOB[kind]}={limit}); free or seal what it holds, or raise {KNOB[kind]}"
            )

    def add(self, invocation: str, kind: str, n: int) -> None:
        key = (invocation, kind)
        total = self._use.get(key, 0) + n
        if total > 0:
            self._use[key] = total
        else:
            self._use.pop(key, None)

    def hold(self, key: Hashable, invocation: str, kind: str, n: int, check: bool = True) -> None:
        """Charge ``n`` to ``invocation`` under ``key`` (checked first unless ``check`` is False)."""
        if key in self._held:
            self.drop(key)
        if check:
            self.check(invocation, kind, n)
        self._held[key] = (invocation, kind, n)
        self._keys.setdefault(invocation, set()).add(key)
        self.add(invocation, kind, n)

    def drop(self, key: Hashable) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self.add(held[0], held[1], -held[2])
            keys = self._keys.get(held[0])
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._keys[held[0]]

    def forget(self, invocation: str) -> None:
        """Drop every charge of an invocation that ended."""
        for key in list(self._keys.get(invocation, ())):
            self.drop(key)
        for kind in KNOB:
            self._use.pop((invocation, kind), None)
