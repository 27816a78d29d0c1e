"""``gfaas bench dataplane --gpu``: the CUDA backend against plain CUDA calls, in one run.

Rows (each a p50 over ``repeat`` runs after a warm-up, GB/s = bytes / p50 / 1e9):

``h2d`` / ``d2h``, 1 MiB ... 1 GiB
    ``gfaas-ring``: :class:`~gfaas.dataplane.backends.cuda.CudaBackend` copies from/into ordinary
    (pageable) host memory through its pinned ring, 2 MiB chunks, 2 streams, batches of 5;
    ``gfaas-ring-8MiB`` (>= 64 MiB only): the same with 8 MiB chunks (a quarter of the thread hops
    and launches per byte), to say whether the chunk size holds the ring short of the link;
    ``cuda-pageable``: one ``cudaMemcpy`` from/into the same pageable array;
    ``cuda-pinned``: one ``cudaMemcpy`` from/into ``cudaHostAlloc`` memory (the ceiling);
    ``gfaas-registered``: the backend's copy of an object in a node host segment (a memfd mapping
    of the host backend) once that segment is registered (``dataplane.pinned``): one DMA.
``register``, 1 MiB ... 1 GiB
    ``cuda-host-register``: ``cudaHostRegister`` + ``cudaHostUnregister`` of a node host segment of
    that size, with ``copies_to_pay``: the copy at which registering pays by the rule
    (``policy.pinning``) with this run's measured rates.
``same-gpu-get``, 64 MiB
    ``gfaas-ipc-bound``: the same get as a runtime task makes it, on a worker's attached connection
    that the platform binds with the object prefetched (``Bind.prefetch``): no round trip;
    ``gfaas-ipc``: a consumer process ``get``\\ s an object another process put on the same GPU,
    through a node daemon (``devices='cuda:0'``), one object at a time as a pipeline passes them
    (put, get, drop, so the pool reuses its arenas); only gets whose arena this process had open
    already count (``cudaIpcOpenMemHandle`` is paid once per arena, reported as ``first_get_us``);
    ``host-round-trip``: the host-centric way, D2H into pageable memory then H2D into a new buffer.
``alloc``, 1 MiB and 64 MiB
    ``gfaas-pool``: block alloc + free from the warm pool; ``cuda-malloc``: ``cudaMalloc`` + ``cudaFree``.
``pinned-bytes``
    bytes pinned by the ring (fixed) vs per-function pinning (every concurrent transfer pins its
    own buffer: 8 functions x 64 MiB), and the measured time to pin 100 MB with ``cudaHostAlloc``.

Needs a CUDA GPU and ``gfaas[gpu]``; exits with a message naming what is missing otherwise.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..units import MiB

SIZES = [1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]
QUICK_SIZES = [1 * MiB, 64 * MiB]


def _p50(fn: Callable[[], None], repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    xs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs)


def _row(kind: str, system: str, size: int, secs: float) -> dict[str, Any]:
    return {"kind": kind, "system": system, "size_bytes": size, "p50_us": round(secs * 1e6, 2),
            "gbps": round(size / secs / 1e9, 3) if secs > 0 else None}


def _registered_copy(be: _Pinned, kind: str, n: int) -> Callable[[], None]:
    """One copy between a device segment and a node host segment (memfd) that ``be.cuda.pins``
    registers at its first copy (the rule's costs are set so: what is timed is the registered path)."""
    seg = be.host.alloc(n)
    whole = be.host.host_view(seg)
    assert whole is not None  # the host backend maps every segment
    view = whole[:n]
    np.frombuffer(view, np.uint8)[:] = 1  # touched: its pages exist before it is registered

    def copy() -> None:
        if kind == "h2d":
            be.cuda.copy_in(be.dev, 0, view)
        else:
            be.cuda.copy_out(be.dev, 0, n, view)

    be.segs.append((seg, view))
    return copy


def _register_rows(rt: Any, sizes: list[int], rows: list[dict[str, Any]], repeat: int) -> list[dict[str, Any]]:
    """The cost of registering a node host segment, and when it pays with this run's rates."""
    from ..dataplane.backends import HostBackend
    from ..dataplane.pinned import PORTABLE
    from ..policy.pinning import PinCosts, copies_to_pay

    def gbps(kind: str, system: str, n: int) -> float | None:
        r = next((r for r in rows if r["kind"] == kind and r["system"] == system and r.get("size_bytes") == n), None)
        return r["gbps"] if r else None

    host = HostBackend()
    out = []
    for n in sizes:
        seg = host.alloc(n)
        view = host.host_view(seg)
        assert view is not None  # the host backend maps every segment
        np.frombuffer(view, np.uint8)[:] = 1
        addr = int(np.frombuffer(view, np.uint8).ctypes.data)

        def register() -> None:
            rt.hostRegister(addr, n, PORTABLE)  # noqa: B023
            rt.hostUnregister(addr)  # noqa: B023

        secs = _p50(register, max(3, repeat // 4), warmup=1)
        row = _row("register", "cuda-host-register", n, secs)
        ring, dma = gbps("h2d", "gfaas-ring", n), gbps("h2d", "gfaas-registered", n)
        if ring and dma and secs > 0:
            row["copies_to_pay"] = copies_to_pay(n, PinCosts(ring_gbps=ring, dma_gbps=dma,
                                                             register_gbps=n / secs / 1e9, register_fixed_s=0.0))
        out.append(row)
        view.release()
        host.free(seg)
    return out


def _transfers(rt: Any, be: Any, sizes: list[int], repeat: int, log: Callable[[str], None],
               be8: Any = None, pinned_be: Any = None) -> list[dict[str, Any]]:
    rows = []
    top = max(sizes)
    host = np.ones(top, np.uint8)  # pageable, touched
    pinned_ptr = int(rt.hostAlloc(top, 0))
    pinned = np.frombuffer(memoryview((ctypes.c_uint8 * top).from_address(pinned_ptr)).cast("B"), np.uint8)
    pinned[:] = 1
    seg = be.alloc(top)
    try:
        for n in sizes:
            log(f"  h2d/d2h {n // MiB} MiB")
            hv = memoryview(host[:n].data)
            rep = max(3, repeat if n <= 64 * MiB else repeat // 4)
            for kind in ("h2d", "d2h"):
                if kind == "h2d":
                    ring = _p50(lambda: be.copy_in(seg, 0, hv), rep)  # noqa: B023
                    page = _p50(lambda: rt.memcpy(seg.address, host.ctypes.data, n, rt.memcpyHostToDevice), rep)  # noqa: B023
                    pin = _p50(lambda: rt.memcpy(seg.address, pinned_ptr, n, rt.memcpyHostToDevice), rep)  # noqa: B023
                else:
                    ring = _p50(lambda: be.copy_out(seg, 0, n, hv), rep)  # noqa: B023
                    page = _p50(lambda: rt.memcpy(host.ctypes.data, seg.address, n, rt.memcpyDeviceToHost), rep)  # noqa: B023
                    pin = _p50(lambda: rt.memcpy(pinned_ptr, seg.address, n, rt.memcpyDeviceToHost), rep)  # noqa: B023
                rows += [_row(kind, "gfaas-ring", n, ring), _row(kind, "cuda-pageable", n, page),
                         _row(kind, "cuda-pinned", n, pin)]
                if pinned_be is not None:
                    rows.append(_row(kind, "gfaas-registered", n, _p50(_registered_copy(pinned_be, kind, n), rep)))
                if be8 is not None and n >= 64 * MiB:
                    seg8 = be8.alloc(n)
                    fn = (lambda: be8.copy_in(seg8, 0, hv)) if kind == "h2d" else (lambda: be8.copy_out(seg8, 0, n, hv))  # noqa: B023
                    rows.append(_row(kind, "gfaas-ring-8MiB", n, _p50(fn, rep)))
                    be8.free(seg8)
    finally:
        be.free(seg)
        rt.freeHost(pinned_ptr)
    return rows


@dataclass
class _Pinned:
    """A CUDA backend whose node host segments (of ``host``) are registered at their first copy,
    the device segment the registered rows copy to and from, and the host segments they made."""

    cuda: Any
    host: Any
    dev: Any
    segs: list[tuple[Any, memoryview]] = field(default_factory=list)


def _pinned_backend(rt: Any, top: int) -> _Pinned:
    from ..dataplane.backends import HostBackend, pin_host_segments
    from ..dataplane.backends.cuda import CudaBackend
    from ..dataplane.pinned import HostPins
    from ..policy.pinning import PinCosts

    pins = HostPins(rt, PinCosts(register_gbps=1e9, register_fixed_s=0.0))
    be = CudaBackend(0, cap_bytes=2 * top + 64 * MiB, target_bytes=0, pins=pins)
    host = HostBackend()
    pin_host_segments(host, {0: be})
    return _Pinned(be, host, be.alloc(top))


def _close_pinned(p: _Pinned) -> None:
    for seg, view in p.segs:
        view.release()
        p.host.free(seg)
    p.cuda.free(p.dev)
    p.cuda.close()
    p.cuda.pins.close()


def _alloc_rows(rt: Any, be: Any, repeat: int) -> list[dict[str, Any]]:
    rows = []
    for n in (1 * MiB, 64 * MiB):
        def pool() -> None:
            be.free(be.alloc(n))  # noqa: B023

        def malloc() -> None:
            rt.free(rt.malloc(n))  # noqa: B023

        rows += [_row("alloc", "gfaas-pool", n, _p50(pool, repeat * 5)),
                 _row("alloc", "cuda-malloc", n, _p50(malloc, repeat))]
    return rows


def _pinned_rows(rt: Any, be: Any) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    p = rt.hostAlloc(100 * 1000 * 1000, 0)
    secs = time.perf_counter() - t0
    rt.freeHost(p)
    return [{"kind": "pinned-bytes", "system": "gfaas-ring", "bytes": be.ops.ring.nbytes},
            {"kind": "pinned-bytes", "system": "per-function", "bytes": 8 * 64 * MiB,
             "note": "8 concurrent functions each pinning a 64 MiB buffer"},
            {"kind": "pin-100MB", "system": "cudaHostAlloc", "p50_us": round(secs * 1e6, 1)}]


def _consumer(sock: str, token: str, q_in: Any, q_out: Any) -> None:
    """Get each ref sent, timed; say whether the get had to open an arena (cold)."""
    import gfaas

    c = gfaas.connect(socket_path=sock, token=token)
    while (r := q_in.get()) is not None:
        before = len(c._arenas)
        t0 = time.perf_counter()
        v = c.get(r)
        secs = time.perf_counter() - t0
        del v  # released with the next request, so the producer's next put reuses the block
        q_out.put((secs, len(c._arenas) > before))
    c.close()


def _bound_consumer(sock: Any, welcome: bytes, socket_path: str, invocation: str, q_in: Any, q_out: Any,
                    mapper: Any = None) -> None:
    """The runtime's way to the same get: a worker's attached connection, which the platform binds
    to each task with the task's input prefetched (``Bind.prefetch``); each get timed, and whether it
    was served with no round trip. ``mapper``: the device mapper (tests pass a fake one)."""
    from ..dataplane import protocol as P
    from ..dataplane.client import Client

    hello = P.decode_reply(welcome)
    assert isinstance(hello, P.Welcome)
    c = Client(socket_path, None, sock=sock, welcome=hello, device_mapper=mapper)
    while (r := q_in.get()) is not None:
        c.expect_binding(invocation)
        before, served = len(c._arenas), c.prefetched_gets
        t0 = time.perf_counter()
        v = c.get(r, device=0)
        secs = time.perf_counter() - t0
        del v
        c.end_task()
        q_out.put((secs, len(c._arenas) > before, c.prefetched_gets > served))
    c.close()


def bound_gets(admin: Any, inv: Any, put: Callable[[], Any], rounds: int, ctx: Any,
               mapper: Any = None) -> list[tuple[float, bool, bool]]:
    """``rounds`` gets by :func:`_bound_consumer` in a process of ``ctx`` (or a thread, with a
    ``threading`` stand-in for tests): each round ``put()`` stores an object for ``c``, the platform
    binds the consumer's connection with it prefetched, and the consumer gets it."""
    from ..dataplane import protocol as P
    from ..dataplane.client import Binder

    sock, welcome = admin.attach_socket()
    binder = Binder(sock, welcome, admin.socket_path)
    theirs = socket.socket(fileno=os.dup(sock.fileno()))
    q_in, q_out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_bound_consumer, args=(theirs, P.encode(welcome), admin.socket_path, inv.id, q_in,
                                                     q_out, mapper))
    proc.start()
    out = []
    try:
        for _ in range(rounds):
            ref = put()
            binder.bind(inv.tokens["c"], prefetch=[ref.id])
            q_in.put(str(ref))
            out.append(q_out.get(timeout=300))
            binder.unbind()
    finally:
        q_in.put(None)
        proc.join(60)
        binder.close()
    return out


def ipc_row(n: int, gets: list[tuple[float, bool]]) -> dict[str, Any]:
    """The ``gfaas-ipc`` row from ``(seconds, opened an arena)`` per get, in order: the p50 of the gets
    whose arena the consumer had open already (a pipeline's steady state); ``cudaIpcOpenMemHandle`` is
    paid once per arena, so the cold gets are only counted, and the first one reported."""
    cold = [secs for secs, opened in gets if opened]
    warm = [secs for secs, opened in gets if not opened]
    if not warm:
        raise SystemExit("bench: every same-GPU get opened a new arena; the pool did not reuse its arenas")
    row = _row("same-gpu-get", "gfaas-ipc", n, statistics.median(warm))
    row["first_get_us"] = round(cold[0] * 1e6, 1) if cold else None
    row["cold_gets"] = len(cold)
    return row


def _ipc_rows(repeat: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    import cupy as cp

    import gfaas
    from gfaas.dataplane.local import LocalNode

    n = 64 * MiB
    rows = []
    with tempfile.TemporaryDirectory(prefix="gfb-", dir="/tmp") as d:
        cfg = gfaas.NodeConfig(node_id="gpubench", socket_path=os.path.join(d, "s"), state_dir=os.path.join(d, "st"),
                               devices="cuda:0", capacity_bytes=256 * MiB, slab_bytes=8 * MiB)
        with LocalNode(cfg), gfaas.Admin(cfg.socket_path, state_dir=cfg.state_dir) as admin:
            inv = admin.open_invocation("bench", ["p", "c"])
            prod = gfaas.connect(inv.credentials("p"))
            src = cp.ones(n, cp.uint8)
            log("  same-GPU get through a daemon (IPC), arenas already open")
            ctx = mp.get_context("spawn")
            q_in, q_out = ctx.Queue(), ctx.Queue()
            proc = ctx.Process(target=_consumer, args=(cfg.socket_path, inv.tokens["c"], q_in, q_out))
            proc.start()
            gets: list[tuple[float, bool]] = []
            for _ in range(repeat + 4):  # a 64 MiB object fills an arena: the first few open theirs
                q_in.put(str(prod.put(src, consumers=["c"])))
                gets.append(q_out.get(timeout=300))
            q_in.put(None)
            proc.join(60)
            rows.append(ipc_row(n, gets))
            log("  the same get as a runtime task makes it: its input prefetched with the task's Bind")
            bound = bound_gets(admin, inv, lambda: prod.put(src, consumers=["c"]), repeat + 4, ctx)
            row = ipc_row(n, [(secs, opened) for secs, opened, _ in bound])
            row["system"] = "gfaas-ipc-bound"
            row["prefetched"] = sum(1 for *_, served in bound if served)
            rows.append(row)

            def round_trip() -> None:
                h = cp.asnumpy(src)
                cp.asarray(h)
                cp.cuda.get_current_stream().synchronize()

            rows.append(_row("same-gpu-get", "host-round-trip", n, _p50(round_trip, max(3, repeat // 2))))
            prod.close()
    return rows


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured ratio and whether it was met."""
    def get(kind: str, system: str, size: int) -> dict[str, Any] | None:
        return next((r for r in rows if r["kind"] == kind and r["system"] == system
                     and r.get("size_bytes") == size), None)

    out = []
    for kind in ("h2d", "d2h"):
        for n in sorted({r["size_bytes"] for r in rows if r["kind"] == kind and r["size_bytes"] >= 64 * MiB}):
            reg, pin = get(kind, "gfaas-registered", n), get(kind, "cuda-pinned", n)
            if reg and pin:
                out.append({"target": f"{kind} {n // MiB} MiB node segment (registered) >= 90% of pinned",
                            "value": round(reg["gbps"] / pin["gbps"], 3), "met": reg["gbps"] >= 0.9 * pin["gbps"]})
            ring, pin, page = get(kind, "gfaas-ring", n), get(kind, "cuda-pinned", n), get(kind, "cuda-pageable", n)
            if ring and pin and page:
                out.append({"target": f"{kind} {n // MiB} MiB ring >= 90% of pinned",
                            "value": round(ring["gbps"] / pin["gbps"], 3), "met": ring["gbps"] >= 0.9 * pin["gbps"]})
                out.append({"target": f"{kind} {n // MiB} MiB ring >= 2x pageable",
                            "value": round(ring["gbps"] / page["gbps"], 3), "met": ring["gbps"] >= 2 * page["gbps"]})
    ipc, rt_ = get("same-gpu-get", "gfaas-ipc", 64 * MiB), get("same-gpu-get", "host-round-trip", 64 * MiB)
    bound = get("same-gpu-get", "gfaas-ipc-bound", 64 * MiB)
    if bound:
        out.append({"target": "same-GPU get p50 <= 50 us (a runtime task's, input prefetched)",
                    "value": bound["p50_us"], "met": bound["p50_us"] <= 50})
    if ipc and rt_:
        out.append({"target": "same-GPU 64 MiB get >= 100x faster than host round trip",
                    "value": round(rt_["p50_us"] / ipc["p50_us"], 1), "met": rt_["p50_us"] >= 100 * ipc["p50_us"]})
        out.append({"target": "same-GPU get p50 <= 50 us", "value": ipc["p50_us"], "met": ipc["p50_us"] <= 50})
    for n in (1 * MiB, 64 * MiB):
        pool, mal = get("alloc", "gfaas-pool", n), get("alloc", "cuda-malloc", n)
        if pool and mal:
            out.append({"target": f"pool alloc {n // MiB} MiB >= 100x faster than cudaMalloc+cudaFree",
                        "value": round(mal["p50_us"] / pool["p50_us"], 1), "met": mal["p50_us"] >= 100 * pool["p50_us"]})
    return out


def run_gpu(quick: bool, log: Callable[[str], None]) -> dict[str, Any]:
    from ..dataplane.backends.cuda import CudaBackend, gpu_status, runtime

    count, why = gpu_status()
    if not count:
        raise SystemExit(f"gfaas bench dataplane --gpu: {why}")
    rt = runtime()
    props = rt.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    repeat = 5 if quick else 20
    be = CudaBackend(0, cap_bytes=4 * 1024 * MiB, target_bytes=2 * 1024 * MiB)
    be8 = CudaBackend(0, cap_bytes=2048 * MiB, target_bytes=0, ring_bytes=40 * MiB, chunk_bytes=8 * MiB)
    sizes = QUICK_SIZES if quick else SIZES
    pinned_be = _pinned_backend(rt, max(sizes))
    try:
        log(f"GPU 0: {name}")
        rows = _transfers(rt, be, sizes, repeat, log, be8, pinned_be)
        rows += _register_rows(rt, sizes, rows, repeat)
        rows += _alloc_rows(rt, be, repeat)
        rows += _pinned_rows(rt, be)
    finally:
        be.close()
        be8.close()
        _close_pinned(pinned_be)
    rows += _ipc_rows(repeat, log)
    return {"device": name, "gpus": count, "rows": rows, "targets": targets(rows)}


def render_gpu(doc: dict[str, Any]) -> None:
    print(f"\nGPU rows on {doc['device']}")
    for r in doc["rows"]:
        size = f"{r['size_bytes'] // MiB} MiB" if "size_bytes" in r else ""
        val = f"{r['gbps']} GB/s" if r.get("gbps") else f"{r.get('p50_us', r.get('bytes'))}"
        print(f"  {r['kind']:<14} {r['system']:<16} {size:>9}  {val}")
    for t in doc["targets"]:
        print(f"  [{'met' if t['met'] else 'MISSED'}] {t['target']}: {t['value']}")
    sys.stdout.flush()
