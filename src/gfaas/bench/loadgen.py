"""A closed-loop HTTP/1.1 load generator for ``gfaas bench overload``, run as a process of its own.

``connections`` keep-alive TCP connections are opened first; then, for ``duration_s`` seconds, each
sends a request, waits for its answer and sends the next (a refusal's ``Retry-After`` is honoured,
capped at ``retry_after_cap_s`` and at the window's end, and stretched by a random factor in
``[1, 1 + retry_jitter)``, as well-behaved clients do: refused together, clients that all wait exactly
``Retry-After`` come back together, and the server then answers a burst of them at once). No request is sent after the window;
requests still in flight may finish for ``drain_s`` more seconds, and whatever has not been
answered then is cancelled and counted as failed (``no_answer``, also reported as ``lost``). So
every request sent is counted exactly once: ``sent == ok + rejected + failed``.

It is plain asyncio streams with a hand-written HTTP/1.1 client (one request per connection at a
time, ``Content-Length`` or chunked answers): a few tens of microseconds of CPU per request, so
one process drives 2,000 connections, and the CPU seconds it used are reported with the counts so
a reader can see that it was not the bottleneck. Loopback only.

Run as ``python -m gfaas.bench.loadgen``: a :class:`LoadSpec` as JSON on stdin, the result as one
JSON document on stdout.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ..errors import ConfigError

_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class LoadSpec:
    """One row of load.

    Attributes:
        url: the full URL requests go to (``http://127.0.0.1:PORT/v1/workflows/NAME/invocations?...``).
        body: the request body (JSON text), the same for every request.
        connections: keep-alive connections, each with one request outstanding at a time.
        duration_s: the window in which requests are sent.
        drain_s: how long requests in flight at the window's end may still take to be answered.
        request_timeout_s: the client's bound on one request (set it above the server's own timeout,
            so the server's 504 is what a slow request gets).
        expect_total: the ``red.total`` scalar a correct answer carries (None: not checked).
        honor_retry_after: wait out a refusal's ``Retry-After`` before the next request.
        retry_after_cap_s: the longest such wait (before the jitter).
        retry_jitter: the wait is ``min(Retry-After, cap) * (1 + retry_jitter * u)``, u uniform in [0, 1)
            from a generator seeded by the connection's index (0: every client waits exactly Retry-After).
    """

    url: str
    body: str
    connections: int
    duration_s: float
    drain_s: float = 70.0
    request_timeout_s: float = 75.0
    expect_total: float | None = None
    honor_retry_after: bool = True
    retry_after_cap_s: float = 1.0
    retry_jitter: float = 1.0

    def __post_init__(self) -> None:
        u = urlsplit(self.url)
        if u.scheme != "http" or u.hostname not in _LOOPBACK or u.port is None:
            raise ConfigError(f"load generator url {self.url!r}: give http://127.0.0.1:PORT/... (loopback only, "
                              "with a port)")
        if self.connections < 1:
            raise ConfigError(f"connections={self.connections}: give at least 1")
        if not 0 <= self.retry_jitter <= 10:
            raise ConfigError(f"LoadSpec.retry_jitter={self.retry_jitter!r}: give a factor in [0, 10] (0: none)")
        for name in ("duration_s", "drain_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"LoadSpec.{name}={getattr(self, name)!r}: give seconds > 0")


@dataclass
class _Tally:
    sent: int = 0
    ok: int = 0
    ok_in_window: int = 0
    rejected: Counter[int] = field(default_factory=Counter)  # status -> count (429, 503)
    failed: Counter[str] = field(default_factory=Counter)  # reason -> count
    in_flight: int = 0
    connects: int = 0
    connect_failures: int = 0
    idle_closed: int = 0  # keep-alive connections the server closed between requests (then reopened)
    ok_lat: list[float] = field(default_factory=list)
    reject_lat: list[float] = field(default_factory=list)
    reject_lat_later: list[float] = field(default_factory=list)  # sent 1 s or more into the window
    window_start: float = float("inf")
    ids: set[str] = field(default_factory=set)
    duplicated: int = 0


class _Closed(Exception):
    """The server closed the connection (or broke the framing) before answering."""


def raise_fd_limit(wanted: int) -> tuple[int, int]:
    """Raise the soft open-file limit to at least ``wanted`` (up to the hard limit); returns (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft, hard


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise _Closed() from exc
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        raise _Closed() from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, sep, v = line.partition(":")
        if sep:
            headers[k.strip().lower()] = v.strip()
    try:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(chunk[:-2])
            body = b"".join(parts)
        else:
            body = await reader.readexactly(int(headers.get("content-length", "0")))
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        raise _Closed() from exc
    return status, headers, body


def _check_ok(body: bytes, t: _Tally, expect: float | None) -> str | None:
    """None for a correct, first-seen result document; else the failure reason."""
    try:
        doc = json.loads(body)
    except ValueError:
        return "bad_body"
    if doc.get("status") != "done":
        return "invocation_failed"
    if expect is not None:
        got = doc.get("scalars", {}).get("red.total")
        if not isinstance(got, int | float) or abs(got - expect) > 1e-6 * max(1.0, abs(expect)):
            return "wrong_answer"
    inv = doc.get("invocation_id")
    if inv in t.ids:
        t.duplicated += 1
        return "duplicated"
    t.ids.add(inv)
    return None


async def _connection(spec: LoadSpec, request: bytes, host: str, port: int, t: _Tally,
                      start: asyncio.Event, end_at: list[float], index: int) -> None:
    rng = random.Random(index)  # the jitter of Retry-After waits, reproducible per connection
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    async def connect() -> bool:
        nonlocal reader, writer
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
            t.connects += 1
            return True
        except OSError:
            t.connect_failures += 1
            return False

    async def close() -> None:
        nonlocal reader, writer
        if writer is not None:
            writer.close()
        reader = writer = None

    await connect()
    await start.wait()
    loop = asyncio.get_running_loop()
    try:
        while loop.time() < end_at[0]:
            if writer is None and not await connect():
                await asyncio.sleep(0.05)
                continue
            assert reader is not None and writer is not None
            if reader.at_eof():  # the server closed it while idle (keep-alive timeout): a client reconnects
                await close()
                t.idle_closed += 1
                continue
            t0 = time.perf_counter()
            t.sent += 1
            t.in_flight += 1
            retry_after = 0.0
            try:
                writer.write(request)
                async with asyncio.timeout(spec.request_timeout_s):
                    status, headers, body = await _read_response(reader)
            except TimeoutError:
                t.in_flight -= 1
                t.failed["client_timeout"] += 1
                await close()
                continue
            except (_Closed, OSError):
                t.in_flight -= 1
                t.failed["connection_closed"] += 1
                await close()
                continue
            lat = time.perf_counter() - t0
            t.in_flight -= 1
            if status == 200:
                why = _check_ok(body, t, spec.expect_total)
                if why is None:
                    t.ok += 1
                    t.ok_lat.append(lat)
                    t.ok_in_window += loop.time() <= end_at[0]
                else:
                    t.failed[why] += 1
            elif status in (429, 503):
                t.rejected[status] += 1
                t.reject_lat.append(lat)
                if t0 - t.window_start >= 1.0:
                    t.reject_lat_later.append(lat)
                try:
                    retry_after = float(headers.get("retry-after", "0"))
                except ValueError:
                    retry_after = 0.0
            elif status == 504:
                t.failed["timeout_504"] += 1
            else:
                t.failed[f"http_{status}"] += 1
            if headers.get("connection", "").lower() == "close":
                await close()
            if spec.honor_retry_after and retry_after > 0:
                pause = min(retry_after, spec.retry_after_cap_s) * (1.0 + spec.retry_jitter * rng.random())
                pause = min(pause, max(0.0, end_at[0] - loop.time()))
                if pause > 0:
                    await asyncio.sleep(pause)
    finally:
        await close()


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(np.asarray(xs), q)) * 1e3, 3) if xs else None


async def _drive(spec: LoadSpec) -> dict[str, Any]:
    u = urlsplit(spec.url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    target = u.path + (f"?{u.query}" if u.query else "")
    body = spec.body.encode()
    request = (f"POST {target} HTTP/1.1\r\nHost: {host}:{port}\r\ncontent-type: application/json\r\n"
               f"content-length: {len(body)}\r\n\r\n").encode() + body
    t = _Tally()
    start = asyncio.Event()
    loop = asyncio.get_running_loop()
    end_at = [float("inf")]
    tasks = [asyncio.create_task(_connection(spec, request, host, port, t, start, end_at, i))
             for i in range(spec.connections)]
    # Every connection opens before the clock starts: the window measures requests, not connects.
    t_conn = time.perf_counter()
    while t.connects + t.connect_failures < spec.connections and time.perf_counter() - t_conn < 30:
        await asyncio.sleep(0.01)
    connect_s = time.perf_counter() - t_conn
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    # The measuring tool must not add pauses of its own to the latencies it records: a full collection
    # over 2,000 connections' objects took 60 ms here. Nothing it makes per request needs the cycle
    # collector (reference counting frees it), so it is off for the window and the drain.
    gc.collect()
    gc.freeze()
    gc.disable()
    w0 = t.window_start = time.perf_counter()
    end_at[0] = loop.time() + spec.duration_s
    start.set()
    try:
        done, pending = await asyncio.wait(tasks, timeout=spec.duration_s + spec.drain_s)
    finally:
        gc.enable()
    window_s = spec.duration_s
    lost = t.in_flight  # sent, never answered within the drain: cancelled below
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    wall = time.perf_counter() - w0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    if lost:
        t.failed["no_answer"] += lost
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    rejected = sum(t.rejected.values())
    failed = sum(t.failed.values())
    return {
        "connections": spec.connections,
        "duration_s": window_s,
        "sent": t.sent,
        "ok": t.ok,
        "ok_in_window": t.ok_in_window,
        "rejected": rejected,
        "rejected_by_status": {str(k): v for k, v in sorted(t.rejected.items())},
        "failed": failed,
        "failed_by_reason": dict(sorted(t.failed.items())),
        "lost": lost,
        "duplicated": t.duplicated,
        "goodput_rps": round(t.ok_in_window / window_s, 2),
        "offered_rps": round(t.sent / window_s, 2),
        "p50_ms": _pct(t.ok_lat, 50),
        "p90_ms": _pct(t.ok_lat, 90),
        "p99_ms": _pct(t.ok_lat, 99),
        "max_ms": _pct(t.ok_lat, 100),
        "reject_p50_ms": _pct(t.reject_lat, 50),
        "reject_p99_ms": _pct(t.reject_lat, 99),
        "reject_p99_after_1s_ms": _pct(t.reject_lat_later, 99),
        "idle_closed": t.idle_closed,
        "connects": t.connects,
        "connect_failures": t.connect_failures,
        "connect_s": round(connect_s, 3),
        "wall_s": round(wall, 3),
        "loadgen_cpu_s": round(cpu, 3),
        "loadgen_cpu_frac": round(cpu / wall, 3) if wall > 0 else None,
        "loadgen_cpu_us_per_request": round(cpu / t.sent * 1e6, 1) if t.sent else None,
        "loadgen_rss_mib": round(ru1.ru_maxrss / 1024, 1),
    }


def run(spec: LoadSpec) -> dict[str, Any]:
    """Drive one row of load (in this process) and return its counts, latencies and own CPU time."""
    soft, _ = raise_fd_limit(spec.connections + 256)
    if soft != resource.RLIM_INFINITY and soft < spec.connections + 16:
        raise ConfigError(f"{spec.connections} connections need that many open files; the limit is {soft} "
                          f"(raise it with `ulimit -n {spec.connections + 256}`)")
    out = asyncio.run(_drive(spec))
    out["nofile_soft"] = soft
    return out


async def _null_server() -> None:
    """Answer every request at once with a result-sized document (unique ids, ``red.total`` 0): the
    calibration peer that shows what the load generator itself can drive on this machine."""
    n = 0
    pad = "p" * 1200  # about the size of a real result document

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal n
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                n += 1
                body = json.dumps({"invocation_id": f"null-{n}", "status": "done", "scalars": {"red.total": 0.0},
                                   "pad": pad}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # serve until stdin closes
    server.close()


def main(argv: list[str]) -> int:
    """``python -m gfaas.bench.loadgen``: a LoadSpec as JSON on stdin, the row as JSON on stdout;
    ``--null-server``: serve the calibration peer on a free loopback port (printed) until stdin closes."""
    if argv == ["--null-server"]:
        raise_fd_limit(65536)
        asyncio.run(_null_server())
        return 0
    if argv:
        print(f"usage: python -m gfaas.bench.loadgen [--null-server] (got {argv}); a LoadSpec comes as JSON on stdin",
              file=sys.stderr)
        return 2
    spec = LoadSpec(**json.loads(sys.stdin.read()))
    print(json.dumps(run(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

