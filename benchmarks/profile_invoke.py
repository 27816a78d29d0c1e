"""Where an embedded tiny invocation's time goes (issue 23, item 1): the tools behind docs/performance.md.

The workflow is ``gfaas bench overload``'s (``gen`` makes a 1 KiB float32 array from a size, ``red`` sums a
strided slice), run by ``LocalRuntime(RuntimeConfig())`` one invocation at a time. Six modes:

* ``loop``: just the loop, to run under a sampling profiler (py-spy is not a dependency: ``pip install
  py-spy``); prints the p50 and each process's CPU milliseconds per invocation::

      py-spy record --rate 250 --function --subprocesses -o perf.svg -- \
          .venv/bin/python benchmarks/profile_invoke.py loop --n 1500

  With ``--out`` it also records what the native-code decision rests on (docs/performance.md): the
  CPU of each thread of the runtime and of each worker, user and system apart; the Python function
  calls per invocation on the runtime's threads and in each function's worker (its tasks replayed
  into an in-process host); and the two-hop pipe floor, measured in the same run.

* ``count``: the node daemon runs in this process (a thread, the same ``Daemon`` class the runtime
  starts as a process) with its request handler wrapped, so every message any process sends it is
  counted by type; connections, worker round trips and thread hand-offs are counted the same way.
  Prints messages per invocation (and the connections the daemon accepted); ``--concurrency K`` keeps K
  invocations in flight.
* ``timeline``: the moments one invocation passes on its critical path, noted by wrappers around the
  invoker's own steps (submit, each task sent, each reply read, the result set; this process; a
  worker's share comes from the timings its reply carries). Prints the median time between
  consecutive moments.
* ``lean``: the invocation against the essential work of one (the lane's task with a new ID sent to the
  same warm worker, its reply read, checked and made a result), in alternating blocks: what the
  runtime's bookkeeping around an invocation costs (:func:`lean`).
* ``opcodes``: the Python opcodes the caller's thread runs per invocation, by function (a count the
  machine's load does not move, :func:`opcodes`).
* ``registry``: the data-plane open + end of one invocation against a daemon process while 0, 100,
  500 and 1,000 others stay open.

The wrappers are installed by this script at run time; the library is not changed. Add ``--json`` for
one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.workflows.tiny import SPEC, timed_invokes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its sibling queued_load, however it is loaded
from queued_load import closed_loop  # noqa: E402

INPUTS = {"n": np.asarray(256, dtype=np.int64)}


def _loop(rt: LocalRuntime, n: int) -> list[float]:
    return timed_invokes(rt, n, int(INPUTS["n"]))


def _pool_class() -> Any:
    """The runtime's per-function pool class: ``local._Pool`` in the code profiled here; a later
    runtime keeps its pools in ``runtime.pool`` (imported by name, so this file runs on both)."""
    from gfaas.runtime import local as lmod

    cls = getattr(lmod, "_Pool", None)
    return cls if cls is not None else importlib.import_module("gfaas.runtime.pool").FunctionPool


def _first_with(attr: str, *owners: str) -> Any:
    """The first of ``owners`` ("module:Class") that has ``attr``: the runtime's parts moved between
    classes as it was split, and this file runs on older checkouts too."""
    for name in owners:
        mod, _, cls = name.partition(":")
        try:
            owner = getattr(importlib.import_module(mod), cls)
        except (ImportError, AttributeError):
            continue
        if hasattr(owner, attr):
            return owner
    raise AttributeError(f"none of {owners} has {attr!r}")


def _wrap(owner: Any, attr: str, before: Callable[..., None] | None = None,
          after: Callable[..., None] | None = None) -> Callable[[], None]:
    """Wrap ``owner.attr`` with hooks; returns the undo."""
    orig = getattr(owner, attr)

    def wrapper(*a: Any, **k: Any) -> Any:
        if before is not None:
            before(*a, **k)
        t0 = time.perf_counter()
        try:
            out = orig(*a, **k)
        finally:
            if after is not None:
                after(time.perf_counter() - t0, *a, **k)
        return out

    setattr(owner, attr, wrapper)
    return lambda: setattr(owner, attr, orig)


# ---- count ---------------------------------------------------------------------------------------
@contextmanager
def _daemon_in_thread(run_dir: str, counts: Counter[str], busy: defaultdict[str, float]) -> Iterator[Any]:
    from gfaas.config import NodeConfig
    from gfaas.dataplane import daemon as dmod
    from gfaas.dataplane import protocol as P
    from gfaas.secfiles import private_dir

    cfg = NodeConfig(node_id="rt0", socket_path=os.path.join(run_dir, "node.sock"),
                     state_dir=os.path.join(run_dir, "state"), capacity_bytes=2 * 2**30)
    private_dir(cfg.state_dir, "state directory")
    asynchronous = tuple(getattr(dmod, "_ASYNC", ()))

    def seen(conn: Any, data: bytes) -> None:
        try:
            msg = P.decode_request(data)
        except Exception:  # noqa: BLE001 - the daemon reports it
            counts["undecodable"] += 1
            return
        kind = type(msg).__name__
        counts[kind + (" (one-way)" if isinstance(msg, asynchronous) else "")] += 1

    def timed_run(dt: float, self: Any, conn: Any, msg: Any, handler: Any) -> None:
        busy[type(msg).__name__] += dt

    undo = [_wrap(dmod.Daemon, "_handle", before=lambda self, conn, data: seen(conn, data)),
            _wrap(dmod.Daemon, "_run", after=timed_run)]
    orig_scan_all = dmod.Daemon._scan_all

    def scan_all(self: Any) -> int:
        counts["daemon directory scans (timer)"] += 1
        return orig_scan_all(self)

    dmod.Daemon._scan_all = scan_all
    orig_conn = dmod.Conn

    class CountedConn(orig_conn):  # type: ignore[misc,valid-type]
        """Every connection the daemon accepts (whoever opened it: the runtime, for itself or a worker)."""

        def __init__(self, *a: Any, **k: Any) -> None:
            counts["daemon connections accepted"] += 1
            super().__init__(*a, **k)

    dmod.Conn = CountedConn
    d = dmod.Daemon(cfg)
    d.bind()
    t = threading.Thread(target=d.serve_forever, name="profile-daemon", daemon=True)
    t.start()
    try:
        from gfaas.runtime.local import NodeEndpoint

        yield NodeEndpoint("rt0", cfg.socket_path, cfg.state_dir)
    finally:
        d.stop()
        t.join(10)
        dmod.Daemon._scan_all = orig_scan_all
        dmod.Conn = orig_conn
        for u in undo:
            u()


def count(n: int, concurrency: int = 1) -> dict[str, Any]:
    from gfaas.runtime import worker as wmod

    counts: Counter[str] = Counter()
    busy: defaultdict[str, float] = defaultdict(float)  # message type -> daemon seconds (handler, reply, settle)
    run_dir = tempfile.mkdtemp(prefix="gfaas-prof-", dir="/tmp")
    from gfaas.dataplane.client import Admin

    inv_cls = _first_with("_gateway_transport", "gfaas.runtime.invoker:Invoker", "gfaas.runtime.local:LocalRuntime")
    undo = [
        # tasks go out by send_task since the reply loop (run: the blocking path of before)
        _wrap(wmod.ProcessWorker, "send_task" if hasattr(wmod.ProcessWorker, "send_task") else "run",
              before=lambda *a, **k: counts.update(["worker Task -> Done round trip"])),
        _wrap(_pool_class(), "submit", before=lambda *a, **k: counts.update(["hand-off to a dispatcher thread"])),
        _wrap(inv_cls, "queues_changed", before=lambda *a, **k: counts.update(["queue hinter pokes"])),
        # one round trip per invocation hinted before issue 23's item 1, one batch per node after
        _wrap(Admin, "queue_state", before=lambda *a, **k: counts.update(["queue hint rounds sent"])),
        _wrap(inv_cls, "_gateway_transport",
              before=lambda *a, **k: counts.update(["gateway transports (the runtime's puts and gets)"])),
        _wrap(wmod, "_daemon_connection",
              before=lambda *a, **k: counts.update(["daemon connection opened for a sandboxed worker"])),
    ]
    threads_before = threading.active_count()
    try:
        with _daemon_in_thread(run_dir, counts, busy) as node, \
                LocalRuntime(RuntimeConfig(nodes=(node,))) as rt:
            rt.deploy(SPEC)
            _loop(rt, 20)
            time.sleep(0.3)  # queue hints of the warm-up go out
            counts.clear()
            busy.clear()
            counts["daemon connections accepted"] += 0  # listed even when none is
            threads_mid = threading.active_count()
            t0 = time.perf_counter()
            closed_loop(rt, n, concurrency)
            wall = time.perf_counter() - t0
            time.sleep(0.3)
            snapshot = Counter(counts)
            daemon_us = {k: round(v / max(1, snapshot.get(k, 0) or snapshot.get(k + " (one-way)", 0)) * 1e6, 1)
                         for k, v in busy.items()}
            threads_after = threading.active_count()
    finally:
        for u in undo:
            u()
        shutil.rmtree(run_dir, ignore_errors=True)
    per = {k: round(v / n, 2) for k, v in sorted(snapshot.items(), key=lambda kv: -kv[1])}
    return {"invocations": n, "concurrency": concurrency, "per_invocation": per, "wall_s": round(wall, 2),
            "daemon_us_per_message": dict(sorted(daemon_us.items(), key=lambda kv: -kv[1])),
            "threads": {"before_runtime": threads_before, "warm": threads_mid, "after_loop": threads_after},
            "note": "daemon in a thread of this process (same Daemon class); RuntimeConfig(nodes=...) otherwise "
                    "default; a one-way message has no reply"}


# ---- timeline -------------------------------------------------------------------------------------
#: The steps of one invocation on its critical path, in order; each is a moment the wrappers note.
STEPS = {
    "submit": "submit called (the caller's thread)",
    "gen_sent": "inputs checked, gen's worker claimed, its Task made and about to be sent (the invocation and its "
                "DAG made before it on the general path; the lane makes them while the worker runs)",
    "red_sent": "red's Task about to be sent: with gen's when red's worker takes its input from gen's (a hand-off), else "
                "after gen's Done was checked and recorded (DagState.finished)",
    "gen_reply": "gen: Task -> worker -> Done, read by the thread that handles replies (reply_threads; "
                 "the worker's share below)",
    "red_reply": "red: Task -> worker -> Done, read the same way (in a chain: red runs in gen's "
                 "worker right after it and its reply comes in gen's Done, so this is gen's moment too)",
    "result_set": "Done checked and recorded, outputs copied, result built, the latch set",
    "woke": "invoke returns: the rest of the reply's handling and the return, on the caller's thread when it "
            "read the reply itself (ReplyLoop.drive), else its wake-up",
}


def timeline(n: int) -> dict[str, Any]:
    """The moments one invocation passes on its critical path (see the module docstring)."""
    from gfaas.runtime import invoker as imod
    from gfaas.runtime import worker as wmod

    ev: dict[str, float] = {}
    rows: list[dict[str, float]] = []
    worker_parts: defaultdict[str, list[float]] = defaultdict(list)
    readers: Counter[str] = Counter()  # the threads that handled the replies (ReplyLoop.drive or the loop's)
    now = time.perf_counter

    def mark(key: str) -> None:
        ev.setdefault(key, now())

    last: dict[str, Any] = {}  # the last task sent and its worker (replayed below)

    def sent(self: Any, task: Any, *_: Any) -> None:
        mark(f"{self.name.split('@')[0]}_sent")
        last["worker"], last["task"] = self, task

    def replied(self: Any, worker: Any, msg: Any) -> None:
        noted(self._running.get(id(worker)), msg)

    def lane_replied(self: Any, worker: Any, lane: Any, pool: Any, msg: Any, *_: Any) -> None:  # runtime.lane
        noted(None, msg, list(lane.plan.functions))

    def noted(run: Any, msg: Any, fns: list[str] | None = None) -> None:
        readers[threading.current_thread().name] += 1
        if fns is None:
            fns = [run.fn, *run.chain] if run is not None else []
        if isinstance(msg, wmod.Done) and fns:
            ev.setdefault("busy", msg.busy_s)
        while fns and isinstance(msg, wmod.Done):  # a chain's replies come in one (Done.next)
            fn = fns.pop(0)
            mark(f"{fn}_reply")
            for f in ("compute_s", "fn_get_s", "put_s"):
                worker_parts[f"{fn} {f.removesuffix('_s')}"].append(getattr(msg, f))
                ev["handlers"] = ev.get("handlers", 0.0) + getattr(msg, f)
            msg = msg.next

    undo = [
        _wrap(imod.Invoker, "invoke", before=lambda *a, **k: mark("submit")),
        # Marked as the send begins: a worker woken by its task may preempt the sender before
        # send_task returns (seen on a 2-core AMD EPYC VM), and a mark after the send then came once
        # the worker had run, so its loop outlasted the round trip measured from there.
        _wrap(wmod.ProcessWorker, "send_task", before=sent),
        _wrap(imod.Invoker, "_on_message", before=replied),
        _wrap(imod.Invoker, "_lane_done", before=lane_replied),
        _wrap(imod.Invoker, "_set_result", after=lambda *a, **k: mark("result_set")),
    ]
    try:
        with LocalRuntime(RuntimeConfig()) as rt:
            rt.deploy(SPEC)
            for k in range(30 + n):
                if k == 30:
                    readers.clear()
                ev.clear()
                res = rt.invoke("tiny", INPUTS, timeout=60)
                mark("woke")
                assert res.status == "done", res.error
                if k >= 30:
                    rows.append(dict(ev))
            for u in reversed(undo):
                u()
            undo = []
            replayed = _replay(rt, last["worker"], last["task"], n)
    finally:
        for u in reversed(undo):
            u()
    # in the order they come (a hand-off sends red's task before gen's reply)
    keys = sorted((k for k in STEPS if all(k in r for r in rows)),
                  key=lambda k: float(np.median([r[k] - r["submit"] for r in rows])))
    seen = [(k, STEPS[k]) for k in keys]
    steps: list[dict[str, Any]] = []
    for (prev, _), (key, what) in zip(seen, seen[1:], strict=False):
        d = np.asarray([r[key] - r[prev] for r in rows]) * 1e3
        steps.append({"step": key, "what": what, "p50_ms": round(float(np.median(d)), 3),
                      "mean_ms": round(float(d.mean()), 3)})
    total = np.asarray([r["woke"] - r["submit"] for r in rows]) * 1e3
    # The worker's round trip split: its loop's own time (Done.busy_s: from the task's arrival to the
    # reply's encoding, the chain included) and the rest, the two process hops and their framing.
    first = next((k for k in keys if k.endswith("_sent")), None)
    reply = next((k for k in keys if k.endswith("_reply")), None)
    split: dict[str, float] = {}
    if first and reply and all("busy" in r for r in rows):
        inside = np.asarray([r["busy"] for r in rows]) * 1e3
        hops = np.asarray([r[reply] - r[first] - r["busy"] for r in rows]) * 1e3
        handlers = np.asarray([r["handlers"] for r in rows]) * 1e3
        split = {"worker_loop_p50_ms": round(float(np.median(inside)), 3),
                 "handlers_p50_ms": round(float(np.median(handlers)), 3),
                 "worker_framework_p50_ms": round(float(np.median(inside - handlers)), 3),
                 "hops_p50_ms": round(float(np.median(hops)), 3)}
    return {"invocations": len(rows), "wall_ms": {"p50": round(float(np.median(total)), 3),
                                                  "mean": round(float(total.mean()), 3)},
            "steps": steps,
            "sum_of_step_p50_ms": round(sum(s["p50_ms"] for s in steps), 3),
            "worker_reported_p50_ms": {k: round(float(np.median(v)) * 1e3, 3) for k, v in worker_parts.items()},
            "round_trip_split": split,
            "replay": {"p50_ms": round(float(np.median(replayed)) * 1e3, 3),
                       "what": "the last invocation's Task (its chain in it) sent again to the same warm worker "
                               "by a caller that does nothing else, its reply read by polling as the lane reads "
                               "it: the worker's round trip with no runtime around it"},
            "reply_threads": {("caller" if k == threading.main_thread().name else k): v for k, v in readers.items()},
            "note": "each step: the median time from the previous moment to this one (the wrappers add a few us); "
                    "a worker's share is what its Done reports (the handler's get, compute and put); round_trip_split "
                    "divides the first worker round trip into the worker loop's own time (Done.busy_s: handlers, "
                    "their framework and the log capture) and the rest (the two process hops, encoding and decoding)"}


def _replay(rt: LocalRuntime, worker: Any, task: Any, n: int, warmup: int = 30) -> list[float]:
    """Seconds per round trip of ``task`` sent again to ``worker`` (idle, warm) by this thread alone,
    holding the loop's baton as the lane does: what an invocation would take if the runtime's own work
    on the caller's side cost nothing."""
    import os

    from gfaas.runtime import worker as wmod

    loop = rt.invoker.reply_loop
    if not loop.take(True):
        raise RuntimeError("the replay could not take the invoker's loop (it polls only on 2 CPUs or more)")
    out: list[float] = []
    try:
        for k in range(warmup + n):
            t0 = time.perf_counter()
            worker.send_task(task)
            while True:
                try:
                    msg = worker.receive()
                    break
                except BlockingIOError:
                    os.sched_yield()
            took = time.perf_counter() - t0
            if type(msg) is not wmod.Done or type(msg.next) is not wmod.Done:
                raise RuntimeError(f"the replayed task came back as {type(msg).__name__}, not a chain's Done")
            if k >= warmup:
                out.append(took)
    finally:
        loop.give()
    return out


# ---- lean ----------------------------------------------------------------------------------------
def lean(n: int, blocks: int = 6) -> dict[str, Any]:
    """The embedded invocation against the least work one must do, in the same runtime: ``blocks``
    alternating blocks of ``n`` calls of (a) ``rt.invoke`` and (b) ``essential``: on the same warm
    worker, the request's input checked against its declaration and made a Value, the lane's Task
    (captured from (a)) with a new invocation ID and that value, encoded and sent, its reply read by
    polling as the lane reads it, the carried result checked (``check_value``) and copied out, two
    FunctionRecords, the Breakdown and the InvocationResult. Not in (b): the pool's claim and
    task_done, the loop's take and give per call (it holds the loop for the block, as ``_replay``),
    the invocation's state and registration, the DAG's stepping, the records' policy rules (SLO and
    input deadline), the chain's task made from its steps, the result's retirement. So (a) - (b) is
    what the runtime's bookkeeping around one invocation costs, and (b) what a lane could take if that
    bookkeeping cost nothing."""
    import msgspec

    from gfaas.runtime import worker as wmod
    from gfaas.runtime.invoker import _owned
    from gfaas.runtime.result import Breakdown, FunctionRecord, InvocationResult
    from gfaas.workflows.tiny import expected_total

    last: dict[str, Any] = {}
    undo = _wrap(wmod.ProcessWorker, "send_task", before=lambda self, task: last.update(worker=self, task=task))
    expect = expected_total(int(INPUTS["n"]))
    out: dict[str, list[float]] = {"invoke": [], "essential": []}
    try:
        with LocalRuntime(RuntimeConfig()) as rt:
            rt.deploy(SPEC)
            _loop(rt, 50)
            undo()
            worker, template = last["worker"], last["task"]
            if template.then is None or template.then.then is not None:
                raise RuntimeError("the lane's task is not tiny's chain of two (gen, then red)")
            decl = rt.invoker.deployments.current("tiny").spec.inputs["n"]
            sock, enc, loop = worker._sock, wmod._enc, rt.invoker.reply_loop  # the lane's worker socket

            def essential() -> InvocationResult:
                arr = INPUTS["n"]
                if not decl.fits(arr):
                    raise RuntimeError("the input does not fit its declaration")
                inv_id = os.urandom(16).hex()
                task = msgspec.structs.replace(template, invocation=inv_id, values={"n": wmod.to_value(arr)},
                                               then=msgspec.structs.replace(template.then, invocation=inv_id))
                t0 = time.perf_counter()
                sock.send(enc.encode(task))
                while True:
                    try:
                        msg = worker.receive()
                        break
                    except BlockingIOError:
                        os.sched_yield()
                red = msg.next
                if type(msg) is not wmod.Done or type(red) is not wmod.Done or msg.invocation != inv_id:
                    raise RuntimeError(f"the essential task came back as {type(msg).__name__}")
                v = red.values["total"]
                wmod.check_value(v)
                recs = (FunctionRecord("gen", worker.name, 0.0, msg.fn_get_s, msg.compute_s, msg.put_s),
                        FunctionRecord("red", worker.name, 0.0, red.fn_get_s, red.compute_s, red.put_s))
                b = Breakdown(0.0, 0.0, 0.0, msg.compute_s + red.compute_s, time.perf_counter() - t0)
                return InvocationResult(inv_id, "tiny", "done", {"total": _owned(v)},
                                        {f"red.{k}": x for k, x in red.scalars.items()}, None, b, recs)

            for _ in range(blocks):
                out["invoke"].append(float(np.median(_loop(rt, n))))
                if not loop.take(True):
                    raise RuntimeError("could not take the invoker's loop (it polls only on 2 CPUs or more)")
                try:
                    ts = []
                    for _ in range(n):
                        t0 = time.perf_counter()
                        res = essential()
                        ts.append(time.perf_counter() - t0)
                        if abs(float(res.outputs["total"]) - expect) > 1e-6 * expect:
                            raise RuntimeError(f"the essential task answered {res.outputs} (expected {expect})")
                finally:
                    loop.give()
                out["essential"].append(float(np.median(ts)))
    finally:
        undo()
    a, b = np.asarray(out["invoke"]) * 1e6, np.asarray(out["essential"]) * 1e6
    return {"calls_per_block": n, "blocks": blocks,
            "invoke_p50_us_blocks": [round(float(x), 1) for x in a],
            "essential_p50_us_blocks": [round(float(x), 1) for x in b],
            "invoke_p50_us": round(float(np.median(a)), 1), "essential_p50_us": round(float(np.median(b)), 1),
            "invoke_over_essential": round(float(np.median(a / b)), 2),
            "bookkeeping_us": round(float(np.median(a - b)), 1),
            "what": "per block, the median of its calls; the summary takes the median over blocks of each, of "
                    "the per-block ratio and of the per-block difference (a and b alternate, so a loaded moment "
                    "weighs on both)"}


# ---- opcodes -------------------------------------------------------------------------------------
def opcodes(n: int, top: int = 25) -> dict[str, Any]:
    """Python opcodes the caller's thread runs per embedded invocation, by function: a count that does
    not move with the machine's load (wall times here moved 2x within minutes), for telling whether a
    change to the caller's path does less. Each task's sender waits, uncounted, until the worker's
    reply is surely in, so the poll loop looks once; C code (numpy, msgspec, the native core) and the
    worker's side are not counted."""
    import collections

    from gfaas.runtime import worker as wmod

    count: collections.Counter[str] = collections.Counter()
    on = [False]

    def settle(*_: Any) -> None:  # after a task goes out: its reply in before the caller looks
        was, on[0] = on[0], False
        time.sleep(0.003)
        on[0] = was

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode" and on[0]:
            count[frame.f_code.co_qualname] += 1
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    undo = _wrap(wmod.ProcessWorker, "send_task", after=settle)
    try:
        with LocalRuntime(RuntimeConfig()) as rt:
            rt.deploy(SPEC)
            _loop(rt, 50)
            sys.settrace(tracer)
            try:
                on[0] = True
                for _ in range(n):
                    rt.invoke("tiny", INPUTS, timeout=60)
                on[0] = False
            finally:
                sys.settrace(None)
    finally:
        undo()
    total = sum(count.values())
    return {"invocations": n, "opcodes_per_invocation": round(total / n, 1),
            "top": {k: round(v / n, 1) for k, v in count.most_common(top)}}


# ---- registry -------------------------------------------------------------------------------------
def registry(n: int, open_counts: tuple[int, ...] = (0, 100, 500, 1000)) -> dict[str, Any]:
    """Admin.open_invocation + end_invocation round trips (p50) against a node daemon process while
    ``k`` other invocations stay open: what one invocation's data-plane lifecycle costs under load."""
    from gfaas.config import NodeConfig
    from gfaas.dataplane.client import Admin
    from gfaas.dataplane.local import LocalNode

    run_dir = tempfile.mkdtemp(prefix="gfaas-prof-", dir="/tmp")
    cfg = NodeConfig(node_id="rt0", socket_path=os.path.join(run_dir, "node.sock"),
                     state_dir=os.path.join(run_dir, "state"), capacity_bytes=2**30)
    fns = ["gen", "red", "gateway"]
    rows = []
    try:
        with LocalNode(cfg), Admin(cfg.socket_path, state_dir=cfg.state_dir) as admin:
            held: list[Any] = []
            for k in open_counts:
                while len(held) < k:
                    held.append(admin.open_invocation("overload", fns))
                ts = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    admin.end_invocation(admin.open_invocation("overload", fns))
                    ts.append(time.perf_counter() - t0)
                # invocations.json before issue 23's item 1 (rewritten whole), invocations.journal after
                reg = [p for p in (os.path.join(cfg.state_dir, n) for n in ("invocations.journal", "invocations.json"))
                       if os.path.exists(p)]
                rows.append({"open_invocations": k, "open_end_p50_ms": round(float(np.median(ts)) * 1e3, 3),
                             "registry_file": os.path.basename(reg[0]), "registry_bytes": os.path.getsize(reg[0])})
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {"pairs_per_row": n, "rows": rows,
            "note": "before: each open and each end rewrote <state_dir>/invocations.json (Daemon._save_registry); "
                    "after: each appends a line to invocations.journal (dataplane/invlog.py)"}


def _cpu_split() -> dict[str, tuple[float, float]]:
    """(user, system) CPU seconds of each thread of this process, by role, and of each child process."""
    tick = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    names = {t.native_id: ("caller" if t is threading.main_thread() else t.name) for t in threading.enumerate()}
    out: dict[str, tuple[float, float]] = {}
    for tid in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        role = f"runtime: {names.get(int(tid), 'other threads')}"
        u, s = out.get(role, (0.0, 0.0))
        out[role] = (u + int(fields[11]) / tick, s + int(fields[12]) / tick)
    for role, (u, s) in _cpu_by_process(split=True).items():
        if role != "runtime (this process)":
            out[role] = (u, s)
    return out


def _python_calls(n: int) -> dict[str, Any]:
    """Python function calls per invocation: on each thread of a runtime made for this (a profile
    function counts them; threads started before it are not seen), and in each function's host
    replaying the tasks its worker got (the worker's own loop, its socket and log capture aside)."""
    import msgspec

    from gfaas.runtime import worker as wmod
    from gfaas.runtime.worker import FunctionHost, Init, ProcessWorker

    counts: Counter[str] = Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            counts[threading.current_thread().name] += 1

    tasks: dict[str, list[Any]] = defaultdict(list)
    undo = _wrap(ProcessWorker, "send_task", before=lambda self, task: tasks[self.name.split("@")[0]].append(task))
    threading.setprofile(count)
    try:
        with LocalRuntime(RuntimeConfig()) as rt:
            rt.deploy(SPEC)
            _loop(rt, 50)
            counts.clear()
            tasks.clear()
            sys.setprofile(count)
            try:
                _loop(rt, n)
            finally:
                sys.setprofile(None)
            runtime = {("caller" if name == threading.main_thread().name else name): round(c / n, 1)
                       for name, c in counts.items()}
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        undo()
    workers: dict[str, float] = {}

    class _Link:  # a lazy task that needs nothing from the data plane never touches it
        devices: tuple[int, ...] = ()
        closed = False

    for fn, sent in tasks.items():
        chain, t = [], sent[0].then  # a chain (gfaas.policy.fusion): its functions run in this worker too
        while t is not None:
            chain.append(t.function)
            t = t.then
        init = Init("tiny", fn, SPEC, follow=chain)
        host = FunctionHost(init)
        host.link = _Link()
        followers = wmod._load_followers(init, _Link())
        counts.clear()
        sys.setprofile(count)
        try:
            for task in sent:
                task = msgspec.msgpack.decode(msgspec.msgpack.encode(task), type=type(task))
                asked = [False]  # as the worker's loop runs a task and its chain (worker._serve)
                reply = host.run(task, None, lambda: None, hold=wmod._holdable(task, followers), asked=asked)
                if task.then is not None and type(reply) is wmod.Done:
                    wmod._follow(reply, task, followers, None, None, asked, host.take_held())  # type: ignore[arg-type]
                msgspec.msgpack.encode(reply)
        finally:
            sys.setprofile(None)
        workers[f"worker of {fn}"] = round(sum(counts.values()) / max(len(sent), 1), 1)
    return {"runtime_threads": runtime, "runtime_total": round(sum(runtime.values()), 1), "workers": workers}


def _cpu_by_process(split: bool = False) -> dict[str, Any]:
    """CPU seconds (user+sys; ``split``: the pair) of this process and each process below it, by role
    (from /proc; 10 ms ticks): the node daemon, the worker template, each worker (forked from the
    template, whose command line it shares, or started afresh)."""
    from gfaas.proctree import descendants

    tick = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    out: dict[str, Any] = {}
    for d in descendants(me):
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        template = "gfaas.runtime.forkserver" in cmd and int(fields[1]) == me
        role = "runtime (this process)" if d == me else "node daemon" if "node_main" in cmd else \
            "worker template" if template else \
            f"worker {d}" if "worker_main" in cmd or "gfaas.runtime.forkserver" in cmd else f"other {d}"
        u, st = int(fields[11]) / tick, int(fields[12]) / tick
        out[role] = (u, st) if split else u + st
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["loop", "count", "timeline", "lean", "opcodes", "registry"])
    p.add_argument("--n", type=int, default=300, help="invocations measured (after a warm-up)")
    p.add_argument("--concurrency", type=int, default=1, help="count: invocations kept in flight (default 1)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", metavar="FILE", help="also write the document with its provenance to FILE")
    return p


def wake_cost(n: int = 3000, poll_s: float = 300e-6, think_s: float = 50e-6) -> dict[str, Any]:
    """What a sleeping process costs its sender (policy.polling): the p50 round trip of a 64-byte
    message to a forked echo process over a SOCK_SEQPACKET pair, both ends blocking in ``recv``, then
    both asking without blocking for up to ``poll_s`` first; ``think_s`` of work between round trips,
    as an invoker has between invocations."""
    def recv(sock: socket.socket, poll: float) -> bytes:
        end = time.perf_counter() + poll
        while poll:
            try:
                return sock.recv(256, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if time.perf_counter() > end:
                    break
        return sock.recv(256)

    out: dict[str, Any] = {"think_us": think_s * 1e6, "poll_us": poll_s * 1e6}
    for label, poll in (("sleeping", 0.0), ("polling", poll_s)):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the echo process
            a.close()
            while m := recv(b, poll):
                b.send(m)
            os._exit(0)
        b.close()
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            a.send(b"x" * 64)
            recv(a, poll)
            lat.append(time.perf_counter() - t)
            end = time.perf_counter() + think_s
            while time.perf_counter() < end:
                pass
        a.close()
        os.waitpid(pid, 0)
        out[f"{label}_p50_us"] = round(float(np.median(lat)) * 1e6, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.n < 1:
        p.error(f"--n {a.n}: give at least 1")
    floor: list[float] = []

    def floor_burst() -> None:
        """The two-hop pipe floor now (p50 of a short burst, blocking and polling): taken before and
        after the loop, the least of them counts, as in gfaas bench overload (other jobs move it)."""
        if a.out:
            from gfaas.bench.overload import relay_samples

            floor.append(float(np.median(relay_samples(400, 50))))
            floor.append(float(np.median(relay_samples(400, 50, poll=True))))

    if a.mode == "loop":
        for _ in range(3):
            floor_burst()
        with LocalRuntime(RuntimeConfig()) as rt:
            rt.deploy(SPEC)
            _loop(rt, 20)
            cpu0, split0 = _cpu_by_process(), _cpu_split()
            t0 = time.perf_counter()
            ts = np.asarray(_loop(rt, a.n)) * 1e3
            wall = time.perf_counter() - t0
            cpu1, split1 = _cpu_by_process(), _cpu_split()
            # "worker PID" -> "worker of FUNCTION"
            pools = getattr(getattr(rt, "deployments", None), "pools", {})
            named = {f"worker {w.pid}": f"worker of {w.name.split('@')[0]}" for p in pools.values() for w in p.slots}
            split0 = {named.get(k, k): v for k, v in split0.items()}
            split1 = {named.get(k, k): v for k, v in split1.items()}
            for _ in range(3):
                floor_burst()
        doc: dict[str, Any] = {"invocations": a.n, "p50_ms": round(float(np.median(ts)), 3),
                               "p99_ms": round(float(np.percentile(ts, 99)), 3),
                               "wall_ms_per_invocation": round(wall / a.n * 1e3, 3),
                               "cpu_ms_per_invocation": {k: round((cpu1.get(k, 0.0) - v) / a.n * 1e3, 3)
                                                         for k, v in cpu0.items()}}
        if a.out:
            doc["cpu_us_per_invocation"] = {
                k: {"user": round((split1[k][0] - u) / a.n * 1e6, 1), "system": round((split1[k][1] - st) / a.n * 1e6, 1)}
                for k, (u, st) in split0.items() if k in split1 and split1[k] != (u, st)}
            doc["python_calls_per_invocation"] = _python_calls(min(a.n, 500))
            doc["pipe_floor_us"] = round(min(floor), 2)
            doc["pipe_floor_bursts_us"] = [round(x, 2) for x in floor]
            # the same loop with nobody polling (RuntimeConfig.poll_us=0), in the same run
            with LocalRuntime(RuntimeConfig(poll_us=0)) as rt:
                rt.deploy(SPEC)
                _loop(rt, 20)
                cpu0 = _cpu_by_process()
                ts0 = np.asarray(_loop(rt, a.n)) * 1e3
                cpu1 = _cpu_by_process()
            doc["without_polling"] = {"p50_ms": round(float(np.median(ts0)), 3),
                                      "cpu_ms_per_invocation": round(sum(cpu1.get(k, 0.0) - v for k, v in cpu0.items())
                                                                     / a.n * 1e3, 3)}
            doc["poll_us"] = RuntimeConfig().poll_us
            doc["wake"] = wake_cost()
    elif a.mode in ("timeline", "lean"):
        for _ in range(3):
            floor_burst()
        doc = timeline(a.n) if a.mode == "timeline" else lean(a.n)
        for _ in range(3):
            floor_burst()
        if a.out:
            doc["pipe_floor_us"] = round(min(floor), 2)
            doc["pipe_floor_bursts_us"] = [round(x, 2) for x in floor]
            if a.mode == "lean":  # as gfaas bench overload's target: p50 over the least floor burst
                doc["invoke_over_floor"] = round(doc["invoke_p50_us"] / min(floor), 1)
                doc["essential_over_floor"] = round(doc["essential_p50_us"] / min(floor), 1)
    elif a.mode == "opcodes":
        doc = opcodes(a.n)
    else:
        doc = count(a.n, a.concurrency) if a.mode == "count" else registry(a.n)
    if a.out:
        from gfaas.cli_bench import cli_settings
        from gfaas.provenance import provenance

        with open(a.out, "w") as f:
            f.write(json.dumps({**doc, "mode": a.mode, "provenance": provenance(settings=cli_settings(a))},
                               indent=2) + "\n")
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        for k, v in doc.items():
            if isinstance(v, dict) and k == "per_invocation":
                for name, x in v.items():
                    print(f"  {name:70s} {x}")
            elif k == "steps":
                for st in v:
                    print(f"  {st['p50_ms']:7.3f} ms  {st['step']:15s} {st['what']}")
            elif k == "rows":
                for row in v:
                    print(f"  {row}")
            else:
                print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
