"""Clocks: policies take one of these instead of reading the wall clock.

The runtime passes :class:`WallClock`; the simulator and tests pass :class:`ManualClock`, so the
same policy code gives the same decisions for the same inputs.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Anything with ``now()`` returning seconds as a float, monotonic non-decreasing."""

    def now(self) -> float: ...


class WallClock:
    """Monotonic wall clock (``time.monotonic``) for the live runtime."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; for the simulator and tests."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (must be >= 0) and return the new time."""
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards by {seconds} s; pass a value >= 0")
        self._t += seconds
        return self._t

    def set(self, t: float) -> None:
        """Jump to absolute time ``t`` (must not be earlier than now)."""
        if t < self._t:
            raise ValueError(f"cannot set clock to {t} s, it is already at {self._t} s")
        self._t = float(t)
