"""A small deterministic discrete-event kernel: callbacks on a binary heap.

Why callbacks and not generator processes (as in SimPy): a cluster simulation spends nearly all of
its time moving events through the queue, and most of our model objects (queues, flows, schedulers)
are state machines that react to "this happened at time t" rather than long-lived coroutines. A
callback costs one heap push, one heap pop and one Python call; a SimPy process step additionally
resumes a generator, builds an ``Event`` with its own callback list and goes through the process'
resume logic. ``gfaas.bench.sim`` measures the difference on the same M/M/1 model.

Ordering is total and reproducible. Every event carries the key ``(time, priority, seq)`` where
``seq`` is a per-simulator insertion counter, so:

* earlier time runs first;
* at equal time, the *lower* ``priority`` number runs first (``-1`` before the default ``0``);
* at equal time and priority, events run in the order they were scheduled (FIFO).

Nothing here reads the wall clock or a global random source, so the same schedule calls give the
same run, event for event.

Many arrivals known in advance (:meth:`Simulator.at_many`) get their sequence numbers when they are
submitted, as one :meth:`Simulator.at` call each would give them, but wait in a sorted array and
enter the heap one at a time: so the order is the same as pushing them all, while the heap holds only
the events in flight (a heap of a million pending arrivals makes every push and pop slower).

Cancellation is lazy: :meth:`Simulator.cancel` only sets a flag and the event is dropped when it
reaches the head of the heap. That keeps cancel O(1), which matters for models that reschedule a
completion every time a rate changes (see ``gfaas.sim.network``).

Two implementations of this contract: :class:`PySimulator` below, the reference, and
:class:`NativeSimulator`, the same kernel in Rust (``native/``, built by ``make setup``), which must
agree with it event for event (``tests/unit/test_sim_kernel.py`` runs against both; the cross-checks
in ``tests/integration/test_sim_native_core.py`` compare whole runs). ``Simulator`` is the native one
when it is built, else the reference; ``GFAAS_SIM_CORE=python`` (or ``native``) picks one, for the
kernel and the fluid network (``gfaas.sim.network``) together: :data:`CORE` says which.
"""

from __future__ import annotations

import gc
import heapq
import logging
import math
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..clock import Clock
from ..errors import ConfigError
from ..native import choose, native_class

log = logging.getLogger(__name__)

__all__ = ["CORE", "Event", "EventLog", "NativeSimulator", "PySimulator", "SimClock", "Simulator"]

_INF = math.inf
_GC_GEN0 = 100_000  # allocations between generation-0 collections while a run is in progress


class Event:
    """One scheduled callback. Returned by :meth:`Simulator.schedule` so that it can be cancelled.

    ``done`` becomes true when the callback has been started; ``cancelled`` when it was cancelled
    before that. The heap holds ``(time, priority, seq, event)`` tuples; ``seq`` is unique, so the
    tuple comparison never reaches the event object itself.
    """

    __slots__ = ("args", "cancelled", "done", "fn", "time")

    def __init__(self, time: float, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.time = time
        self.fn = fn
        self.args = args
        self.cancelled = False
        self.done = False

    def __repr__(self) -> str:
        state = "cancelled" if self.cancelled else "done" if self.done else "pending"
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"Event(t={self.time!r}, fn={name}, {state})"


class SimClock:
    """A :class:`gfaas.clock.Clock` that reads a simulator's time.

    Policy code takes a ``Clock`` so that the live runtime and the simulator can drive the same
    decisions; this adapter is what the simulator hands it.
    """

    __slots__ = ("_sim",)

    def __init__(self, sim: PySimulator) -> None:
        self._sim = sim

    def now(self) -> float:
        return self._sim.now


class PySimulator:
    """Event queue plus simulated time (seconds, a float starting at ``start``).

    ``now`` is read-only from outside; it moves only when :meth:`step` or :meth:`run` execute an
    event (to that event's time) or when ``run(until)`` finishes (to ``until``).
    """

    __slots__ = ("_dropped", "_heap", "_ncancelled", "_now", "_running", "_seq", "_unpushed")

    def __init__(self, start: float = 0.0) -> None:
        start = float(start)
        if not math.isfinite(start):
            raise ConfigError(f"simulation start time {start!r} is not finite; pass a finite number of seconds")
        self._now = start
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0
        self._ncancelled = 0  # cancelled events still in the heap
        self._dropped = 0  # cancelled events already popped and discarded
        self._unpushed = 0  # events of at_many() streams not in the heap yet
        self._running = False

    # ---- time -----------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        """Current simulated time in seconds."""
        return self._now

    def clock(self) -> SimClock:
        """A ``Clock`` (``now()`` method) bound to this simulator, for code written against Clock."""
        return SimClock(self)

    # ---- scheduling -----------------------------------------------------------------------------
    def schedule(self, delay: float, fn: Callable[..., None], *args: Any, priority: int = 0) -> Event:
        """Run ``fn(*args)`` at ``now + delay``; ``delay`` must be a finite number >= 0.

        A zero delay is allowed and is how a callback hands work to "later at this same instant":
        the new event runs after every already-scheduled event with the same time and priority.
        """
        # The chained comparison is false for NaN too, which a plain ``delay < 0`` would let through.
        if not 0.0 <= delay < _INF:
            raise ConfigError(
                f"cannot schedule {_name(fn)} with delay {delay!r} s; the delay must be a finite number >= 0"
            )
        t = self._now + delay
        seq = self._seq
        self._seq = seq + 1
        ev = Event(t, fn, args)
        heapq.heappush(self._heap, (t, priority, seq, ev))
        return ev

    def at(self, time: float, fn: Callable[..., None], *args: Any, priority: int = 0) -> Event:
        """Run ``fn(*args)`` at absolute time ``time``, which must not be earlier than ``now``."""
        if not self._now <= time < _INF:
            raise ConfigError(
                f"cannot schedule {_name(fn)} at time {time!r} s: it must be finite and not before "
                f"now ({self._now!r} s); use a later time or schedule(delay, ...)"
            )
        seq = self._seq
        self._seq = seq + 1
        t = float(time)
        ev = Event(t, fn, args)
        heapq.heappush(self._heap, (t, priority, seq, ev))
        return ev

    def at_many(self, times: Iterable[float], fn: Callable[..., None], *args: Any, priority: int = 0) -> None:
        """``at(t, fn, *args, priority=priority)`` for every ``t`` in ``times``, in that order.

        The events get consecutive sequence numbers now, exactly as that loop of ``at`` calls would
        give them, so they run in the same order; but they enter the heap one at a time (the next
        when the one before has run), which keeps the heap small. They cannot be cancelled.
        """
        tolist = getattr(times, "tolist", None)  # a numpy array: its floats without a Python loop
        ts = array("d", tolist() if tolist is not None else times)
        n = len(ts)
        if not n:
            return
        now = self._now
        for t in ts:
            if not now <= t < _INF:  # also false for NaN
                raise ConfigError(
                    f"cannot schedule {_name(fn)} at time {t!r} s: it must be finite and not before "
                    f"now ({now!r} s); use a later time or schedule(delay, ...)"
                )
        base = self._seq
        self._seq = base + n
        seqs: array[int] | None = None
        if any(ts[i] > ts[i + 1] for i in range(n - 1)):
            order = sorted(range(n), key=ts.__getitem__)  # stable: equal times keep submission order
            ts = array("d", [ts[i] for i in order])
            seqs = array("q", [base + i for i in order])
        self._unpushed += n
        _Stream(self, ts, base, seqs, fn, args, priority).push()

    def cancel(self, ev: Event) -> None:
        """Stop ``ev`` from running. A no-op if it already ran or was already cancelled."""
        if ev.cancelled or ev.done:
            return
        ev.cancelled = True
        self._ncancelled += 1

    # ---- running --------------------------------------------------------------------------------
    def peek(self) -> float:
        """Time of the next event that will run, or ``math.inf`` if none is pending."""
        heap = self._heap
        while heap and heap[0][3].cancelled:
            heapq.heappop(heap)
            self._ncancelled -= 1
            self._dropped += 1
        return heap[0][0] if heap else math.inf

    @property
    def events_run(self) -> int:
        """Events executed so far (cancelled ones excluded), including one whose callback is running.

        Derived rather than counted: every scheduled event is either still in the heap, dropped
        after cancellation, or has run, so the hot loop needs no counter of its own.
        """
        return self._seq - len(self._heap) - self._dropped - self._unpushed

    @property
    def pending(self) -> int:
        """Number of scheduled events that have neither run nor been cancelled."""
        return len(self._heap) - self._ncancelled + self._unpushed

    @property
    def heap_size(self) -> int:
        """Entries in the heap now, cancelled ones not yet dropped included (what each push and pop costs)."""
        return len(self._heap)

    def step(self) -> bool:
        """Run the next live event; return False (and leave time alone) if there is none."""
        heap = self._heap
        while heap:
            t, _, _, ev = heapq.heappop(heap)
            if ev.cancelled:
                self._ncancelled -= 1
                self._dropped += 1
                continue
            self._now = t
            ev.done = True
            ev.fn(*ev.args)
            return True
        return False

    def run(self, until: float | None = None) -> float:
        """Run events in order until none is left, or until the next one is later than ``until``.

        Events at exactly ``until`` do run. With ``until`` given, ``now == until`` afterwards even if
        the queue ran dry earlier, so that a caller can run a simulation in fixed slices. Returns
        ``now``. If a callback raises, the exception propagates with ``now`` at that event's time and
        the remaining events still queued; ``run`` can be called again.
        """
        if self._running:
            raise ConfigError("Simulator.run() was called from inside an event callback; schedule "
                              "the work as an event instead of running the simulator re-entrantly")
        if until is None:
            limit = math.inf
        else:
            if not until >= self._now:
                raise ConfigError(f"cannot run until {until!r} s: it is before now ({self._now!r} s); "
                                  "pass a time >= now")
            limit = float(until)
        heap = self._heap
        pop = heapq.heappop
        self._running = True
        # A run allocates millions of short-lived events and tuples; the default generation-0
        # threshold (700) then runs the cycle collector thousands of times per simulated second,
        # about 12-25% of the wall time at cluster scale (docs/design/simulator.md). Collect
        # less often while running and restore the caller's thresholds afterwards.
        thresholds = gc.get_threshold()
        gc.set_threshold(max(thresholds[0], _GC_GEN0), *thresholds[1:])
        try:
            while heap:
                entry = heap[0]
                t = entry[0]
                if t > limit:
                    break
                pop(heap)
                ev = entry[3]
                if ev.cancelled:
                    self._ncancelled -= 1
                    self._dropped += 1
                    continue
                self._now = t
                ev.done = True
                ev.fn(*ev.args)
        finally:
            self._running = False
            gc.set_threshold(*thresholds)
        if until is not None:
            self._now = limit
        return self._now


class _Stream:
    """The not-yet-pushed events of one :meth:`Simulator.at_many` call; its next one sits in the heap."""

    __slots__ = ("args", "base", "fn", "i", "priority", "seqs", "sim", "times")

    def __init__(self, sim: PySimulator, times: array[float], base: int, seqs: array[int] | None,
                 fn: Callable[..., None], args: tuple[Any, ...], priority: int) -> None:
        self.sim = sim
        self.times = times
        self.base = base
        self.seqs = seqs
        self.fn = fn
        self.args = args
        self.priority = priority
        self.i = 0

    def push(self) -> None:
        """Move event ``i`` into the heap, with the sequence number it was given at submission."""
        i = self.i
        t = self.times[i]
        seq = self.base + i if self.seqs is None else self.seqs[i]
        self.sim._unpushed -= 1
        heapq.heappush(self.sim._heap, (t, self.priority, seq, Event(t, self.fire, ())))

    def fire(self) -> None:
        self.i += 1
        if self.i < len(self.times):
            self.push()  # before the callback, so that an exception leaves the stream consistent
        self.fn(*self.args)


class EventLog:
    """An ordered record of what happened, as ``(time, kind, *details)`` tuples.

    Tests compare the whole list against an expected one, so a model that reorders, drops or
    duplicates an event fails loudly instead of only shifting an average.
    """

    __slots__ = ("_clock", "entries")

    def __init__(self, source: PySimulator | Clock) -> None:
        # The native kernel is no PySimulator subclass: a Clock is anything else.
        self._clock: Clock = source.clock() if isinstance(source, _KERNELS) else source  # type: ignore[union-attr, assignment]
        self.entries: list[tuple[Any, ...]] = []

    def record(self, kind: str, *details: Any) -> None:
        """Append ``(now, kind, *details)``."""
        self.entries.append((self._clock.now(), kind, *details))

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        """The entries of one kind, in order."""
        return [e for e in self.entries if e[1] == kind]

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.entries)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


_Native = native_class("Kernel")

if _Native is not None:
    class NativeSimulator(_Native):  # type: ignore[misc, valid-type]
        """:class:`PySimulator`'s contract in Rust (``native/src/lib.rs``); the same events in the same order."""

        __slots__ = ()

        def clock(self) -> SimClock:
            return SimClock(self)
else:
    NativeSimulator = None  # type: ignore[assignment, misc]


def _choose() -> tuple[str, Any]:
    core = choose("GFAAS_SIM_CORE", NativeSimulator is not None, "Kernel")
    if core == "python" and NativeSimulator is None:
        log.debug("gfaas_native is not built: the simulator runs the pure-Python kernel (make setup builds it)")
    return core, (NativeSimulator if core == "native" else PySimulator)


#: Which core ``Simulator`` and ``gfaas.sim.network.Network`` are: ``"native"`` or ``"python"``
#: (result files record it in their provenance).
CORE: str
if TYPE_CHECKING:
    Simulator = PySimulator
else:
    CORE, Simulator = _choose()
_KERNELS: tuple[type, ...] = (PySimulator,) if NativeSimulator is None else (PySimulator, NativeSimulator)
