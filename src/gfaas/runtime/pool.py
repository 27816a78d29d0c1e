"""One function's workers and queue, scaled by the shared policy.

A :class:`FunctionPool` keeps a FIFO queue of calls and a set of worker slots (a process, a Ray actor,
or in-process). A call goes straight to an idle worker when there is one (the caller's thread sends
it, :meth:`PoolHost.dispatch`), else it waits in the queue; when a worker's reply arrives (on the
invoker's thread, :mod:`gfaas.runtime.invoker`), :meth:`FunctionPool.task_done` hands that worker the
next queued call or marks it idle. Slots have threads only to start and to stop their worker: no task
ever waits for a thread. How many slots there are is decided by
:class:`gfaas.policy.workerpool.WorkerPoolPolicy`, the object the autoscaling simulator
(:mod:`gfaas.sim.autoscale`) calls too: on the runtime's tick (:class:`Autoscaler`), where the scaler
samples the concurrency, and after an arrival or completion that leaves requests waiting (that
decision starts at once the workers those requests need: the policy's fast path, no tick).

A start first reserves the function's ``resources`` on its node's ledger (the runtime's
``reserve``); when they do not fit and requests wait for the start (or it is one of the function's
``min`` workers), idle workers of other functions are stopped to make room (the policy's
:func:`~gfaas.policy.resources.choose_evictions`); when even that does not make room the start
waits, its requests stay queued, and it is tried again on the next tick or when a worker stops.

Cold starts: a start made while requests wait for a worker is one (the policy decides which);
the first task such a worker runs carries ``cold_start_s``, the part of its wait spent on the start.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import FunctionFailed, Overloaded
from ..policy.autoscale import ScalingSpec
from ..policy.locality import LOOKAHEAD, pick_call
from ..policy.resources import Candidate, Resources
from ..policy.workerpool import PoolDecision, WorkerPoolPolicy, WorkerView

if TYPE_CHECKING:
    from .cluster import Cluster
    from .worker import Init

log = logging.getLogger("gfaas.runtime")


class PoolHost(Protocol):
    """What a pool needs of the runtime that owns it (:class:`~gfaas.runtime.local.LocalRuntime`)."""

    cluster: Cluster

    def start_worker(self, init: Init, node: str = "") -> Any: ...
    def reserve(self, pool: FunctionPool, evict: bool = False, node: str = "") -> bool: ...
    def release(self, pool: FunctionPool, res: Resources, node: str = "") -> None: ...
    def slot_node(self, pool: FunctionPool, waiting: list[str | None], workers: dict[str, int]) -> str: ...
    def failed(self, inv: Any, fn: str, message: str) -> None: ...
    def dropped(self, inv: Any, fn: str) -> None: ...
    def queues_changed(self, inv: Any = None, queue: str | None = None) -> None: ...
    def deadline_added(self, at: float) -> None: ...
    def dispatch(self, inv: Any, fn: str, pool: FunctionPool, worker: Any, cold_start_s: float) -> None:
        """Send ``fn`` of ``inv`` to ``worker`` (claimed for it): returns at once, the reply comes later."""
    def attach(self, worker: Any) -> None:
        """A started worker: its replies are read from now on."""
    def detach(self, worker: Any) -> None:
        """A worker about to stop: its replies are no longer read (returns once that holds)."""


@dataclass
class _Slot:
    id: int
    state: str  # starting | idle | busy | stopping
    since: float  # when it entered its state (monotonic)
    started: float  # when its start began
    cold: bool  # started for waiting requests: its first task carries the wait
    worker: Any = None
    ready: float = 0.0
    tasks: int = 0
    released: bool = False  # its reservation was handed to another start (an eviction)
    thread: threading.Thread | None = None  # the thread that starts, or stops, its worker
    starting: bool = False  # its start thread runs (it stops the worker itself if told to meanwhile)
    stop_spawned: bool = False  # a stop of its worker is under way
    node: str = ""  # the node its worker runs on
    unplaced: str = ""  # why no node could take it (locality: every node down): its start fails with this


class FunctionPool:
    """The queue and scaled workers of one function of one workflow version."""

    def __init__(self, rt: PoolHost, key: str, node: str, init: Init, scaling: ScalingSpec, res: Resources,
                 gpu: str, max_queue: int, tick_s: float) -> None:
        self.rt, self.key, self.node, self.init = rt, key, node, init
        # With locality (runtime.cluster) workers start on any node, the one most waiting calls'
        # inputs are on preferred, and a free worker takes the call whose inputs are on its node first.
        self.locality = False
        self.pinned = True  # locality off for this function (placed on ``node`` by the runtime's config)
        self.scaling, self.res, self.gpu = scaling, res, gpu
        self.max_queue = max_queue
        self.policy = WorkerPoolPolicy(scaling, tick_s)
        self.queue: deque[tuple[Any, str, float]] = deque()  # (invocation, function, enqueued)
        # Requests that entered and that left the queue so far: a request's ticket is ``entered`` when
        # it enters (kept in ``inv.queued``), so ``ticket - left`` are ahead of it (queue hints).
        self.entered = 0
        self.left = 0
        # The function's last compute time: what its SLO and its inputs' deadline derive from
        # (policy.bandwidth; 0 until it has run once).
        self.compute_s = 0.0
        self.budget_s = 0.0  # policy.bandwidth.input_deadline of compute_s: a call's inputs are due by then
        # ``cv``'s lock: taken as itself where nobody waits (a Condition's own enter and exit are
        # Python calls, twice per task on the hot path)
        self._mutex = threading.RLock()
        self.cv = threading.Condition(self._mutex)
        self.closed = False
        self.cold_starts = 0  # starts for waiting requests (the policy's rule)
        self.starts = 0
        self.stops = 0
        self.deferred = 0  # starts that waited for resources
        self.expired = 0  # tasks not run because their invocation's deadline had passed
        self.worker_seconds = 0.0  # of stopped workers (live ones are added in counts())
        self.start_s: deque[float] = deque(maxlen=64)  # how long recent starts took (ready - began)
        self.start_phases: deque[dict[str, float]] = deque(maxlen=64)  # theirs, phase by phase (seconds)
        self.target = 0
        self.next_check: float | None = None
        self._slots: dict[int, _Slot] = {}
        self._ids = itertools.count()

    # -- views
    @property
    def slots(self) -> list[Any]:
        """The live workers (started and not stopping), oldest first."""
        with self.cv:
            return [s.worker for s in self._slots.values() if s.worker is not None and s.state in ("idle", "busy")]

    def _views(self) -> list[WorkerView]:
        return [WorkerView(s.id, "starting" if s.state == "starting" else s.state, s.since)  # type: ignore[arg-type]
                for s in self._slots.values() if s.state != "stopping"]

    def counts(self, now: float | None = None) -> dict[str, Any]:
        """Workers by state, queue length, cold starts and worker-seconds (status and /metrics)."""
        now = time.monotonic() if now is None else now
        with self.cv:
            states = [s.state for s in self._slots.values()]
            live_s = sum(now - s.started for s in self._slots.values())
            return {"warm": states.count("idle") + states.count("busy"), "idle": states.count("idle"),
                    "busy": states.count("busy"), "starting": states.count("starting"),
                    "stopping": states.count("stopping"), "queued": len(self.queue), "target": self.target,
                    "min": self.scaling.min, "max": self.scaling.max, "keep_alive": self.scaling.keep_alive,
                    "cold_starts": self.cold_starts, "starts": self.starts, "stops": self.stops,
                    "deferred_starts": self.deferred, "expired": self.expired, "worker_seconds": round(self.worker_seconds + live_s, 3),
                    "start_s_mean": round(sum(self.start_s) / len(self.start_s), 4) if self.start_s else None,
                    "start_s_p50": round(statistics.median(self.start_s), 4) if self.start_s else None,
                    "start_ms_p50": start_phase_p50(self.start_phases),
                    "resources": self.res.describe(), "nodes": self._per_node()}

    def worker_nodes(self) -> set[str]:
        """The nodes this pool's warm workers are on (where its next calls will likely run)."""
        with self.cv:
            return {s.node for s in self._slots.values() if s.state in ("idle", "busy") and s.node}

    def _per_node(self) -> dict[str, int]:  # under self.cv
        out: dict[str, int] = {}
        for s in self._slots.values():
            if s.state in ("idle", "busy"):
                out[s.node] = out.get(s.node, 0) + 1
        return out

    def _place(self) -> tuple[str, str]:
        """(node, "") for the next worker, or ("", why) when no node can take one now."""
        if not self.locality or self.pinned:
            return self.node, ""
        with self.cv:
            waiting = [inv.prefer.get(fn) for inv, fn, _ in list(self.queue)[:64]]
            workers: dict[str, int] = {}
            for s in self._slots.values():
                if s.state != "stopping":
                    workers[s.node] = workers.get(s.node, 0) + 1
        try:
            return self.rt.slot_node(self, waiting, workers), ""
        except FunctionFailed as exc:
            return "", str(exc)

    def memory(self) -> dict[str, int]:
        """The warm workers' memory now: RSS, and PSS, which splits each shared page among the processes
        that map it, so weights shared or merged by page merging (docs/dedup.md) count once in all."""
        from ..dedup.procstat import mem_usage

        with self.cv:
            pids = [int(s.worker.pid) for s in self._slots.values()
                    if s.state in ("idle", "busy") and isinstance(getattr(s.worker, "pid", None), int)]
        rss = pss = 0
        for pid in pids:
            m = mem_usage(pid)
            if m is not None:
                rss, pss = rss + m.rss, pss + m.pss
        return {"rss_bytes": rss, "pss_bytes": pss, "processes": len(pids)}

    def candidates(self) -> list[Candidate]:
        """Idle workers above the function's minimum, longest idle first (what an eviction may stop)."""
        with self.cv:
            idle = sorted((s for s in self._slots.values() if s.state == "idle"), key=lambda s: s.since)
            spare = len([s for s in self._slots.values() if s.state != "stopping"]) - self.scaling.min
            return [Candidate(self.key, s.id, self.res, self.gpu, s.since) for s in idle[:max(0, spare)]]

    def position(self, invocation: str) -> int | None:
        with self.cv:
            for k, (inv, _, _) in enumerate(self.queue):
                if inv.id == invocation:
                    return k
        return None

    def positions(self) -> dict[str, int]:
        """Invocation id -> requests ahead of its first entry, for the whole queue in one pass."""
        out: dict[str, int] = {}
        with self.cv:
            for k, (inv, _, _) in enumerate(self.queue):
                out.setdefault(inv.id, k)
        return out

    # -- lifecycle
    def start(self, prewarm: bool) -> None:
        """At deploy: start ``min`` workers (at least one with ``prewarm``) before returning, so a
        handler that does not import fails the deploy."""
        now = time.monotonic()
        if prewarm:  # the pre-warmed worker is kept as if just used; without, nothing starts before a request
            with self.cv:
                self.policy.deployed(now)
        n = max(self.scaling.min, 1 if prewarm else 0)
        for k in range(n):
            node, why = self._place()
            if why:
                raise FunctionFailed(why)
            if not self.rt.reserve(self, evict=k < self.scaling.min, node=node):
                log.warning("%s: no room on node %s for a pre-warmed worker (resources %s); it starts on demand",
                            self.key, node, self.res.describe())
                break
            slot = self._new_slot(time.monotonic(), cold=False, node=node)  # each start timed from its own beginning
            assert slot is not None
            try:
                worker = self.rt.start_worker(self.init, node)
            except BaseException:
                with self.cv:
                    self._slots.pop(slot.id, None)
                self.rt.release(self, self.res, node=node)
                raise
            t = time.monotonic()
            with self.cv:
                slot.worker, slot.ready = worker, t
                self._started(worker, t - slot.started)
            self.rt.attach(worker)
            with self.cv:
                slot.state, slot.since = "idle", t
            self._pull(slot)

    def _started(self, worker: Any, took_s: float) -> None:  # under self.cv
        self.start_s.append(took_s)
        self.policy.started(took_s)
        if getattr(worker, "start_phases", None):  # process workers report theirs (worker.ProcessWorker)
            self.start_phases.append(worker.start_phases)

    def submit(self, inv: Any, function: str) -> None:
        now = time.monotonic()
        with self._mutex:
            if self.closed:
                raise Overloaded(f"{self.key} is shutting down; retry on the current version")
            if len(self.queue) >= self.max_queue:
                raise Overloaded(f"queue of {self.key} holds {len(self.queue)} requests (max_queue="
                                 f"{self.max_queue}); retry later or raise max_queue")
            if inv.deadline is not None and self.compute_s > 0:
                # When it would start: the requests ahead, served by the warm workers at the last
                # compute time. Refused now rather than after waiting in vain.
                warm = sum(1 for s in self._slots.values() if s.state in ("idle", "busy"))
                start_in = len(self.queue) / max(warm, 1) * self.compute_s
                if now + start_in > inv.deadline:
                    raise Overloaded(f"{self.key} could not start this request within its deadline ({len(self.queue)} "
                                     f"waiting for {warm} workers at {self.compute_s * 1e3:.1f} ms each: about "
                                     f"{start_in:.2f} s); retry later")
            self.policy.arrival(now)
            slot = self._idle_for(inv.prefer.get(function)) if not self.queue else None
            d = None
            if slot is not None:  # straight to a warm worker: no queue, no thread (the tick decides later)
                self._busy(slot, now)
            else:
                self.queue.append((inv, function, now))
                if inv.deadline is not None:  # expired at its deadline by the scaler's tick (expire)
                    self.rt.deadline_added(inv.deadline)
                inv.queued[function] = (self.key, self.entered)
                self.entered += 1
                if self._decides_after():  # a start, perhaps (not at max with every worker busy)
                    d = self._decide(now, sample=False)
        self.rt.queues_changed(inv, self.key)  # queued, or running (queue-aware eviction on the node)
        if slot is not None:
            self.rt.dispatch(inv, function, self, slot.worker, 0.0)
        if d is not None:
            self.apply(d)

    def claim(self) -> Any:
        """The idle worker a call that runs at once takes, claimed as :meth:`submit` claims one for a
        call with no node preferred (the policy hears of the arrival; the slot is busy), for the caller
        to send it its task (the invoker's lane); ``task_done`` ends it as any. None, having changed
        nothing, where submit would queue the call or refuse it: the pool closed, calls wait, the
        queue is full, or no worker is idle."""
        now = time.monotonic()
        with self._mutex:
            if self.closed or self.queue or len(self.queue) >= self.max_queue:
                return None
            slot = self._idle_for(None)
            if slot is None:
                return None
            self.policy.arrival(now)
            self._busy(slot, now)
        return slot.worker

    @staticmethod
    def _busy(slot: _Slot, now: float) -> None:  # under self.cv
        slot.state, slot.since = "busy", now
        slot.tasks += 1

    def _idle_for(self, prefer: str | None) -> _Slot | None:  # under self.cv
        """An idle worker to take a call whose inputs are on ``prefer`` (None: anywhere): with locality,
        one on that node if there is one, else any (work-conserving, as :func:`pick_call` decides)."""
        first = None
        anywhere = not self.locality or self.pinned or prefer is None
        for s in self._slots.values():
            if s.state == "idle":
                if anywhere or s.node == prefer:
                    return s
                if first is None:
                    first = s
        return first

    def task_done(self, worker: Any) -> tuple[Any, str, float] | None:
        """``worker`` replied to its task (the invoker's thread): the next queued call it takes, as
        ``(invocation, function, cold_start_s)`` for the invoker to send, or None (it is idle now, or
        stops: its pool closed, it died, or its node went down)."""
        now = time.monotonic()
        with self._mutex:
            for slot in self._slots.values():
                if slot.worker is worker:
                    break
            else:
                self.policy.done(now)
                return None
            self.policy.done(now, now - slot.since if slot.state == "busy" else None)
            gone = self.locality and not self.pinned and not self.rt.cluster.up(slot.node)
            if slot.state == "busy":  # it just replied, so it is alive (a death comes as the end of its socket)
                if not gone and not self.closed:
                    slot.state, slot.since = "idle", now
                else:
                    slot.state = "stopping"
            nxt, ended = self._take(slot, now) if slot.state == "idle" and self.queue else (None, ())
            stop = slot.state == "stopping"
            # A warm call's completion costs no decision: the tick takes it (policy.workerpool).
            d = self._decide(now, sample=False) if self._decides_after() else None
        if ended or nxt is not None:
            self._ended(ended, nxt)
        if stop:
            self._spawn_stop(slot)
        if d is not None:
            self.apply(d)
        return nxt

    def retire_node(self, node: str) -> int:
        """``node`` left the cluster: stop this pool's idle workers there now (busy ones stop when their
        task ends: ``task_done``), then decide again, so the calls they would have taken get workers on
        the nodes left. Returns how many were stopped now."""
        if not self.locality or self.pinned:
            return 0
        with self.cv:
            stopping = [s for s in self._slots.values() if s.node == node and s.state == "idle"]
            for s in stopping:
                s.state = "stopping"
            d = None if self.closed else self._decide(time.monotonic(), sample=False)
        for s in stopping:
            self._spawn_stop(s)
        if d is not None:
            self.apply(d)
        return len(stopping)

    def _pull(self, slot: _Slot) -> None:
        """A worker just became idle outside a reply (started): give it the next queued call, if any."""
        with self.cv:
            nxt, ended = self._take(slot, time.monotonic()) if slot.state == "idle" else (None, [])
        self._ended(ended, nxt)
        if nxt is not None:
            self.rt.dispatch(nxt[0], nxt[1], self, slot.worker, nxt[2])

    def _take(self, slot: _Slot, now: float) -> tuple[tuple[Any, str, float] | None, list[tuple[Any, str, bool]]]:
        """Under ``cv``, ``slot`` idle: the next queued call it should run (it becomes busy), and the
        calls passed over because their invocation failed or their deadline passed (``(inv, fn,
        expired)``, ended by :meth:`_ended` once the lock is released)."""
        ended: list[tuple[Any, str, bool]] = []
        while self.queue:
            k = self._pick(slot)
            if k is None:  # every call in view is for a free worker on another node
                break
            inv, fn, enqueued = self.queue[k]
            del self.queue[k]
            self.left += 1
            inv.queued.pop(fn, None)
            if inv.status == "failed":
                ended.append((inv, fn, False))
                continue
            if inv.deadline is not None and now > inv.deadline:
                self.expired += 1
                ended.append((inv, fn, True))
                continue
            cold_s = 0.0
            if slot.cold and slot.tasks == 0 and enqueued < slot.ready:
                cold_s = slot.ready - max(enqueued, slot.started)
            self._busy(slot, now)
            return (inv, fn, cold_s), ended
        return None, ended

    def _ended(self, ended: Sequence[tuple[Any, str, bool]], picked: tuple[Any, str, float] | None) -> None:
        for inv, fn, expired in ended:
            self.rt.queues_changed(inv, self.key)
            if expired:
                self.rt.failed(inv, fn, f"expired: {fn} was still queued when the invocation's deadline passed "
                                        "(it was not run)")
            else:
                self.rt.dropped(inv, fn)
        if picked is not None:
            self.rt.queues_changed(picked[0], self.key)

    def tick(self, now: float) -> float | None:
        """The autoscaler's periodic decision (the scaler samples here) and the expiry of queued calls;
        returns when to tick again: the policy's next check or the earliest deadline still queued."""
        earliest = self.expire(now)
        with self.cv:
            if self.closed:
                return None
            d = self._decide(now, sample=True)
        self.apply(d)
        if earliest is None:
            return d.next_check
        return earliest if d.next_check is None else min(d.next_check, earliest)

    def expire(self, now: float) -> float | None:
        """Fail the queued calls whose invocation's deadline has passed, at the deadline rather than when
        a worker reaches them (a caller gone after its timeout must not wait in line, nor hold one);
        returns the earliest deadline still queued (plus a millisecond, so a tick lands past it)."""
        gone: list[tuple[Any, str, float]] = []
        earliest: float | None = None
        with self.cv:
            if not any(inv.deadline is not None for inv, _, _ in self.queue):
                return None
            keep = []
            for item in self.queue:
                deadline = item[0].deadline
                if deadline is not None and now > deadline:
                    gone.append(item)
                else:
                    keep.append(item)
                    if deadline is not None and (earliest is None or deadline < earliest):
                        earliest = deadline
            if gone:
                self.queue.clear()
                self.queue.extend(keep)
                self.left += len(gone)
                self.expired += len(gone)
        for inv, fn, _ in gone:
            inv.queued.pop(fn, None)
            self.rt.queues_changed(inv, self.key)
            self.rt.failed(inv, fn, f"expired: {fn} was still queued when the invocation's deadline passed "
                                    "(it was not run)")
        return None if earliest is None else earliest + 1e-3

    def _decides_after(self) -> bool:  # under self.cv
        """Whether the event just handled (an arrival, a completion) calls for a decision now
        (WorkerPoolPolicy.decides_after), from the workers ``_views`` would give it."""
        if not self.queue:
            return False
        live = idle = 0
        for s in self._slots.values():
            if s.state != "stopping":
                live += 1
                idle += s.state == "idle"
        return self.policy.decides_after(len(self.queue), live, idle)

    def _decide(self, now: float, sample: bool) -> PoolDecision:  # under self.cv
        d = self.policy.decide(now, len(self.queue), self._views(), sample=sample)
        self.target, self.next_check = d.target, d.next_check
        return d

    def apply(self, d: PoolDecision) -> None:
        """Carry out a decision: stop the named idle workers, start what fits (the rest waits)."""
        if d.stop:
            stopping = []
            with self.cv:
                for sid in d.stop:
                    s = self._slots.get(sid)
                    if s is not None and s.state == "idle":
                        s.state = "stopping"
                        stopping.append(s)
            for s in stopping:
                self._spawn_stop(s)
        now = time.monotonic()
        for k in range(d.start):
            if self.closed:
                return
            node, why = self._place()
            # Only a start for waiting requests may stop another function's idle worker: a pre-warm
            # that pushed out a warm worker would only move the cold start elsewhere.
            if not why and not self.rt.reserve(self, evict=k < d.cold, node=node):
                with self.cv:
                    self.deferred += 1
                log.info("%s: start deferred, node %s has no room for resources %s", self.key, node,
                         self.res.describe())
                return
            slot = self._new_slot(now, cold=k < d.cold, bound=True, node=node)
            if slot is None:  # another decision started it meanwhile
                if not why:
                    self.rt.release(self, self.res, node=node)
                return
            if why:  # its start fails with the reason, failing the calls nothing else can run
                slot.unplaced, slot.released = why, True
            self._spawn(slot)

    def _new_slot(self, now: float, cold: bool, bound: bool = False, node: str = "") -> _Slot | None:
        """A slot in state starting; with ``bound``, only while the live count is under the current
        target and ``max`` (two decisions made side by side must not both start the same worker)."""
        with self.cv:
            live = sum(1 for s in self._slots.values() if s.state != "stopping")
            if bound and live >= min(self.target, self.scaling.max):
                return None
            slot = _Slot(next(self._ids), "starting", now, now, cold, node=node or self.node)
            self._slots[slot.id] = slot
            self.starts += 1
            if cold:
                self.cold_starts += 1
        return slot

    def _spawn(self, slot: _Slot) -> None:
        """Start ``slot``'s worker on a thread of its own (a start takes a process and a model load)."""
        with self.cv:
            slot.starting = True
        slot.thread = threading.Thread(target=self._serve, args=(slot,), name=f"gfaas-{self.key}-{slot.id}",
                                       daemon=True)
        slot.thread.start()

    def _spawn_stop(self, slot: _Slot) -> None:
        """Stop ``slot``'s worker (state stopping) on a thread, once (a start thread still running stops
        it itself when its start returns)."""
        with self.cv:
            if slot.stop_spawned or slot.starting:
                return
            slot.stop_spawned = True
            slot.thread = threading.Thread(target=self._end, args=(slot,), name=f"gfaas-stop-{self.key}-{slot.id}",
                                           daemon=True)
        slot.thread.start()

    def evict(self, sid: int) -> bool:
        """Stop an idle worker to make room for another function's (the reservation is handed over
        now, so its stop does not release it); False if it is no longer idle."""
        with self.cv:
            s = self._slots.get(sid)
            if s is None or s.state != "idle":
                return False
            s.state, s.released = "stopping", True
        self._spawn_stop(s)
        return True

    def replace_dead(self, worker: Any) -> None:
        """A worker died during a task: its slot ends (the policy starts another if one is needed)."""
        with self.cv:
            dead = [s for s in self._slots.values() if s.worker is worker]
            for s in dead:
                s.state = "stopping"
        for s in dead:
            self._spawn_stop(s)

    def close(self, timeout: float = 30.0) -> None:
        """Stop every worker: idle ones now, a busy one once its task replies (its caller still gets the
        answer); returns when all have stopped, or after ``timeout``."""
        with self.cv:
            self.closed = True
            stopping = []
            for s in self._slots.values():
                if s.state in ("idle", "starting"):
                    s.state = "stopping"
                    if s.worker is not None:
                        stopping.append(s)
        for s in stopping:
            self._spawn_stop(s)
        deadline = time.monotonic() + timeout
        with self.cv:
            while self._slots and time.monotonic() < deadline:
                self.cv.wait(min(0.1, max(0.0, deadline - time.monotonic())))

    # -- a slot's start
    def _serve(self, slot: _Slot) -> None:
        started = slot.worker is not None or self._start(slot)
        if started:
            self._pull(slot)
        with self.cv:
            slot.starting = False
            stop = slot.state == "stopping" and not slot.stop_spawned
            if stop:
                slot.stop_spawned = True
        if stop:  # it failed to start, or was told to stop while it started
            self._end(slot)

    def _start(self, slot: _Slot) -> bool:
        try:
            if slot.unplaced:
                raise FunctionFailed(slot.unplaced)
            worker = self.rt.start_worker(self.init, slot.node)
        except FunctionFailed as exc:
            log.warning("%s: a worker did not start: %s", self.key, exc)
            with self.cv:
                slot.state = "stopping"
                others = any(s.state in ("idle", "busy", "starting") for s in self._slots.values() if s is not slot)
                failing = [] if others else list(self.queue)
                if failing:
                    self.queue.clear()
                    self.left += len(failing)
                    for inv, fn, _ in failing:
                        inv.queued.pop(fn, None)
            for inv, fn, _ in failing:  # nothing else can run them: they fail with the start's error
                self.rt.failed(inv, fn, str(exc))
            if failing:
                self.rt.queues_changed(None, self.key)
            return False
        now = time.monotonic()
        with self.cv:
            slot.worker, slot.ready = worker, now
            self._started(worker, now - slot.started)
        self.rt.attach(worker)
        with self.cv:
            if slot.state == "stopping" or self.closed:
                slot.state = "stopping"
                return True  # told to stop while starting: _serve stops it
            slot.state, slot.since = "idle", now
            d = self._decide(now, sample=False)
        self.apply(d)
        return True

    def _pick(self, slot: _Slot) -> int | None:  # under self.cv, queue not empty
        if not self.locality or self.pinned:
            return 0
        view = list(itertools.islice(self.queue, LOOKAHEAD))
        idle = {s.node for s in self._slots.values() if s.state == "idle" and s is not slot}
        return pick_call(slot.node, [inv.prefer.get(fn) for inv, fn, _ in view], idle)

    def _end(self, slot: _Slot) -> None:
        if slot.worker is not None:
            try:
                self.rt.detach(slot.worker)
                slot.worker.stop()
            except Exception:  # noqa: BLE001 - the slot ends whatever the worker says
                log.exception("%s: stopping worker %s failed", self.key, getattr(slot.worker, "name", "?"))
        now = time.monotonic()
        with self.cv:
            self._slots.pop(slot.id, None)
            self.worker_seconds += now - slot.started
            self.stops += 1
            closed = self.closed
            self.cv.notify_all()  # close() waits for the last slot
        if not slot.released:
            self.rt.release(self, self.res, node=slot.node)
        if not closed:  # a request may wait for a replacement (a worker that died, or was evicted)
            with self.cv:
                d = self._decide(now, sample=False)
            self.apply(d)


def start_phase_p50(starts: Sequence[dict[str, float]]) -> dict[str, float]:
    """The median milliseconds of each start phase over ``starts`` (each phase over the starts that
    had it: "template" only the first, "model" only with a model)."""
    by: dict[str, list[float]] = {}
    for st in starts:
        for k, v in st.items():
            by.setdefault(k, []).append(v)
    return {k: round(statistics.median(v) * 1e3, 2) for k, v in by.items()}


class Autoscaler:
    """The runtime's one scaling thread: ticks every pool while any is active, else sleeps until the
    earliest keep-alive change (a pre-warm or an expiry) or until woken (a deploy, a freed reservation)."""

    def __init__(self, pools: Any, tick_s: float) -> None:
        self._pools = pools  # callable -> list of FunctionPool
        self.tick_s = tick_s
        self._wake = threading.Event()
        self._stop = False
        self._next: float | None = None  # when the thread plans to tick next (None: until woken)
        self._thread = threading.Thread(target=self._run, name="gfaas-autoscaler", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def wake_by(self, at: float) -> None:
        """Make sure the next tick comes no later than ``at`` (a queued call's deadline)."""
        nxt = self._next
        if nxt is None or at < nxt:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            now = time.monotonic()
            self._next = now  # while ticking: a deadline added now is seen by this round or the next
            nxt: float | None = None
            for p in self._pools():
                try:
                    n = p.tick(now)
                except Exception:  # noqa: BLE001 - one pool's failure must not stop the others' scaling
                    log.exception("autoscaler: %s", p.key)
                    n = now + self.tick_s
                if n is not None:
                    nxt = n if nxt is None else min(nxt, n)
            self._next = nxt
            wait = None if nxt is None else max(0.0, nxt - time.monotonic())
            self._wake.wait(wait)
            self._wake.clear()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(10)
