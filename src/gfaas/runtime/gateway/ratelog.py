"""Rate-limited logging, so that a client cannot turn the gateway's log into a disk filler.

:class:`RateLimiter` is a token bucket: ``burst`` records at once, then ``per_s`` per second; what it
holds back is counted and reported with the next record let through. :class:`RateLimitFilter` applies
one to a logger's records (the gateway server puts one on uvicorn's ``uvicorn.error`` logger, whose
per-request warnings, such as "Invalid HTTP request received.", a flood of bad requests would repeat).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any


class RateLimiter:
    """A token bucket: :meth:`allow` says whether one more record may go out, and how many were
    held back since the last one that did."""

    def __init__(self, burst: int = 20, per_s: float = 1.0) -> None:
        self.burst, self.per_s = burst, per_s
        self._tokens = float(burst)
        self._at = time.monotonic()
        self._held = 0
        self._lock = threading.Lock()

    def allow(self) -> tuple[bool, int]:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_s)
            self._at = now
            if self._tokens < 1.0:
                self._held += 1
                return False, 0
            self._tokens -= 1.0
            held, self._held = self._held, 0
            return True, held


class RateLimitedLog:
    """A logger whose ``error``/``warning`` records pass through one :class:`RateLimiter`."""

    def __init__(self, log: logging.Logger, burst: int = 20, per_s: float = 1.0) -> None:
        self.log = log
        self.limiter = RateLimiter(burst, per_s)

    def _emit(self, level: int, msg: str, *args: Any, **kw: Any) -> None:
        ok, held = self.limiter.allow()
        if not ok:
            return
        if held:
            msg += f" ({held} similar records suppressed by the rate limit)"
        self.log.log(level, msg, *args, **kw)

    def error(self, msg: str, *args: Any, **kw: Any) -> None:
        self._emit(logging.ERROR, msg, *args, **kw)

    def warning(self, msg: str, *args: Any, **kw: Any) -> None:
        self._emit(logging.WARNING, msg, *args, **kw)


class RateLimitFilter(logging.Filter):
    """Lets records of WARNING and above through at most at a :class:`RateLimiter`'s rate."""

    def __init__(self, burst: int = 20, per_s: float = 1.0) -> None:
        super().__init__()
        self.limiter = RateLimiter(burst, per_s)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        ok, held = self.limiter.allow()
        if ok and held:
            record.msg = f"{record.msg} ({held} similar records suppressed by the rate limit)"
        return ok
