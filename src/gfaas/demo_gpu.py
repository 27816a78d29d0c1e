"""``gfaas demo --gpu``: the six reference workflows with their GPU functions on a GPU, three ways.

1. ``gfaas-device``: the gfaas data plane with device passing: GPU functions read their inputs on
   their GPU (the node delivers host objects there through its pinned ring, GPU objects by CUDA IPC)
   and leave model outputs in the node's GPU pool;
2. ``redis``: the host-centric baseline on the same warm workers: every intermediate is serialised
   into Redis and each GPU function copies what it reads to its GPU itself;
3. ``gfaas-host``: the gfaas data plane, but every object through host memory (a second runtime
   with ``gpu_passing="host"``): what device passing adds over gfaas's own host path.

Requests run one at a time (no queueing), alternating between the first two modes, so the machine's
state is the same for both; the third follows on its own runtime. Every mode must give the same
outputs. Per workflow it reports data passing (request inputs in, intermediates, results out),
end-to-end P50/P99 and compute, and the Redis/device and host/device ratios of data passing.

It runs without the CLI's extras (no gateway, no rich): ``python -m gfaas.demo_gpu`` works where only
the GPU tier's packages are, which is how ``make demo-gpu`` runs it on the GPU machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from typing import Any

import numpy as np

from .provenance import provenance

MODES = ("gfaas-device", "redis", "gfaas-host")
TARGET_WORKFLOWS = ("video", "driving")  # issue 18: data passing >= 10x cheaper than Redis for these
TARGET_RATIO = 10.0


def gpu_name() -> str | None:
    """The first CUDA GPU's name as torch reports it; None without torch or a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_name(0))


def summarize(results: dict[str, dict[str, list[Any]]]) -> dict[str, dict[str, dict[str, float]]]:
    """``mode -> workflow -> row`` from ``mode -> workflow -> [InvocationResult]``."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for mode, by_wf in results.items():
        out[mode] = {}
        for wf, rs in by_wf.items():
            ok = [r for r in rs if r.ok]
            b = [r.breakdown for r in ok]
            total = np.array([x.total_s for x in b]) if b else np.zeros(1)
            row = {"requests": float(len(rs)), "failed": float(len(rs) - len(ok)),
                   "p50_ms": float(np.percentile(total, 50)) * 1e3, "p99_ms": float(np.percentile(total, 99)) * 1e3,
                   "host_pass_ms": float(np.mean([x.host_pass_s for x in b] or [0])) * 1e3,
                   "fn_pass_ms": float(np.mean([x.fn_pass_s for x in b] or [0])) * 1e3,
                   "compute_ms": float(np.mean([x.compute_s for x in b] or [0])) * 1e3}
            row["pass_ms"] = row["host_pass_ms"] + row["fn_pass_ms"]
            out[mode][wf] = row
    return out


def ratios(stats: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per workflow: data passing of Redis and of gfaas host-only over gfaas device passing."""
    dev = stats["gfaas-device"]
    return {wf: {"redis_over_device": stats["redis"][wf]["pass_ms"] / max(row["pass_ms"], 1e-9),
                 "host_over_device": stats["gfaas-host"][wf]["pass_ms"] / max(row["pass_ms"], 1e-9)}
            for wf, row in dev.items()}


def compare_outputs(results: dict[str, dict[str, list[Any]]]) -> tuple[bool, bool, list[str]]:
    """``(identical, close, problems)``: every request of a workflow (same inputs) in every mode must
    have the outputs of the first device-passing request; ``close`` allows float rounding (1e-5)."""
    identical, close, problems = True, True, []
    for wf, first_rs in results["gfaas-device"].items():
        ref = next((r for r in first_rs if r.ok), None)
        if ref is None:
            problems.append(f"{wf}: no device-passing request succeeded")
            identical = close = False
            continue
        for mode, by_wf in results.items():
            for k, r in enumerate(by_wf.get(wf, [])):
                if not r.ok:
                    problems.append(f"{wf} request {k} via {mode} failed: {r.error}")
                    identical = close = False
                    continue
                for name, want in ref.outputs.items():
                    got, want = np.asarray(r.outputs[name]), np.asarray(want)
                    if got.dtype != want.dtype or got.shape != want.shape:
                        problems.append(f"{wf}.{name} via {mode}: {got.dtype}{list(got.shape)} vs "
                                        f"{want.dtype}{list(want.shape)}")
                        identical = close = False
                    elif not np.array_equal(got, want):
                        identical = False
                        if want.dtype.kind not in "fc" or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
                            close = False
                            problems.append(f"{wf}.{name} via {mode} differs from gfaas-device")
    return identical, close, problems


def _run_mode(rt: Any, names: list[str], requests: int, transports: tuple[str, ...], scale: str,
              say: Any) -> dict[str, dict[str, list[Any]]]:
    """``requests`` invocations per workflow and transport, one at a time, transports alternating;
    one warm-up per workflow and transport first (not counted)."""
    from . import workflows

    inputs = functools.lru_cache(maxsize=None)(workflows.make_inputs)
    out: dict[str, dict[str, list[Any]]] = {t: {} for t in transports}
    for wf in names:
        for t in transports:
            warm = rt.invoke(wf, inputs(wf, 0, scale), timeout=600, transport=t)
            if not warm.ok:
                raise RuntimeError(f"warm-up of {wf} via {t} failed: {warm.error}")
        for _ in range(requests):
            for t in transports:
                out[t].setdefault(wf, []).append(rt.invoke(wf, inputs(wf, 0, scale), timeout=600, transport=t))
        say(f"  {wf:8s} " + "  ".join(
            f"{t}: {np.mean([r.breakdown.host_pass_s + r.breakdown.fn_pass_s for r in out[t][wf]]) * 1e3:.2f} ms"
            for t in transports) + " data passing per request")
    return out


def run(a: argparse.Namespace) -> int:
    from . import workflows
    from .runtime.gpus import visible_cuda_gpus
    from .runtime.local import LocalRuntime, RuntimeConfig
    from .workflows.measured import edges

    def say(msg: str) -> None:
        if not a.json:
            print(msg, file=sys.stderr, flush=True)

    name = gpu_name()
    if visible_cuda_gpus() == 0 or name is None:
        print("gfaas: error: gfaas demo --gpu needs a CUDA GPU visible to both CuPy (the node's GPU pools) and "
              "torch (the functions' models); none is here. On a CPU-only machine run `gfaas demo`.", file=sys.stderr)
        return 2
    names = [n.strip() for n in a.workflows.split(",")] if a.workflows else workflows.names()
    t_start = time.perf_counter()
    base = {"scale": a.scale, "threads_per_worker": 1, "node_capacity_bytes": 8 << 30, "keep_alive_s": 3600,
            "gpus": a.gpus}
    results: dict[str, dict[str, list[Any]]] = {}
    stats_nodes: dict[str, dict[str, int]] = {}
    for passing, transports in (("device", ("gfaas", "redis")), ("host", ("gfaas",))):
        say(f"runtime with gpu_passing={passing!r} on {name}: starting workers for {len(names)} workflows ...")
        with LocalRuntime(RuntimeConfig(**base, gpu_passing=passing), edge_sizes=edges) as rt:  # type: ignore[arg-type]
            for wf in names:
                rt.deploy(workflows.spec_text(wf))
            say(f"  placed: {{{', '.join(f'{wf}: {rt.placement(wf)}' for wf in names)}}}")
            got = _run_mode(rt, names, a.requests, transports, a.scale, say)
            first = next(iter(rt.node_stats().values()))
            stats_nodes[passing] = {k: int(v) for k, v in first.items()
                                    if k.startswith(("device", "deliveries", "bytes_delivered", "bytes_host_"))}
        for t, by_wf in got.items():
            results["gfaas-device" if (t, passing) == ("gfaas", "device") else
                    "redis" if t == "redis" else "gfaas-host"] = by_wf
    stats = summarize(results)
    ratio = ratios(stats)
    identical, close, problems = compare_outputs(results)
    met = {wf: ratio[wf]["redis_over_device"] >= TARGET_RATIO for wf in TARGET_WORKFLOWS if wf in ratio}
    doc = {"device": name, "gpus": visible_cuda_gpus(), "scale": a.scale, "requests_per_workflow": a.requests,
           "workflows": names, "modes": list(MODES), "stats": stats, "ratios": ratio,
           "target": {"workflows": list(TARGET_WORKFLOWS), "redis_over_device_min": TARGET_RATIO, "met": met},
           "outputs_identical": identical, "outputs_close": close, "problems": problems[:20],
           "node_counters": stats_nodes, "wall_s": time.perf_counter() - t_start, "provenance": provenance()}
    os.makedirs(a.out, exist_ok=True)
    paths = [os.path.join(a.out, "results.json")] + ([a.results] if a.results else [])
    for path in paths:
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        print(table(doc))
        print(f"results: {', '.join(paths)}; {doc['wall_s']:.0f} s in all")
    if not close:
        print("gfaas: error: the modes disagree: " + "; ".join(problems[:5]), file=sys.stderr)
        return 1
    return 0


def table(doc: dict[str, Any]) -> str:
    """The per-workflow comparison as plain text (data passing and P50 in ms, per mode)."""
    s = doc["stats"]
    lines = [f"{doc['requests_per_workflow']} requests per workflow and mode on {doc['device']} (scale {doc['scale']}); "
             "ms per request",
             f"{'workflow':9s} {'data passing: device / redis / host':>38s} {'redis/dev':>9s} {'host/dev':>8s} "
             f"{'P50 device / redis / host':>27s} {'compute':>8s}"]
    for wf in doc["workflows"]:
        d, r, h = (s[m][wf] for m in MODES)
        q = doc["ratios"][wf]
        lines.append(f"{wf:9s} {d['pass_ms']:12.2f} / {r['pass_ms']:9.2f} / {h['pass_ms']:9.2f} "
                     f"{q['redis_over_device']:8.1f}x {q['host_over_device']:7.1f}x "
                     f"{d['p50_ms']:9.1f} / {r['p50_ms']:6.1f} / {h['p50_ms']:6.1f} {d['compute_ms']:8.1f}")
    same = "identical" if doc["outputs_identical"] else "equal within 1e-5" if doc["outputs_close"] else "DIFFERENT"
    lines.append(f"outputs across the three modes: {same}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scale", choices=["small", "full"], default="full")
    p.add_argument("--requests", type=int, default=5, help="measured requests per workflow and mode (default 5)")
    p.add_argument("--workflows", help="comma-separated subset (default: all six)")
    p.add_argument("--gpus", default="auto", help="the node's GPUs: auto (every CUDA GPU), cuda, cuda:0,1")
    p.add_argument("--out", default="out/demo-gpu", help="directory for results.json")
    p.add_argument("--results", default="", help="also write the results here (e.g. benchmarks/results/demo-gpu.json)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON document")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gfaas.demo_gpu", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    a = p.parse_args(argv)
    if a.requests < 1:
        p.error(f"--requests {a.requests}: give at least 1")
    return run(a)


if __name__ == "__main__":
    raise SystemExit(main())
