"""The invoker: every invocation from its submit to its result, one message per step.

``submit`` checks the request, keeps inputs small enough (``RuntimeConfig.inline_max_bytes``) as
values carried in the task messages (larger ones are stored on the node, which opens the invocation
there), and hands the functions :class:`DagState` says are ready to their pools. A pool with an idle
worker sends the task at once from the caller's thread (:meth:`Invoker.dispatch`); otherwise the call
waits in its queue. Each reply is read by the loop's thread (:mod:`.loop`), which records it, steps the
DAG, sends the next tasks and, once every function has run or been skipped, sets the result: the
outputs carried in the replies, or read from the node for stored ones. So a tiny invocation costs one
message per step each way and nothing on the node daemon. ``docs/design/request-path.md`` follows one
invocation through this file.

Failures end an invocation with the function's error and its last log lines; a worker that dies, or
runs past its function's ``timeout_s``, fails the invocation it held and is replaced.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..dataplane.ids import DataRef
from ..dataplane.protocol import QueueEntry
from ..errors import AccessDenied, ConfigError, FunctionFailed, GfaasError, NotFound, Overloaded, SpecError
from ..policy.bandwidth import input_deadline, slo_for
from ..policy.locality import choose_node
from ..policy.polling import invoker_polls
from .accel import DSCS, Decision, DscsDrives
from .config import RuntimeConfig
from .dag import DagState
from .dedup import RuntimeDedup
from .deployments import Deployments, pool_key
from .hints import Batch as HintBatch
from .hints import QueueHinter
from .lane import LanePlan, lane_plan
from .logs import LogStore, failure_lines
from .loop import ReplyLoop
from .nodes import Nodes
from .pool import FunctionPool
from .result import Breakdown, Failure, FunctionRecord, InvocationResult, Status
from .spec import INPUT, WorkflowSpec, name_diff
from .transport import Transport
from .worker import (
    GATEWAY,
    INLINE,
    Done,
    Failed,
    NeedData,
    Task,
    TaskTimedOut,
    Value,
    WorkerDied,
    check_value,
    to_value,
)

log = logging.getLogger("gfaas.runtime")

KEEP_RESULTS = 10_000  # finished invocations whose results stay fetchable by ID (the most recent)

InputGenerator = Callable[[str, int, str], dict[str, np.ndarray]]


class _Invocation:
    """One invocation's state (a slotted class: one is made per request)."""

    __slots__ = ("callbacks", "completing", "dag", "deadline", "done", "driver", "ended", "enqueued", "error", "failure",
                 "homes", "host_s", "id", "inline_max", "kind", "on_nodes", "opened", "prefer", "queued", "records",
                 "refs", "result", "running", "spec", "status", "submitted", "tokens", "values", "version")

    def __init__(self, inv_id: str, spec: WorkflowSpec, version: int, kind: str, deadline: float | None) -> None:
        self.id = inv_id
        self.spec = spec
        self.version = version  # the workflow version it runs on (the current one when it was submitted)
        self.kind = kind  # its transport
        self.inline_max = 0  # the largest value carried in its messages (Invoker._inline_max of its transport)
        self.deadline = deadline  # monotonic time by which its functions must start (submit's deadline_s)
        self.dag = DagState(spec)
        self.submitted = time.perf_counter()
        self.tokens: dict[str, str] = {}
        self.opened = False  # open on the node daemons (tokens drawn): only once something is stored there
        # Nodes.opens_lazily: node -> set once the invocation is open there (None: open everywhere at once)
        self.on_nodes: dict[str, _Once] | None = None
        self.refs: dict[tuple[str, str], str] = {}  # (source, output) -> reference
        # (source, output) -> a small value carried in the runtime's messages instead of the data plane
        self.values: dict[tuple[str, str], Value] = {}
        # (source, output) -> the simulated drive that holds it (runtime.accel's rule); -1: none
        self.homes: dict[tuple[str, str], int] = {}
        self.records: dict[str, FunctionRecord] = {}
        self.enqueued: dict[str, float] = {}
        self.host_s = 0.0
        self.running = 0  # tasks queued or running
        self.completing = False
        self.ended = False
        self.status: Status = "queued"
        self.error: str | None = None
        self.result: InvocationResult | None = None
        self.done = _Latch()
        self.callbacks: list[Callable[[InvocationResult], None]] = []  # add_done_callback
        self.failure: Failure | None = None  # the failing function's traceback and last lines
        self.queued: dict[str, tuple[str, int]] = {}  # function -> (queue, ticket) while queued
        # The thread (ident) that submitted it to wait for it (invoke): it drives the loop, so its
        # tasks go out without waking the loop's thread (ReplyLoop.drive); 0 for a plain submit
        self.driver = 0
        self.prefer: dict[str, str] = {}  # function -> the node holding most of its inputs


class _Latch:
    """Set once, waited for by any number of threads: an Event without its Condition (one lock, held
    until set), which an invocation of microseconds can afford."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        if self._lock.locked():
            self._lock.release()

    def is_set(self) -> bool:
        return not self._lock.locked()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._lock.locked():
            return True
        if not self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return False
        self._lock.release()  # the next waiter passes too
        return True


class _Once(_Latch):
    """An open of an invocation on one node (Invoker._open_on): set when it is done; ``error`` if it failed."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        super().__init__()
        self.error = ""


def _ready(once: _Once | None) -> bool:
    """Whether an open on a node is done and went well (a task may go there without waiting)."""
    return once is not None and once.is_set() and not once.error


class _Running:
    """A task sent to a worker whose reply has not come yet (keyed by the worker)."""

    __slots__ = ("chain", "cold_start_s", "deadline", "done", "fn", "inv", "light", "node", "owner", "pool",
                 "started", "timeout", "where", "worker")

    def __init__(self, inv: _Invocation, fn: str, pool: FunctionPool, worker: Any, started: float,
                 cold_start_s: float, where: Decision, node: str, owner: FunctionPool | None = None) -> None:
        self.inv, self.fn, self.pool, self.worker = inv, fn, pool, worker
        self.started, self.cold_start_s, self.where, self.node = started, cold_start_s, where, node
        self.owner = owner or pool  # the pool whose worker it is (a chain's follower runs in another's)
        self.chain: tuple[str, ...] = ()  # the functions sent with it to run after it (Task.then)
        self.done = False
        self.timeout = 0.0
        self.deadline = 0.0  # monotonic; 0: none enforced here (a blocking worker's own run does)
        self.light = False  # sent on values alone and not asking for the data plane (policy.polling)


class _Step:
    """What every call of one function of one workflow version needs, worked out once per spec
    (:meth:`Invoker._step`): the hot path reads these instead of walking the spec each time."""

    __slots__ = ("accelerator", "carry", "consumers", "f", "first", "follow", "host_inputs", "inline", "inputs",
                 "requested", "spec", "timeout")

    def __init__(self, spec: WorkflowSpec, fn: str, default_timeout_s: float, follow: tuple[str, ...] = ()) -> None:
        f = spec.function(fn)
        self.spec, self.f = spec, f
        # (input name, (source, output), the reference a handler sees for it when carried in the task)
        self.inputs = tuple((i.name, (i.source, i.output), INLINE + i.name) for i in f.inputs)
        self.inline = {name: inline for name, _, inline in self.inputs}  # Task.inputs when all are carried
        self.requested = tuple((name, key) for name, key, _ in self.inputs if key[0] == INPUT)  # from the request
        consumers: dict[str, list[str]] = {}  # output -> its readers (the gateway for workflow outputs)
        outputs = set(spec.outputs.values())
        for out in f.outputs:
            readers = spec.readers(fn, out)
            if (fn, out) in outputs:
                readers.append(GATEWAY)
            if readers:
                consumers[out] = readers
        self.consumers = consumers
        self.host_inputs = [i.name for i in f.inputs if i.from_workflow]
        # the first input: the drive it lives on is where a marked function runs and its outputs live
        self.first = (f.inputs[0].source, f.inputs[0].output)
        self.accelerator = bool(f.accelerator)
        self.timeout = f.timeout_s or default_timeout_s
        self.follow = follow  # the chain its worker may run after it (policy.fusion)
        # As a chain's follower: input name -> its one source function's output (Task.carry)
        self.carry = {i.name: i.output for i in f.inputs if not i.from_workflow}


class _Lane:
    """What the lane (runtime.lane) needs of one workflow version, worked out once: its plan, and each
    of its functions' pool key and :class:`_Step`, in the plan's order."""

    __slots__ = ("keep", "keys", "order", "outputs", "plan", "steps", "version")

    def __init__(self, plan: LanePlan, version: int, keys: tuple[str, ...], steps: tuple[_Step, ...]) -> None:
        self.plan, self.version, self.keys, self.steps = plan, version, keys, steps
        # What each function's reply may leave out once the whole chain ran in its worker: the outputs
        # that the functions after it alone read (worker._keep_outside; _lost's rule for a whole chain)
        fns = plan.functions
        self.keep = tuple(frozenset(out for out, readers in step.consumers.items() if set(readers) <= set(fns[i + 1:]))
                          for i, step in enumerate(steps))
        # The workflow's outputs as (name, the index in fns of the function that makes it, its output),
        # and the functions in the spec's order: every one runs in a lane's invocation (lane_plan)
        self.outputs = tuple((name, fns.index(fn), out) for name, (fn, out) in plan.spec.outputs.items())
        self.order = tuple(f.name for f in plan.spec.functions)


_NUMERIC = frozenset("biufc")  # the dtype kinds a value carried in a message may hold
_NOWHERE = Decision("", -1)  # no drives: every call runs on its worker, and no drive holds its data


def _lost(fn: str, consumers: Mapping[str, list[str]], chain: Sequence[str], nxt: Any, lost: list[str]) -> str:
    """Why ``fn``'s reply may not lack the outputs ``lost`` ("" if it may). Only a chain's worker keeps
    a value back, one that the functions of the chain which ran there alone read (worker._keep_outside,
    and a large one handed to the next function there, never stored: worker._holdable); anything else
    missing, from code that forged the reply, would leave a reader without its input. A function that
    ran and failed counts as having read its input: its failure ends the invocation."""
    ran = set()
    for name in chain:  # the chain's replies, nested in order (Done.next)
        if type(nxt) is Failed:
            ran.add(name)
        if type(nxt) is not Done:
            break
        ran.add(name)
        nxt = nxt.next
    for out in lost:
        if waiting := sorted(set(consumers[out]) - ran):
            return (f"function {fn!r} sent back neither a value nor a reference for its output {out!r}, which "
                    f"{', '.join(map(repr, waiting))} read{'s' if len(waiting) == 1 else ''}")
    return ""


class Invoker:
    """See the module docstring."""

    def __init__(self, config: RuntimeConfig, nodes: Nodes, deployments: Deployments, drives: DscsDrives,
                 logstore: LogStore, dedup: RuntimeDedup, input_generator: InputGenerator | None = None) -> None:
        self.config = config
        self.nodes = nodes
        self.deployments = deployments
        self.drives = drives
        self.logstore = logstore
        self.dedup = dedup
        self._input_generator = input_generator
        self._lock = threading.Lock()  # the invocations' state
        self._invs: dict[str, _Invocation] = {}  # live: unfinished, or finished with data still held
        # The results of retired invocations (finished, their data freed), kept fetchable: only the
        # result is kept, not the invocation's state (its DAG, records, values), so the collector walks
        # a few objects per kept invocation, not tens (gcpause; docs/performance.md).
        self._results: dict[str, InvocationResult] = {}
        self._finished: deque[str] = deque()  # retirement order: the oldest results go first
        # Set to a dict to keep retired invocations' whole state there too (tests that read a finished
        # invocation's DAG events or tokens); None in service.
        self.keep_retired: dict[str, _Invocation] | None = None
        self._seq = 0  # invocations submitted: which drive stores an invocation's inputs
        self._running: dict[int, _Running] = {}  # id(worker) -> its task in flight
        self._steps: dict[tuple[int, str], _Step] = {}
        self._unresolved = 0  # invocations submitted whose result is not set yet
        # The lane's invocation in flight, if any (at most one: the lane holds the loop's baton):
        # (workflow, version), and why it must fail if its workflow stopped meanwhile (stopped()).
        # It has no _Invocation unless the general path takes it over (_lane_invocation).
        self._lane_busy: tuple[str, int] | None = None
        self._lane_failed: str | None = None
        self._lanes: dict[tuple[int, int], tuple[WorkflowSpec, _Lane | None]] = {}  # (id(spec), version) -> its lane
        self._cores = cores = len(os.sched_getaffinity(0))
        poll_s = config.poll_us * 1e-6
        # The loop asks at every dispatch while it sleeps: the tasks' light test, a walk over those in
        # flight, runs only when the rule's cheap terms let it matter (one invocation unresolved).
        self._loop = ReplyLoop(self._on_message, tick=self._sweep, poll_s=poll_s,
                               polls=lambda: invoker_polls(poll_s, cores, self._unresolved, len(self._running),
                                                           self._unresolved == 1
                                                           and all(r.light for r in self._running.values())))
        self._opens: concurrent.futures.ThreadPoolExecutor | None = None  # Nodes.opens_lazily: _opener
        self._hinter: QueueHinter | None = None
        if config.queue_hints:
            self._hinter = QueueHinter(self._hint_batch, nodes.send_hints, config.queue_hint_interval_s)

    @property
    def reply_loop(self) -> ReplyLoop:
        """The loop that reads the workers' replies (an asyncio event loop may drive it: ReplyLoop.adopt)."""
        return self._loop

    def close(self) -> None:
        """After the pools closed: stop the hinter and the loop."""
        if self._hinter is not None:
            self._hinter.close()
            self._hinter = None
        if self._opens is not None:
            self._opens.shutdown(wait=True)
        self._loop.close()

    def queues_changed(self, inv: Any = None, queue: str | None = None) -> None:
        """``inv``'s functions moved (queued, dispatched, finished), a request entered or left
        ``queue``: the hinter sends where they stand now, soon (runtime.hints)."""
        if self._hinter is not None and (inv is None or inv.opened):  # nothing of it on a node: nothing to hint
            self._hinter.changed(inv.id if inv is not None else None, queue)

    def unfinished(self, workflow: str, version: int) -> bool:
        with self._lock:
            return self._lane_busy == (workflow, version) or any(
                i.spec.name == workflow and i.version == version and i.result is None for i in self._invs.values())

    def stopped(self, workflow: str, version: int | None, reason: str, dropped: list[tuple[Any, str]]) -> None:
        """Pools of ``workflow`` closed: the calls ``dropped`` from their queues no longer count against
        their invocations, and the invocations of ``version`` (None: any) still running fail."""
        with self._lock:
            for inv, _ in dropped:
                inv.running -= 1
                self._maybe_release(inv)
            for inv in [i for i in self._invs.values() if i.spec.name == workflow and i.result is None
                        and (version is None or i.version == version)]:
                inv.running += 1  # _fail_locked counts one task as ending
                self._fail_locked(inv, reason)
            busy = self._lane_busy
            if busy is not None and busy[0] == workflow and (version is None or busy[1] == version):
                self._lane_failed = reason  # the lane hands it over, failed (_lane_invocation)
        self.queues_changed()

    def submit(self, workflow: str, inputs: Mapping[str, np.ndarray] | None = None, seed: int | None = None,
               transport: str | None = None, deadline_s: float | None = None) -> str:
        """Start an invocation (:meth:`RuntimeAPI.submit`). ``deadline_s``: seconds from now within which
        its functions must start: a function still queued then is not run (the invocation fails as
        expired, freeing the worker for work someone still waits for), and a submit whose first
        functions' queues could not start it in time is refused at once with ``Overloaded``."""
        return self._submit(workflow, inputs, seed, transport, deadline_s)

    def _submit(self, workflow: str, inputs: Mapping[str, np.ndarray] | None, seed: int | None,
                transport: str | None, deadline_s: float | None, driver: int = 0) -> str:
        if deadline_s is not None and not deadline_s > 0:
            raise SpecError(f"deadline_s={deadline_s!r}: give seconds > 0, or None for no deadline")
        current = self.deployments.current(workflow)
        if current is None:
            raise NotFound(f"no workflow {workflow!r} is deployed; deployed: {self.deployments.workflows()}")
        spec, version = current.spec, current.number
        kind = transport or self.config.transport
        if kind not in ("gfaas", "redis"):
            raise ConfigError(f"transport {kind!r} is not 'gfaas' or 'redis'")
        arrays = self._inputs(spec, inputs, seed)
        if kind == "redis":
            self.nodes.ensure_redis()
        inv_id = os.urandom(16).hex()  # the data plane's invocation ID too: 128 random bits
        inv = _Invocation(inv_id, spec, version, kind, None if deadline_s is None else time.monotonic() + deadline_s)
        inv.driver = driver
        inv.inline_max = limit = self._inline_max(kind)
        stored = {}
        t0 = time.perf_counter()
        for name, arr in arrays.items():
            if limit > 0 and arr.nbytes <= limit and arr.dtype.kind in _NUMERIC:
                inv.values[(INPUT, name)] = to_value(arr)
            elif spec.readers(INPUT, name):
                stored[name] = arr
        if kind == "gfaas" and (stored or not self.nodes.lazy):
            self._ensure_open(inv)
        with self._lock:
            self._invs[inv_id] = inv
            self._unresolved += 1
            seq = self._seq
            self._seq += 1
        if self.drives.drives and spec.accelerated:
            drive = self.drives.input_drive(seq)
            inv.homes.update(((INPUT, name), drive) for name in arrays)
        try:
            if stored:
                t = self._gateway_transport(inv)
                try:
                    for name, arr in stored.items():
                        inv.refs[(INPUT, name)] = t.put(arr, spec.readers(INPUT, name))
                finally:
                    t.close()
            inv.host_s += time.perf_counter() - t0
            with self._lock:
                ready, skipped = inv.dag.start()
                complete = self._note(inv, skipped)
            self._schedule(inv, ready, complete)
        except Exception as exc:
            self._fail(inv, f"could not start: {exc}")
            if isinstance(exc, Overloaded):
                raise
        return inv_id

    def _inline_max(self, kind: str) -> int:
        """The largest value an invocation of transport ``kind`` carries in messages (0 for the Redis
        baseline: it stores everything, as the host-centric systems it stands for)."""
        return self.config.inline_max_bytes if kind == "gfaas" else 0

    def _ensure_open(self, inv: _Invocation) -> None:
        """Open ``inv`` on the node daemons (tokens for each function and the gateway), once."""
        if inv.opened or inv.kind != "gfaas":
            return
        tokens = self.nodes.open(inv.spec.name, [f.name for f in inv.spec.functions] + [GATEWAY], inv.id)
        if self.nodes.opens_lazily:
            done = _Once()
            done.set()
            inv.on_nodes = {self.nodes.first(): done}
            # Where the workflow's warm workers are, the open starts now, on a thread of its own: its round
            # trip overlaps the storing of the request's inputs instead of delaying the first task there.
            pools = self.deployments.pools
            for f in inv.spec.functions:
                pool = pools.get(pool_key(inv.spec.name, inv.version, f.name))
                for node in pool.worker_nodes() if pool is not None else ():
                    self._open_on(inv, node, wait=False)
        inv.tokens, inv.opened = tokens, True

    def _open_on(self, inv: _Invocation, node: str, wait: bool = True) -> None:
        """Before a task of ``inv`` runs on ``node``: open ``inv`` there if it was opened lazily and is not
        yet (once per node; tasks going there meanwhile wait for that open, and fail with its error).
        ``wait=False``: start it on the opener's thread and return."""
        on = inv.on_nodes
        if on is None or not node:
            return
        with self._lock:
            once = on.get(node)
            first = once is None
            if first:
                once = on[node] = _Once()
        assert once is not None
        if first and not wait:
            self._opener().submit(self._do_open, inv, node, once)
            return
        if first:
            self._do_open(inv, node, once)
        elif wait:
            once.wait()
        if wait and once.error:
            raise WorkerDied(once.error)

    def _do_open(self, inv: _Invocation, node: str, once: _Once) -> None:
        try:
            self.nodes.open_on(node, inv.spec.name, [f.name for f in inv.spec.functions] + [GATEWAY], inv.id)
        except Exception as exc:  # noqa: BLE001 - every task going there fails with it (WorkerDied)
            once.error = f"could not open invocation {inv.id} on node {node}: {exc}"
        finally:
            once.set()

    def _opener(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads that open invocations on other nodes ahead of their tasks (made on first use)."""
        with self._lock:
            if self._opens is None:
                self._opens = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="gfaas-open")
            return self._opens

    def _note_preference(self, inv: _Invocation, fn: str) -> None:
        """The node holding most of ``fn``'s inputs, per the global directory (policy.locality)."""
        f = inv.spec.function(fn)
        refs = [inv.refs.get((i.source, i.output), "") for i in f.inputs]
        named = {DataRef.parse(r).node for r in refs if r.startswith("gfaas://")}
        if len(named) == 1:  # every stored input on one node: that node, without asking the directory
            node = named.pop()
            inv.prefer[fn] = self.nodes.cluster.node_ids.get(node, node)
            return
        held = self.nodes.cluster.input_bytes(refs)
        if held:
            inv.prefer[fn] = choose_node(sorted(held), held)

    def status(self, invocation_id: str) -> str:
        return self._inv(invocation_id).status

    def result(self, invocation_id: str, timeout: float | None = None) -> InvocationResult:
        inv = self._inv(invocation_id)
        if isinstance(inv, InvocationResult):
            return inv
        until = None if timeout is None else time.perf_counter() + timeout
        return self._wait(inv, until, inv.driver == threading.get_ident(), timeout)

    def _wait(self, inv: _Invocation, until: float | None, drive: bool, timeout: float | None) -> InvocationResult:
        """``inv``'s result once set, by ``until`` (perf_counter; None: no limit). ``drive``: its tasks went
        out without a nudge, so handle their replies here while the rule says poll (ReplyLoop.drive)."""
        if drive and not inv.done.is_set():
            self._loop.drive(inv.done.is_set, until)
        if not inv.done.wait(None if until is None else max(0.0, until - time.perf_counter())):
            raise TimeoutError(f"invocation {inv.id} still {inv.status} after {timeout} s")
        assert inv.result is not None
        return inv.result

    def add_done_callback(self, invocation_id: str, callback: Callable[[InvocationResult], None]) -> None:
        """Call ``callback(result)`` once the invocation has finished (at once if it has), on the
        thread that finishes it: keep it short and non-blocking (the gateway wakes an asyncio future
        with it, so no thread waits per request). ``NotFound`` for unknown IDs."""
        inv = self._inv(invocation_id)
        if isinstance(inv, InvocationResult):
            callback(inv)
            return
        with self._lock:
            if inv.result is None:
                inv.callbacks.append(callback)
                return
            res = inv.result
        callback(res)

    def invoke(self, workflow: str, inputs: Mapping[str, np.ndarray] | None = None, seed: int | None = None,
               timeout: float | None = None, transport: str | None = None) -> InvocationResult:
        """Submit and wait: the synchronous call (through the lane when it can: :mod:`.lane`)."""
        if inputs is not None and seed is None and self._unresolved == 0 and transport in (None, "gfaas"):
            res = self._lane(workflow, inputs, timeout)
            if res is not None:
                return res
        return self.result(self._submit(workflow, inputs, seed, transport, None, threading.get_ident()), timeout)

    # -- the lane (runtime.lane): a lone invocation that one warm worker runs whole
    def _lane_of(self, spec: WorkflowSpec, version: int) -> _Lane | None:
        """What the lane needs of ``spec`` at ``version`` (worked out once), or None where this runtime
        sends every invocation the general way: stored data, several nodes, drives, or the Redis baseline."""
        if self.config.transport != "gfaas" or not self.nodes.lazy or self.nodes.locality \
                or (self.drives.drives and spec.accelerated) or self._inline_max("gfaas") <= 0:
            return None
        got = self._lanes.get((id(spec), version))
        if got is None or got[0] is not spec:  # (an id reused by a later spec)
            plan = lane_plan(spec, functools.partial(self.deployments.follow, spec))
            lane = None if plan is None else _Lane(
                plan, version, tuple(pool_key(spec.name, version, fn) for fn in plan.functions),
                tuple(self._step(spec, fn) for fn in plan.functions))
            got = self._lanes[(id(spec), version)] = (spec, lane)
        return got[1]

    def _lane(self, workflow: str, inputs: Mapping[str, np.ndarray], timeout: float | None) -> InvocationResult | None:
        """:meth:`invoke` through the lane, or None, having changed nothing, where it does not apply
        (the general path then runs it, and raises what it raises for a bad request)."""
        current = self.deployments.current(workflow)
        if current is None:
            return None
        lane = self._lane_of(current.spec, current.number)
        if lane is None:
            return None
        arrays = self._inputs(lane.plan.spec, inputs, None)  # a bad request fails here as on the general path
        limit = self.config.inline_max_bytes
        values = {}
        for name, arr in arrays.items():
            if arr.nbytes > limit or arr.dtype.kind not in _NUMERIC:
                return None  # stored on the node: the general path
            values[(INPUT, name)] = to_value(arr)
        pool = self.deployments.pools.get(lane.keys[0])
        if pool is None:
            return None
        worker = pool.claim()
        if worker is None:
            return None
        # From here on the invocation exists, as the general path's submit and dispatch make it.
        inv_id = os.urandom(16).hex()
        enqueued = time.perf_counter()
        chain = lane.plan.chain
        follows = getattr(worker, "follows", ())
        if not (hasattr(worker, "send_task") and hasattr(worker, "grant_data") and follows[:len(chain)] == chain) \
                or not self._loop.take(invoker_polls(self._loop.poll_s, self._cores, self._unresolved + 1, 1)):
            inv = self._lane_invocation(inv_id, lane, values, enqueued)
            self.dispatch(inv, lane.plan.head, pool, worker)  # its reply on the loop, or here as it waits
            return self.result(inv_id, timeout)
        until = None if timeout is None else enqueued + timeout
        try:
            got = self._lane_run(inv_id, lane, values, pool, worker, enqueued, until)
        finally:
            self._loop.give()
        if isinstance(got, InvocationResult):
            return got
        inv, drive = got
        return self._wait(inv, until, drive, timeout)

    def _lane_invocation(self, inv_id: str, lane: _Lane, values: dict[tuple[str, str], Value],
                         enqueued: float, counted: bool = False) -> _Invocation:
        """A lane invocation's state, registered as the general path's submit registers it, its first
        function sent (:meth:`_schedule`). ``counted``: the lane counted it unresolved already
        (:meth:`_lane_run`) and hands it over now; if its workflow stopped meanwhile it fails here, as
        :meth:`stopped` fails the others."""
        inv = _Invocation(inv_id, lane.plan.spec, lane.version, "gfaas", None)
        inv.driver = threading.get_ident()
        inv.inline_max = self.config.inline_max_bytes
        inv.values = values
        inv.submitted = enqueued
        with self._lock:
            self._invs[inv_id] = inv
            failed = None
            if counted:
                self._lane_busy, failed, self._lane_failed = None, self._lane_failed, None
            else:
                self._unresolved += 1
                self._seq += 1
            inv.dag.start()  # [head] (lane_plan)
            inv.running += 1
            inv.enqueued[lane.plan.head] = enqueued
            if failed is not None:
                inv.running += 1  # _fail_locked counts one task as ending
                self._fail_locked(inv, failed)
        return inv

    def _lane_run(self, inv_id: str, lane: _Lane, values: dict[tuple[str, str], Value], pool: FunctionPool,
                  worker: Any, enqueued: float, until: float | None) -> InvocationResult | tuple[_Invocation, bool]:
        """The lane's task out and its reply in, holding the loop's baton (:meth:`ReplyLoop.take`).
        Returns the result when the reply checks out (:meth:`_lane_done`); else the invocation as the
        general path now has it (:meth:`_lane_handover`), with whether the caller may poll for its
        reply before it sleeps (as ReplyLoop.drive)."""
        plan, step = lane.plan, lane.steps[0]
        limit = self.config.inline_max_bytes
        task = Task(inv_id, "", step.inline, step.host_inputs, step.consumers, deadline_s=pool.budget_s,
                    values={name: values[key] for name, key, _ in step.inputs}, inline_max=limit, lazy=True, alone=True)
        # The chain's tasks, as _then makes them: the worker loaded the whole chain (_lane checked its
        # follows), and every request input is a carried value, so all of it goes
        chain, extra_s, pools, then = plan.chain, 0.0, self.deployments.pools, None
        for i in range(len(chain), 0, -1):
            st = lane.steps[i]
            p = pools.get(lane.keys[i])
            then = Task(inv_id, "", st.inline, st.host_inputs, st.consumers,
                        deadline_s=p.budget_s if p is not None else 0.0,
                        values={name: values[key] for name, key in st.requested}, inline_max=limit, lazy=True,
                        function=chain[i - 1], then=then, carry=st.carry)
            extra_s += st.timeout
        task.then = then
        started = time.perf_counter()
        try:
            worker.send_task(task)
            sent: WorkerDied | None = None
        except WorkerDied as exc:
            sent = exc
        # Unresolved from here, as submit counts an invocation; its state is made only if the general
        # path takes it over (_lane_handover): a lone invocation's reply usually needs none of it
        with self._lock:
            self._unresolved += 1
            self._seq += 1
            self._lane_busy, self._lane_failed = (plan.spec.name, lane.version), None
        timeout_s = step.timeout + extra_s
        if sent is not None:
            inv = self._lane_handover(inv_id, lane, values, pool, worker, enqueued, started, timeout_s)
            self._loop.post(functools.partial(self._on_message, worker, sent))
            self._loop.run_posted()
            return inv, True
        end = time.perf_counter() + self._loop.poll_s
        while True:  # its reply, read here as ReplyLoop.drive would, while the rule says poll
            try:
                msg = worker.receive()
                break
            except BlockingIOError:
                pass
            except Exception as exc:  # noqa: BLE001 - a broken message: handled as the loop handles it
                msg = exc
                break
            now = time.perf_counter()
            if now > end or (until is not None and now > until) or self._unresolved != 1 or self._loop.posted:
                # the general path waits for its reply from here
                inv = self._lane_handover(inv_id, lane, values, pool, worker, enqueued, started, timeout_s)
                self._loop.run_posted()
                return inv, now <= end
            os.sched_yield()  # a process queued on this CPU (the worker it waits for) runs now
        res = self._lane_done(worker, lane, pool, msg, inv_id, enqueued, started)
        if res is not None:
            return res
        inv = self._lane_handover(inv_id, lane, values, pool, worker, enqueued, started, timeout_s)
        self._loop.deliver(worker, msg)  # the general path's handling, and its outcome
        self._loop.run_posted()
        return inv, True

    def _lane_handover(self, inv_id: str, lane: _Lane, values: dict[tuple[str, str], Value], pool: FunctionPool,
                       worker: Any, enqueued: float, started: float, timeout_s: float) -> _Invocation:
        """The lane's invocation as submit and dispatch would have made it, its task running on
        ``worker`` since ``started``: from here the general path handles its reply."""
        inv = self._lane_invocation(inv_id, lane, values, enqueued, counted=True)
        if inv.status != "failed":
            inv.status = "running"
        run = _Running(inv, lane.plan.head, pool, worker, started, 0.0, _NOWHERE,
                       getattr(worker, "gfaas_node", "") or pool.node)
        run.chain, run.light = lane.plan.chain, True
        run.timeout = timeout_s
        run.deadline = time.monotonic() + timeout_s - (time.perf_counter() - started)
        self._running[id(worker)] = run
        return inv

    def _lane_done(self, worker: Any, lane: _Lane, pool: FunctionPool, msg: Any, inv_id: str, enqueued: float,
                   started: float) -> InvocationResult | None:
        """The lane's reply, when it is the whole chain's ``Done`` and checks out as :meth:`_finish`
        would check it: recorded and made the result (as _on_message, _finish, _followed, _complete
        and _set_result would, for each function in turn, under one hold of the lock), the worker
        given its next call. None, having changed nothing, otherwise: the general path then handles
        the reply, and says what is wrong. The DAG is not stepped per invocation here: the lane's
        plan is the DagState's steps for every invocation of the spec, worked out once (lane_plan)."""
        limit = self.config.inline_max_bytes
        replies: list[Done] = []
        r = msg
        fns = lane.plan.functions
        for i, (step, keep) in enumerate(zip(lane.steps, lane.keep, strict=True)):
            if type(r) is not Done or r.invocation != inv_id or r.outputs or r.hinted_bytes \
                    or self._reply_problem(fns[i], step, fns[i + 1:], limit, r, keep):
                return None
            replies.append(r)
            r = r.next
        if r is not None:
            return None
        carried = []
        for name, i, out in lane.outputs:
            v = replies[i].values.get(out)
            if v is None:
                return None
            carried.append((name, v))
        pools = [pool]
        for key in lane.keys[1:]:
            p = self.deployments.pools.get(key)
            if p is None:
                return None
            pools.append(p)
        worker.release_binding(msg)
        spec, version = lane.plan.spec, lane.version
        with self._lock:
            if self._lane_failed is not None:
                return None  # its workflow stopped: the hand-over fails it
            recs = {}
            scalars = {}
            host_s = 0.0
            for i, (fn, reply, p) in enumerate(zip(fns, replies, pools, strict=True)):
                if reply.logs:
                    self.logstore.add(spec.name, fn, inv_id, reply.logs, str(version))
                # the chain's followers count as sent when the one before replied (as _followed)
                recs[fn] = self._record(fn, lane.steps[i], p, worker, started - enqueued if i == 0 else 0.0,
                                        _NOWHERE, 0.0, reply)
                host_s += reply.host_get_s + reply.host_put_s
                for k, x in reply.scalars.items():
                    scalars[f"{fn}.{k}"] = x
            t0 = time.perf_counter()
            outputs = {name: _owned(v) for name, v in carried}  # the result's own copies (as _complete)
            host_s += time.perf_counter() - t0
            queue_s = pass_s = compute_s = accel_s = cold_s = 0.0
            ordered = []
            for fn in lane.order:  # as _set_result sums them: in the spec's order
                rec = recs[fn]
                queue_s += rec.queued_s
                pass_s += rec.get_s + rec.put_s
                compute_s += rec.compute_s
                accel_s += rec.accel_s
                cold_s += rec.cold_start_s
                ordered.append(rec)
            b = Breakdown(queue_s, host_s, pass_s, compute_s, time.perf_counter() - enqueued, accel_s, cold_s)
            result = InvocationResult(inv_id, spec.name, "done", outputs, scalars, None, b, tuple(ordered), None)
            self._unresolved -= 1
            self._lane_busy = None
            self._keep_result(inv_id, result)
            if self.keep_retired is not None:
                self.keep_retired[inv_id] = self._lane_retired(inv_id, lane, replies, recs, result)
        nxt = pool.task_done(worker)
        if nxt is not None:
            self.dispatch(nxt[0], nxt[1], pool, worker, nxt[2])
        return result

    def _lane_retired(self, inv_id: str, lane: _Lane, replies: list[Done], recs: dict[str, FunctionRecord],
                      result: InvocationResult) -> _Invocation:
        """What the general path leaves of a finished invocation, for keep_retired (tests compare the
        two paths): its DagState stepped as the replies say, its records, values and result."""
        inv = _Invocation(inv_id, lane.plan.spec, lane.version, "gfaas", None)
        inv.inline_max = self.config.inline_max_bytes
        inv.dag.start()
        for fn, reply in zip(lane.plan.functions, replies, strict=True):
            inv.dag.finished(fn, reply.scalars)
            for out, v in reply.values.items():
                inv.values[(fn, out)] = v
        inv.records = dict(recs)
        inv.status, inv.result, inv.completing, inv.ended = "done", result, True, True
        return inv

    def queue_depths(self) -> dict[str, int]:
        with self._lock:
            pools = list(self.deployments.pools.values())
        return {p.key: len(p.queue) for p in pools}

    def queue_positions(self, invocation_id: str) -> dict[str, int]:
        """Where this invocation waits: function -> requests ahead of it in that function's queue.

        This is what queue-aware eviction reads: an object whose consumers are far back can go first.
        """
        inv = self._inv(invocation_id)
        if isinstance(inv, InvocationResult):
            return {}  # retired: it waits nowhere
        out = {}
        for f in inv.spec.functions:
            pool = self.deployments.pool(inv.spec.name, inv.version, f.name)
            pos = pool.position(invocation_id) if pool is not None else None
            if pos is not None:
                out[f.name] = pos
        return out

    def send_queue_hints(self, invocation_id: str | None = None) -> int:
        """Tell every node daemon now where this invocation's (or, with None, every open gfaas
        invocation's) functions wait, for queue-aware eviction (``Admin.queue_state``): queued
        functions by their place in their queue, running ones at 0, finished or skipped ones as
        done. With ``queue_hints`` on (the default) the runtime does this by itself as queues
        change. Returns the invocations hinted."""
        if invocation_id is not None:
            self._inv(invocation_id)  # NotFound for an unknown one; a retired one has nothing left to hint
            ids = {invocation_id}
        else:
            with self._lock:
                ids = {i.id for i in self._invs.values() if i.kind == "gfaas" and not i.ended}
        if self._hinter is not None:  # one round at a time, so an older state never arrives last
            return len(ids.intersection(self._hinter.flush(ids)))
        entries, heads = self._hint_batch(ids, set())
        with self.nodes.lock:
            for admin in self.nodes.admins.values():
                admin.queue_state([QueueEntry(*e) for e in entries], heads)
        return len(entries)

    def _hint_batch(self, invocations: set[str], queues: set[str]) -> HintBatch:
        """The queue hints of ``invocations`` (those still open on the data plane) and the heads of
        ``queues`` and of the queues they wait in: O(what changed), never a pass over every queue."""
        with self._lock:
            snaps = [(inv.id, dict(inv.queued), dict(inv.dag.state))
                     for inv in (self._invs.get(i) for i in invocations)
                     if inv is not None and inv.kind == "gfaas" and inv.opened and not inv.ended]
            pools = self.deployments.pools
        entries = []
        queues = set(queues)
        for inv_id, queued, state in snaps:
            # "ready" and not in its queue: running now (or about to be queued), position 0 either way
            tickets = {f: t for f, t in queued.items() if state.get(f) == "ready"}
            running = [f for f, st in state.items() if st == "ready" and f not in tickets]
            done = sorted(f for f, st in state.items() if st in ("done", "skipped"))
            entries.append((inv_id, tickets, running, done))
            queues.update(q for q, _ in tickets.values())
        heads = {q: pool.left for q in queues if (pool := pools.get(q)) is not None}
        return entries, heads

    def _inv(self, invocation_id: str) -> _Invocation | InvocationResult:
        """The live invocation, or the result of a retired one."""
        with self._lock:
            inv = self._invs.get(invocation_id) or self._results.get(invocation_id)
        if inv is None:
            raise NotFound(f"no invocation {invocation_id!r} is known here (finished ones are kept for a while)")
        return inv

    def _inputs(self, spec: WorkflowSpec, inputs: Mapping[str, np.ndarray] | None,
                seed: int | None) -> dict[str, np.ndarray]:
        if (inputs is None) == (seed is None):
            raise SpecError("give either inputs or a seed for the workflow's input generator, not both or neither")
        if inputs is None:
            if self._input_generator is None:
                raise SpecError(f"workflow {spec.name!r} has no input generator here; pass inputs")
            inputs = self._input_generator(spec.name, int(seed or 0), self.config.scale)
        if inputs.keys() != spec.inputs.keys():
            raise SpecError(f"workflow {spec.name!r} takes inputs {sorted(spec.inputs)}; "
                            f"got {sorted(inputs)}{name_diff(spec.inputs, inputs, 'unknown')}")
        out = {}
        decls = spec.inputs
        for name, value in inputs.items():
            arr = value if type(value) is np.ndarray else np.asarray(value)
            decl = decls[name]
            if not decl.fits(arr):
                decl.check(arr, f"workflow {spec.name!r} input {name!r}")
            out[name] = arr
        return out

    def _gateway_transport(self, inv: _Invocation) -> Transport:
        """The platform's side of an invocation (its request inputs, its results)."""
        return self.nodes.gateway_transport(inv.id, inv.kind, inv.tokens)

    def _note(self, inv: _Invocation, skipped: list[str]) -> bool:
        """Record skips (under the lock); True for the one caller that must complete the invocation."""
        for fn in skipped:
            inv.records[fn] = FunctionRecord(fn, skipped=True)
        if inv.dag.complete and not inv.completing:
            inv.completing = True
            return True
        return False

    def _schedule(self, inv: _Invocation, ready: list[str], complete: bool) -> None:
        for fn in ready:
            with self._lock:
                inv.running += 1
                inv.enqueued[fn] = time.perf_counter()
            try:
                pool = self.deployments.pools.get(pool_key(inv.spec.name, inv.version, fn))
                if pool is None:  # undeployed while the invocation ran
                    raise NotFound(f"workflow {inv.spec.name!r} was undeployed")
                if self.nodes.locality and inv.kind == "gfaas":
                    self._note_preference(inv, fn)
                pool.submit(inv, fn)
            except (Overloaded, NotFound):
                with self._lock:
                    inv.running -= 1
                raise
        if complete:
            self._complete(inv)

    # -- one step: a task out to a worker, its reply back on the loop (runtime.loop)
    def attach(self, worker: Any) -> None:
        """A started worker (runtime.pool): the loop reads its replies from now on."""
        self._loop.attach(worker)

    def detach(self, worker: Any) -> None:
        """A worker about to stop: the loop lets go of it first."""
        self._loop.detach(worker)

    def dispatch(self, inv: _Invocation, fn: str, pool: FunctionPool, worker: Any, cold_start_s: float = 0.0) -> None:
        """Send ``fn``'s task of ``inv`` to ``worker`` (claimed for it by ``pool``) and return: the reply is
        handled by :meth:`_on_message` on the loop. Small inputs ride in the task itself; a task with
        stored inputs binds the worker's connection to its credentials first, one with none is lazy
        (the worker asks, NeedData, should it need the data plane)."""
        started = time.perf_counter()
        inv.status = "running"
        step = self._step(inv.spec, fn)
        inputs: dict[str, str] = {}
        values: dict[str, Value] = {}
        carried, refs = inv.values, inv.refs
        for name, key, inline in step.inputs:
            v = carried.get(key)
            if v is not None:
                inputs[name], values[name] = inline, v
            else:
                inputs[name] = refs[key]
        where = _NOWHERE
        if step.accelerator or (self.drives.drives and inv.spec.accelerated):  # where a marked function runs: its first input's drive
            home = inv.homes.get(step.first, -1)
            where = self.drives.claim(home) if step.accelerator else Decision("", home)
        node = getattr(worker, "gfaas_node", "") or pool.node
        lazy = self.nodes.lazy and inv.kind == "gfaas" and len(values) == len(inputs) and hasattr(worker, "grant_data")
        task = Task(inv.id, "" if lazy else inv.tokens.get(fn, ""), inputs, step.host_inputs, step.consumers,
                    {} if lazy else self.nodes.transport_settings(node, inv.kind), deadline_s=pool.budget_s,
                    accel=where.preset, values=values, inline_max=inv.inline_max, lazy=lazy,
                    alone=self._unresolved == 1)
        chain: tuple[str, ...] = ()
        extra_s = 0.0
        if lazy and step.follow and (follows := getattr(worker, "follows", ())):
            task.then, chain, extra_s = self._then(inv.id, inv.spec, inv.version, inv.values, inv.inline_max,
                                                   step.follow, follows)
        run = _Running(inv, fn, pool, worker, started, cold_start_s, where, node)
        run.chain, run.light = chain, lazy
        self._running[id(worker)] = run
        timeout = step.timeout + extra_s
        opening = inv.on_nodes is not None and not _ready(inv.on_nodes.get(node))
        if not hasattr(worker, "send_task"):  # blocking workers (Ray, in-process): their runner thread
            if opening:  # the open's round trip on the runner thread, not the loop's
                def open_then_run() -> Any:
                    self._open_on(inv, node)
                    return worker.run(task, timeout)
                self._loop.run_blocking(worker, open_then_run)
            else:
                self._loop.run_blocking(worker, lambda: worker.run(task, timeout))
            return
        # Enforced by the loop's sweep (every TICK_S): no timer is set, and the loop is not woken, per task.
        run.timeout, run.deadline = timeout, time.monotonic() + timeout
        try:
            if opening:
                self._open_on(inv, node)
            worker.send_task(task)
            if inv.driver != threading.get_ident():  # else the thread that waits for it reads its reply
                self._loop.nudge()
        except WorkerDied as exc:
            self._loop.post(functools.partial(self._on_message, worker, exc))

    def _then(self, inv_id: str, spec: WorkflowSpec, version: int, carried: Mapping[tuple[str, str], Value],
              inline_max: int, follow: tuple[str, ...],
              loaded: tuple[str, ...]) -> tuple[Task | None, tuple[str, ...], float]:
        """The tasks of a chain (policy.fusion) to send with the head's: each follower's, as far as the
        worker loaded them and their request inputs are carried values; with the names and their timeouts'
        sum. The worker fills in what they read from the step before, if it came back as values."""
        chain: list[str] = []
        for fn in follow:
            if fn not in loaded:
                break
            step = self._step(spec, fn)
            if any(k[0] == INPUT and k not in carried for _, k, _ in step.inputs):
                break
            chain.append(fn)
        then: Task | None = None
        extra_s = 0.0
        pools = self.deployments.pools
        for fn in reversed(chain):
            step = self._step(spec, fn)
            pool = pools.get(pool_key(spec.name, version, fn))
            values = {name: carried[key] for name, key, _ in step.inputs if key[0] == INPUT}
            then = Task(inv_id, "", {name: inline for name, _, inline in step.inputs}, step.host_inputs,
                        step.consumers, deadline_s=pool.budget_s if pool is not None else 0.0, values=values,
                        inline_max=inline_max, lazy=True, function=fn, then=then, carry=step.carry)
            extra_s += step.timeout
        return then, tuple(chain), extra_s

    def _step(self, spec: WorkflowSpec, fn: str) -> _Step:
        """``fn``'s :class:`_Step` in ``spec``: the same for every call, so worked out once."""
        step = self._steps.get((id(spec), fn))
        if step is None or step.spec is not spec:  # (an id reused by a later spec)
            step = self._steps[(id(spec), fn)] = _Step(spec, fn, self.config.function_timeout_s,
                                                        self.deployments.follow(spec, fn))
        return step

    def _sweep(self) -> None:
        """On the loop, every :data:`~gfaas.runtime.loop.TICK_S`: a task still running past its function's
        ``timeout_s`` has its worker killed, and fails (its invocation) as the worker is replaced."""
        now = time.monotonic()
        for run in [r for r in self._running.values() if r.deadline and now > r.deadline and not r.done]:
            run.worker.kill()
            self._on_message(run.worker, TaskTimedOut(run.fn, run.worker.name, run.timeout))

    def _on_message(self, worker: Any, msg: Any) -> None:
        """On the loop: what ``worker`` sent (None: it is gone; an exception: its runner's outcome)."""
        run = self._running.get(id(worker))
        if isinstance(msg, NeedData):
            self._grant(worker, run, msg)
            return
        if run is None or run.done:
            if msg is None or isinstance(msg, BaseException):  # an idle worker died: its slot ends
                self._replace_idle(worker)
            return
        run.done = True
        self._running.pop(id(worker), None)
        inv, fn, pool = run.inv, run.fn, run.pool
        if hasattr(worker, "release_binding"):  # the worker knows whether the task was bound
            worker.release_binding(msg)
        if run.where.placement == DSCS:
            self.drives.release(run.where)
        if msg is None or isinstance(msg, BaseException):
            held = f"{fn}'s task" + (f" (and its chain: {', '.join(run.chain)})" if run.chain else "")
            exc = msg if isinstance(msg, WorkerDied) else WorkerDied(
                f"worker {worker.name} exited (status {_status(worker)}) while it held {held}" if msg is None
                else f"worker {worker.name} failed: {type(msg).__name__}: {msg}")
            log.warning("%s; replacing it", exc)
            if self.nodes.locality and not isinstance(exc, TaskTimedOut):
                self.nodes.check(run.node)
            pool.replace_dead(worker)
            kept = self.logstore.read(inv.spec.name, fn, inv.id, limit=50)
            self.failed(inv, fn, str(exc), Failure(fn, type(exc).__name__, "", failure_lines(kept, inv.id)))
            pool.task_done(worker)
            return
        try:
            self._finish(worker, run, msg)
        finally:
            nxt = pool.task_done(worker)
            if nxt is not None:
                self.dispatch(nxt[0], nxt[1], pool, worker, nxt[2])

    def _grant(self, worker: Any, run: _Running | None, msg: NeedData) -> None:
        """A lazy task needs the data plane: open its invocation on the node (once), bind the worker's
        connection to the task's credentials, and tell it; or tell it why not."""
        if run is None or run.done or msg.invocation != run.inv.id:
            worker.refuse_data("no task of that invocation is running on this worker")
            return
        fn = msg.function or run.fn
        if fn != run.fn and fn not in run.chain:
            worker.refuse_data(f"function {fn!r} is not in the task this worker was given")
            return
        run.light = False  # the node daemon works for it now: polling would take its CPU
        try:
            self._ensure_open(run.inv)
            worker.grant_data(run.inv.tokens[fn])
        except (GfaasError, OSError) as exc:
            worker.refuse_data(str(exc))

    def _replace_idle(self, worker: Any) -> None:
        """A worker with no task ended (killed, crashed): its pool replaces it as needed."""
        with self._lock:
            pools = list(self.deployments.pools.values())
        for p in pools:
            if any(w is worker for w in p.slots):
                log.warning("worker %s ended while idle; replacing it", getattr(worker, "name", "?"))
                p.replace_dead(worker)
                return

    def _finish(self, worker: Any, run: _Running, reply: Any) -> None:
        """A task's reply: its logs, its outputs (values or references), the DAG's next step."""
        inv, fn, pool, where = run.inv, run.fn, run.pool, run.where
        if type(reply) not in (Done, Failed) or reply.invocation != inv.id:
            self._out_of_step(worker, run, type(reply).__name__)
            return
        nxt = reply.next if type(reply) is Done else None
        if nxt is not None and not run.chain:
            self._out_of_step(worker, run, "Done.next, for a task that had no chain,")
            return
        step = self._step(inv.spec, fn)
        recs = self.logstore.add(inv.spec.name, fn, inv.id, reply.logs, str(inv.version)) if reply.logs else []
        if type(reply) is Failed:
            if self.nodes.locality and reply.error in ("DaemonUnavailable", "RemoteError"):
                self.nodes.check(run.node)  # its node's daemon is gone: no more calls there
            message = reply.message
            if reply.error == "AccessDenied":  # an input's node may have died before publishing it
                gone = self._gone_holders([r for _, key, _ in step.inputs if (r := inv.refs.get(key))])
                if gone:
                    message = (f"{message} (node {', '.join(gone)}, which held its inputs, stopped answering and "
                               "they were lost with it; retry the invocation)")
            self.failed(inv, fn, message, Failure(fn, reply.error, reply.trace, failure_lines(recs, inv.id)))
            return
        if why := self._reply_problem(fn, step, run.chain, inv.inline_max, reply):
            self.failed(inv, fn, why)
            return
        if reply.hinted_bytes:  # ctx.merge during the call
            with self.nodes.lock:
                self.dedup.hinted(worker, inv.spec.name, fn, self.nodes.admins.get(run.node) or self.nodes.admin,
                                  reply.hinted_bytes)
        rec = self._record(fn, step, pool, worker, run.started - inv.enqueued[fn], where, run.cold_start_s, reply)
        with self._lock:
            inv.records[fn] = rec
            inv.host_s += reply.host_get_s + reply.host_put_s
            for out, ref in reply.outputs.items():
                inv.refs[(fn, out)] = ref
            for out, v in reply.values.items():
                inv.values[(fn, out)] = v
            if where is not _NOWHERE:  # where its outputs live (runtime.accel's rule)
                home = where.drive if where.placement == DSCS else inv.homes.get(step.first, -1)
                for out in (*reply.outputs, *reply.values):
                    inv.homes[(fn, out)] = home
            inv.running -= 1
            if inv.status == "failed":
                self._maybe_release(inv)
                return
            try:
                ready, skipped = inv.dag.finished(fn, reply.scalars)
            except FunctionFailed as exc:
                inv.running += 1  # _fail_locked counts one task as ending
                self._fail_locked(inv, str(exc))
                return
            complete = self._note(inv, skipped)
        self.queues_changed(inv)  # fn is done (queue hints)
        follower = run.chain[0] if nxt is not None else ""
        if follower:
            if follower not in ready:  # the DAG did not make it ready: the reply is not the one asked for
                with self._lock:
                    inv.running += 1  # fn's end is counted above; _fail_locked counts one more
                self._out_of_step(worker, run, f"Done.next for {follower}, which was not ready,")
                return
            ready.remove(follower)
        try:
            self._schedule(inv, ready, complete)
        except (Overloaded, NotFound) as exc:
            self._fail(inv, str(exc))
        if follower:
            self._followed(worker, run, follower, nxt)

    @staticmethod
    def _reply_problem(fn: str, step: _Step, chain: Sequence[str], limit: int, reply: Done,
                       keep: frozenset[str] = frozenset()) -> str:
        """What is wrong with the values ``fn``'s ``reply`` carries, or the outputs it lacks ("" if
        nothing): what function code sent back is checked before anything uses it. ``chain``: the
        functions sent with it to run after it; ``limit``: the most bytes a value may carry.
        ``keep``: outputs it may lack without a look at ``chain``'s replies, for a caller that
        accepts the reply only if every one of them is a ``Done`` (the lane: _Lane.keep)."""
        consumers = step.consumers
        if reply.values:
            try:
                for name, v in reply.values.items():
                    if name not in consumers:
                        raise SpecError(f"function {fn!r} sent back a value for {name!r}, which is not an output "
                                        f"anything reads; its outputs read are {sorted(consumers)}")
                    if len(v.data) > limit:
                        raise SpecError(f"function {fn!r} sent back {len(v.data)} bytes for {name!r} in its "
                                        f"reply, over the {limit} bytes a reply may carry")
                    check_value(v, f"function {fn!r}: output {name!r}")
            except SpecError as exc:
                return str(exc)
        lost = [out for out in consumers if out not in reply.values and out not in reply.outputs]
        return _lost(fn, consumers, chain, reply.next, lost) if lost and not keep.issuperset(lost) else ""

    @staticmethod
    def _record(fn: str, step: _Step, pool: FunctionPool, worker: Any, queued_s: float, where: Decision,
                cold_start_s: float, reply: Done) -> FunctionRecord:
        """``fn``'s record from its ``reply``; its pool's input budget follows its compute time."""
        compute_s = reply.compute_s
        deadline_s = input_deadline(0.0, compute_s)
        if compute_s > 0:  # the next call's input budget derives from this one's compute time
            pool.compute_s, pool.budget_s = compute_s, deadline_s
        return FunctionRecord(fn, worker.name, queued_s, reply.fn_get_s, compute_s, reply.put_s, False,
                              slo_for(compute_s) if compute_s > 0 else 0.0, deadline_s, where.placement,
                              where.drive if step.accelerator else -1, reply.accel_s, cold_start_s)

    def _followed(self, worker: Any, run: _Running, fn: str, reply: Any) -> None:
        """The reply of a chain's next function (Task.then), run in the same worker after ``run``'s:
        handled as if its own task had been sent to that worker once ``run``'s was done."""
        inv = run.inv
        pool = self.deployments.pools.get(pool_key(inv.spec.name, inv.version, fn))
        if pool is None:  # undeployed while it ran
            self._fail(inv, f"workflow {inv.spec.name!r} was undeployed")
            return
        now = time.perf_counter()
        with self._lock:
            inv.running += 1  # as _schedule counts a task
            inv.enqueued[fn] = now
        where = _NOWHERE if not (self.drives.drives and inv.spec.accelerated) \
            else Decision("", inv.homes.get(self._step(inv.spec, fn).first, -1))
        nxt = _Running(inv, fn, pool, worker, now, 0.0, where, run.node, run.owner)
        nxt.chain = run.chain[1:]
        nxt.done = True
        self._finish(worker, nxt, reply)

    def _out_of_step(self, worker: Any, run: _Running, what: str) -> None:
        """Function code can write to its control socket: whatever else came, the channel no longer
        says which reply answers which task. The task fails and the worker goes (its real reply must
        not answer a later task)."""
        inv, fn = run.inv, run.fn
        log.warning("worker %s answered %s to %s's task of %s; replacing it", worker.name, what, fn, inv.id)
        kill = getattr(worker, "kill", None)  # a process worker; others end through replace_dead
        if kill is not None:
            kill()
        run.owner.replace_dead(worker)
        self.failed(inv, fn, f"worker {worker.name} answered {what} to {fn}'s task (its control "
                             "channel is out of step); the worker was replaced, retry the invocation")

    def failed(self, inv: _Invocation, fn: str, message: str, failure: Failure | None = None) -> None:
        with self._lock:
            if failure is not None and inv.result is None and inv.failure is None:
                inv.failure = failure
            self._fail_locked(inv, message)

    def dropped(self, inv: _Invocation, fn: str) -> None:
        with self._lock:
            inv.running -= 1
            self._maybe_release(inv)

    def _fail(self, inv: _Invocation, message: str) -> None:
        with self._lock:
            inv.running += 1
            self._fail_locked(inv, message)

    def _fail_locked(self, inv: _Invocation, message: str) -> None:
        inv.running -= 1
        if inv.status != "failed" and inv.result is None:
            inv.status, inv.error = "failed", message
            self._set_result(inv, {})
            log.info("invocation %s failed: %s", inv.id, message)
        self._maybe_release(inv)

    def _maybe_release(self, inv: _Invocation) -> None:
        if inv.running == 0:
            self._end_data(inv)

    def _complete(self, inv: _Invocation) -> None:
        outputs: dict[str, np.ndarray] = {}
        stored: dict[str, str] = {}
        try:
            t0 = time.perf_counter()
            for name, key in inv.spec.outputs.items():
                v = inv.values.get(key)
                if v is not None:  # carried in the reply: the result's own copy, writable
                    outputs[name] = _owned(v)
                elif (ref := inv.refs.get(key)) is not None:
                    stored[name] = ref
            if stored:
                t = self._gateway_transport(inv)
                try:
                    for name, ref in stored.items():
                        outputs[name] = np.array(t.get(ref), copy=True)
                finally:
                    t.close()
            inv.host_s += time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - reported as the invocation's failure
            why = f"collecting the outputs failed: {exc}"
            gone = self._gone_holders(stored.values()) if isinstance(exc, AccessDenied) else []
            if gone:
                why = (f"collecting the outputs failed: node {', '.join(gone)}, which held them, stopped answering "
                       f"and they were lost with it ({exc}); retry the invocation")
            with self._lock:
                inv.running += 1
                self._fail_locked(inv, why)
            return
        with self._lock:
            if inv.result is None:
                inv.status = "done"
                self._set_result(inv, outputs)
            self._maybe_release(inv)

    @staticmethod
    def _carried_outputs(inv: _Invocation) -> dict[str, np.ndarray] | None:
        """The workflow's outputs when every one came back as a value (under the lock: copies of
        bytes already checked, no I/O), timed into the invocation's host passing; else None."""
        t0 = time.perf_counter()
        values = inv.values
        outputs = {}
        for name, key in inv.spec.outputs.items():
            v = values.get(key)
            if v is None:
                return None
            outputs[name] = _owned(v)
        inv.host_s += time.perf_counter() - t0
        return outputs

    def _gone_holders(self, refs: Any) -> list[str]:
        """The nodes holding ``refs`` that do not answer now (each probed once unless known down). A
        node killed right after a function stored its output there may die before it published the
        object in the directory: another node then finds no such object and can only say "access
        denied" (it tells nothing about IDs it does not know), which would hide the real cause."""
        names = {self.nodes.cluster.node_ids.get(n, n)
                 for n in {DataRef.parse(r).node for r in refs if isinstance(r, str) and r.startswith("gfaas://")}}
        gone = []
        for name in sorted(names):
            if self.nodes.cluster.up(name):  # not known to be down: ask it (once)
                self.nodes.check(name)
            if not self.nodes.cluster.up(name):
                gone.append(name)
        return gone

    def _set_result(self, inv: _Invocation, outputs: dict[str, np.ndarray]) -> None:
        recs = []
        queue_s = pass_s = compute_s = accel_s = cold_s = 0.0
        for f in inv.spec.functions:
            r = inv.records.get(f.name)
            if r is None:
                r = FunctionRecord(f.name, skipped=True)
            elif not r.skipped:
                queue_s += r.queued_s
                pass_s += r.get_s + r.put_s
                compute_s += r.compute_s
                accel_s += r.accel_s
                cold_s += r.cold_start_s
            recs.append(r)
        b = Breakdown(queue_s, inv.host_s, pass_s, compute_s, time.perf_counter() - inv.submitted, accel_s, cold_s)
        scalars = {f"{fn}.{k}": v for fn, vals in inv.dag.scalars.items() for k, v in vals.items()}
        inv.result = InvocationResult(inv.id, inv.spec.name, inv.status, outputs, scalars, inv.error, b, tuple(recs),
                                      inv.failure if inv.status == "failed" else None)
        self._unresolved -= 1
        inv.done.set()
        for cb in inv.callbacks:  # each waiter is told of its own invocation only (no broadcast)
            try:
                cb(inv.result)
            except Exception:  # noqa: BLE001 - a waiter's failure must not fail the invocation
                log.exception("a done-callback of invocation %s failed", inv.id)
        inv.callbacks.clear()
        self._retire(inv)

    def _retire(self, inv: _Invocation) -> None:
        """Once finished and its data freed (under the lock): keep only its result, and only the most
        recent results (the invocation's state goes with the last reference to it)."""
        if inv.result is None or not inv.ended or self._invs.get(inv.id) is not inv:
            return
        del self._invs[inv.id]
        self._keep_result(inv.id, inv.result)
        if self.keep_retired is not None:
            self.keep_retired[inv.id] = inv

    def _keep_result(self, inv_id: str, result: InvocationResult) -> None:
        """Keep a finished invocation's result fetchable (under the lock): the most recent ones only."""
        self._results[inv_id] = result
        self._finished.append(inv_id)
        while len(self._finished) > KEEP_RESULTS:  # keep recent results fetchable, not all forever
            self._results.pop(self._finished.popleft(), None)

    def _end_data(self, inv: _Invocation) -> None:
        """Free everything the invocation stored, once no task of it is in flight (called under the
        lock): handed to the ender thread, so the daemon round trips are off every caller's path and
        the lock is not held across them (the next submit waited for them: docs/performance.md)."""
        if inv.ended:
            return
        inv.ended = True
        self._retire(inv)
        if inv.kind == "gfaas" and not inv.opened:
            return  # nothing of it was ever on a node
        self.nodes.end(inv)


def _owned(v: Value) -> np.ndarray:
    """A carried value as a result's output: its own writable copy (the bytes copied once)."""
    return np.frombuffer(bytearray(v.data), dtype=check_value(v)).reshape(v.shape)


def _status(worker: Any) -> Any:
    """A worker process's exit status (``?`` for other kinds)."""
    proc = getattr(worker, "proc", None)
    if proc is None:
        return "?"
    try:
        return proc.wait(5) if proc.poll() is None else proc.returncode
    except Exception:  # noqa: BLE001 - only for a message
        return "?"
