"""``gfaas bench pipeline``: a two-stage inference pipeline in separate processes, passing its intermediate
tensor through the gfaas data plane and through Redis (the host-centric baseline), side by side.

Stage 1 (``preprocess``) turns a batch of uint8 frames into a normalised float32 tensor and hands it
on; stage 2 (``classify``) runs a small dense layer over it and returns class scores. Both transports
carry exactly the same tensors and must produce the same scores; the table compares the time spent
passing data (publish in stage 1 + retrieve in stage 2) and the end-to-end request latency.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

from ..config import NodeConfig
from ..units import MiB, format_bytes, parse_size

FEATURES = 64  # dense layer width of the toy classifier


def _frames(nbytes: int, seed: int) -> np.ndarray:
    """RGBA pixels whose float32 form is exactly ``nbytes``."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(max(1, nbytes // 16), 4), dtype=np.uint8)


def _preprocess(frames: np.ndarray) -> np.ndarray:
    return (frames.astype(np.float32) - 127.5) / 127.5


def _classify(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    flat = x.reshape(-1, 4)
    return (flat[: min(len(flat), 4096)] @ w).sum(axis=0)


# ---- transports: what each stage calls to publish / retrieve -------------------------------------
class _Gfaas:
    def __init__(self, creds: Any) -> None:
        import gfaas

        self.c = gfaas.connect(creds)

    def publish(self, x: np.ndarray) -> Any:
        # One copy into shared memory (small tensors: into this process's slab, sealed without
        # waiting for the daemon; large ones: a segment of their own); the consumer reads in place.
        return str(self.c.put(x, consumers=["classify"]))

    def retrieve(self, key: Any) -> np.ndarray:
        return self.c.get(key)  # zero-copy, read-only view


class _Redis:
    def __init__(self, url: str) -> None:
        import redis

        self.r = redis.Redis.from_url(url)
        self.n = 0

    def publish(self, x: np.ndarray) -> Any:
        self.n += 1
        key = f"demo:{os.getpid()}:{self.n}"
        self.r.set(key, x.tobytes())
        return (key, x.dtype.str, x.shape)

    def retrieve(self, key: Any) -> np.ndarray:
        k, dt, shape = key
        pipe = self.r.pipeline()
        pipe.get(k)
        pipe.delete(k)  # consumed: the baseline frees it too
        data = pipe.execute()[0]
        return np.frombuffer(data, dtype=dt).reshape(shape)


def _make(kind: str, arg: Any) -> Any:
    return _Gfaas(arg) if kind == "gfaas" else _Redis(arg)


def _stage1(kind: str, arg: Any, jobs: Any, out: Any) -> None:
    t = _make(kind, arg)
    while (job := jobs.recv()) is not None:
        nbytes, seed = job
        t0 = time.perf_counter()
        x = _preprocess(_frames(nbytes, seed))
        t1 = time.perf_counter()
        key = t.publish(x)
        t2 = time.perf_counter()
        out.send((key, t0, t2 - t1))


def _stage2(kind: str, arg: Any, inp: Any, results: Any) -> None:
    t = _make(kind, arg)
    w = np.random.default_rng(0).standard_normal((4, FEATURES)).astype(np.float32)
    while (msg := inp.recv()) is not None:
        key, t0, pub = msg
        t1 = time.perf_counter()
        x = t.retrieve(key)
        t2 = time.perf_counter()
        scores = _classify(x, w)
        t3 = time.perf_counter()
        results.send((pub + (t2 - t1), t3 - t0, float(scores.sum()), x.nbytes))


def _run_transport(kind: str, a1: Any, a2: Any, sizes: list[int], repeat: int) -> dict[int, dict[str, Any]]:
    ctx = mp.get_context("spawn")
    j_r, j_w = ctx.Pipe(False)
    m_r, m_w = ctx.Pipe(False)
    r_r, r_w = ctx.Pipe(False)
    p1 = ctx.Process(target=_stage1, args=(kind, a1, j_r, m_w), daemon=True)
    p2 = ctx.Process(target=_stage2, args=(kind, a2, m_r, r_w), daemon=True)
    p1.start()
    p2.start()
    out: dict[int, dict[str, Any]] = {}
    try:
        for size in sizes:
            passes, e2e, sums = [], [], []
            for i in range(repeat + 2):  # two warm-up requests per size
                j_w.send((size, i))
                if not r_r.poll(120):
                    raise RuntimeError(f"{kind} pipeline did not answer within 120 s")
                ps, lat, chk, nb = r_r.recv()
                if i >= 2:
                    passes.append(ps)
                    e2e.append(lat)
                    sums.append(chk)
            out[size] = {"pass_ms": float(np.median(passes)) * 1e3, "e2e_ms": float(np.median(e2e)) * 1e3,
                         "checksum": float(np.sum(sums)), "tensor_bytes": nb}
    finally:
        j_w.send(None)
        p1.join(10)
        m_w.send(None)
        p2.join(10)
        for p in (p1, p2):
            if p.is_alive():
                p.kill()
    return out


def run_pipeline(a: argparse.Namespace) -> int:
    from ..dataplane.client import Admin
    from ..dataplane.local import LocalNode
    from ..dataplane.redis_server import RedisServer

    sizes = [parse_size(s) for s in (a.sizes or "64KiB,1MiB,16MiB,64MiB").split(",") if s.strip()]
    quiet = bool(a.json)

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    run_dir = tempfile.mkdtemp(prefix="gfaas-demo-", dir="/tmp")
    cfg = NodeConfig(node_id="demo", socket_path=os.path.join(run_dir, "node.sock"),
                     state_dir=os.path.join(run_dir, "state"),
                     capacity_bytes=max(1024 * MiB, 8 * max(sizes)))
    say(f"starting a gfaas node daemon ({cfg.socket_path}) and a Redis server ...")
    with LocalNode(cfg), RedisServer(dir=run_dir) as rs, Admin(cfg.socket_path, state_dir=cfg.state_dir) as adm:
        inv = adm.open_invocation("demo-pipeline", ["preprocess", "classify"])
        say(f"pipeline preprocess -> classify, {a.repeat} requests per size, sizes {[format_bytes(s) for s in sizes]}")
        say("  running through gfaas (zero-copy shared memory) ...")
        g = _run_transport("gfaas", inv.credentials("preprocess"), inv.credentials("classify"), sizes, a.repeat)
        say("  running through Redis (host-centric baseline) ...")
        r = _run_transport("redis", rs.url, rs.url, sizes, a.repeat)
        stats = adm.stats()
        adm.end_invocation(inv)
    rows = []
    for s in sizes:
        if abs(g[s]["checksum"] - r[s]["checksum"]) > 1e-3 * max(1.0, abs(r[s]["checksum"])):
            print(f"gfaas: error: outputs differ at {format_bytes(s)}: {g[s]['checksum']} vs {r[s]['checksum']}",
                  file=sys.stderr)
            return 1
        rows.append({
            "size_bytes": g[s]["tensor_bytes"],
            "gfaas_pass_ms": g[s]["pass_ms"], "redis_pass_ms": r[s]["pass_ms"],
            "gfaas_e2e_ms": g[s]["e2e_ms"], "redis_e2e_ms": r[s]["e2e_ms"],
            "pass_speedup": r[s]["pass_ms"] / g[s]["pass_ms"],
            "e2e_speedup": r[s]["e2e_ms"] / g[s]["e2e_ms"],
        })
    result = {"workflow": "preprocess -> classify", "repeat": a.repeat, "rows": rows,
              "daemon_leftover_objects": stats["objects"]}
    if a.json:
        print(json.dumps(result, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Passing one intermediate tensor: gfaas vs Redis (median of requests)")
    for col in ("tensor", "pass gfaas", "pass Redis", "x", "e2e gfaas", "e2e Redis", "x"):
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(format_bytes(row["size_bytes"]), f"{row['gfaas_pass_ms']:.3f} ms", f"{row['redis_pass_ms']:.3f} ms",
                  f"{row['pass_speedup']:.1f}x", f"{row['gfaas_e2e_ms']:.2f} ms", f"{row['redis_e2e_ms']:.2f} ms",
                  f"{row['e2e_speedup']:.2f}x")
    Console().print(t)
    print("pass = publish in stage 1 + retrieve in stage 2; e2e = request latency through both stages;")
    print("x = Redis time / gfaas time. Both transports produced identical outputs.")
    return 0
