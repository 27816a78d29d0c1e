"""Keeping the garbage collector's full collections short in long-running processes.

CPython's cyclic collector walks every tracked object of the generations it collects. A server
holds hundreds of thousands of objects from its start (imported modules, FastAPI's app, numpy,
a function's model) that never become garbage, and a full collection walked them all: `gfaas serve`
paused 60-160 ms at a time under load, which was most of the refusals' p99 in `gfaas bench
overload` (docs/performance.md). :func:`freeze_startup` moves what exists at the end of start-up
into the permanent generation, so later collections walk only what requests create.

That was not enough under sustained load: what requests leave behind for a while (the last 10,000
finished invocations kept fetchable, the dashboard's records) fills the oldest generation, and the
collector's own rule (a full collection once it has grown by a quarter) walked it, pausing tens to
hundreds of milliseconds (timed with ``gc.callbacks`` under load), every
few seconds while finding nothing to free; the refusals' p99 at 2,000 connections was those pauses.
:class:`QuietCollector` takes full collections off the collector's rule and runs them where they cost
no one: when the server has nothing in flight, or, as a backstop against cyclic garbage that lives
long enough to reach the oldest generation, when that generation has grown far past its size after
the last full collection, or when none has run for ``max_interval_s``. It also makes the young
generations smaller than CPython's default (400 and 4 in place of 700 and 10): requests waiting for a
place hold tens of objects each (their coroutines, futures, timers), which the young collections walk
until they are promoted, and at the default sizes one young collection walked tens of thousands of
them, for tens of milliseconds.

The young generation was still the refusals' tail (docs/performance.md): CPython starts a young
collection when allocations minus deallocations of tracked objects pass the threshold, and any
deallocation counts, an old object's too. Under steady load as many old objects die as new ones
are made (waiting requests admitted after a second, the oldest kept results dropped for new ones),
so the count stays low while the youngest generation fills: a young collection then walked 30,000
to 50,000 objects, 25-65 ms of the event loop at 2,000 connections (``gc.get_objects(0)`` at its
start). :class:`QuietCollector` therefore also paces the young collections by the clock while
the server is busy (``young_every_s``, 10 ms: a generation-0 collection, every fourth one of
generation 1, from a thread of its own), so each walks what 10 ms of requests made.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["QuietCollector", "freeze_startup", "full_collection_due"]

log = logging.getLogger("gfaas.gcpause")
_NEVER = 1 << 30  # a gen-2 threshold the collector's own rule never reaches


def freeze_startup() -> None:
    """Collect start-up's garbage once, then exclude every surviving object from later collections.

    Call it once, where a process has finished starting and begins to serve. Objects frozen are never
    collected, so call it only after start-up's own temporary cycles are gone (the collect here)."""
    gc.collect()
    gc.freeze()


def full_collection_due(*, quiet: bool, young_since: int, tracked: int | None, tracked_after: int,
                        since_s: float, growth: float = 4.0, floor: int = 250_000, max_interval_s: float = 600.0,
                        min_young: int = 10) -> str | None:
    """Why a full collection should run now, or None (pure: the caller measures).

    ``young_since``: generation-1 collections since the last full one (each moves survivors into the
    oldest generation: without any, a full collection has nothing new to look at); ``tracked``: the
    oldest generation's size now (None when not measured this time), ``tracked_after``: its size right
    after the last full collection; ``since_s``: seconds since then."""
    if young_since < min_young:
        return None
    if quiet:
        return "quiet"
    if tracked is not None and tracked > max(floor, growth * tracked_after):
        return f"the oldest generation grew to {tracked} objects (from {tracked_after})"
    if since_s >= max_interval_s:
        return f"none for {since_s:.0f} s"
    return None


class QuietCollector:
    """Full collections at quiet moments instead of by the collector's own rule (module docstring).

    :meth:`start` turns the rule off (young collections go on, at ``young`` thresholds, and every
    ``young_every_s`` while the server is busy; 0: only by the thresholds); :meth:`tick`, called every
    second or so by the server's main thread, runs a full collection when :func:`full_collection_due`
    says so; :meth:`stop` gives the rule back. ``quiet()`` says whether the server has nothing in flight."""

    def __init__(self, quiet: Callable[[], bool], *, size_every_s: float = 10.0, growth: float = 4.0,
                 floor: int = 250_000, max_interval_s: float = 600.0, young: tuple[int, int] = (400, 4),
                 young_every_s: float = 0.01, clock: Callable[[], float] = time.monotonic) -> None:
        self._quiet = quiet
        self._clock = clock
        self._size_every_s = size_every_s
        self.young = young  # the young generations' thresholds while started
        self.growth, self.floor, self.max_interval_s = growth, floor, max_interval_s
        self._saved: tuple[int, int, int] | None = None
        self.collections = 0  # full collections this ran
        self.last_pause_s = 0.0
        self.young_every_s = young_every_s
        self.paced = 0  # young collections the pacer ran
        self._stop = threading.Event()
        self._pacer: threading.Thread | None = None

    def start(self) -> QuietCollector:
        self._saved = gc.get_threshold()
        gc.set_threshold(self.young[0], self.young[1], _NEVER)
        self._mark(self._clock())
        if self.young_every_s > 0:
            self._stop.clear()
            self._pacer = threading.Thread(target=self._pace, name="gfaas-gc-pacer", daemon=True)
            self._pacer.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._pacer is not None:
            self._pacer.join(5)
            self._pacer = None
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None

    def _pace(self) -> None:
        """Young collections by the clock while busy (module docstring); idle, it only looks now and then."""
        while not self._stop.wait(self.young_every_s):
            try:
                busy = not self._quiet()
            except Exception:  # noqa: BLE001 - as tick: a broken probe is taken as busy
                busy = True
            if not busy:
                if self._stop.wait(0.25):
                    return
                continue
            self.paced += 1
            gc.collect(1 if self.paced % 4 == 0 else 0)

    def _mark(self, now: float) -> None:
        self._young_at = gc.get_stats()[1]["collections"]
        self._tracked_after = len(gc.get_objects(2))
        self._since = self._sized = now

    def tick(self) -> str | None:
        """Run a full collection if one is due; returns why it ran (None: it did not)."""
        now = self._clock()
        tracked = None
        if now - self._sized >= self._size_every_s:  # listing the generation costs about 1 ms per 100k
            tracked, self._sized = len(gc.get_objects(2)), now
        try:
            quiet = bool(self._quiet())
        except Exception:  # noqa: BLE001 - a broken probe must not stop collections: take it as busy
            log.exception("the quiet probe failed; taken as busy")
            quiet = False
        why = full_collection_due(quiet=quiet, young_since=gc.get_stats()[1]["collections"] - self._young_at,
                                  tracked=tracked, tracked_after=self._tracked_after, since_s=now - self._since,
                                  growth=self.growth, floor=self.floor, max_interval_s=self.max_interval_s)
        if why is None:
            return None
        t0 = time.perf_counter()
        freed = gc.collect()
        self.last_pause_s = time.perf_counter() - t0
        self.collections += 1
        log.debug("full collection (%s): %d freed in %.1f ms", why, freed, self.last_pause_s * 1e3)
        self._mark(self._clock())
        return why
