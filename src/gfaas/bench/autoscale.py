"""``gfaas bench autoscale``: bursty arrivals against the real runtime under three scaling policies.

The arrivals are the bundled lambda-scale burst rates (1,007 per-second rates, ``gfaas.sim.bundled``)
squeezed into ``duration_s`` and scaled so the busiest second offers ``peak_rps``; the arrivals in
each step are Poisson (seeded), so every policy sees the same request times. One function,
``gfaas.bench.autoscale_handlers:hold``, holds each request ``service_ms`` (a sleep: the bench
measures scaling, not the two cores' arithmetic) on a worker that serves one request at a time.

Policies (each on a fresh runtime, ``max`` workers the same):

* ``always-warm``: ``min = max``, every worker started at deploy and kept;
* ``fixed:<minutes>``: scale with the concurrency scaler, keep the last worker that long;
* ``gfaas``: scale with the scaler, the ``gfaas`` keep-alive policy.

The scaler aims at 0.7 requests in flight per worker (Knative's default target utilisation of 70%),
a 60-second stable and 6-second panic window, sampling every 0.5 s.

Each row gives requests, dropped (refused or failed), p50/p99 of the runtime's own end-to-end time
per request, cold starts and worker-seconds over the replay. ``sim`` replays the same arrivals under
``gfaas`` in :func:`gfaas.sim.autoscale.replay`, with the start and service times measured in the
``always-warm`` run of the same process (its start time, and its requests' own times in arrival
order), so its cold-start count can be compared with ``real``'s.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ConfigError, Overloaded
from ..policy.autoscale import ScalingSpec

log = logging.getLogger("gfaas.bench")

__all__ = ["burst_arrivals", "run"]

SPEC = """
name: bench-autoscale
inputs: {{x: {{dtype: float32, shape: [-1]}}}}
outputs: {{y: f.y}}
functions:
  - {{name: f, kind: cpu, handler: "gfaas.bench.autoscale_handlers:hold", params: {{seconds: {seconds}}},
     inputs: {{x: input.x}}, outputs: {{y: null}},
     scaling: {{min: {min}, max: {max}, keep_alive: "{keep}", stable_window_s: {stable}, panic_window_s: {panic},
               target_concurrency: {tc}}},
     resources: {{cpus: 0.1, memory: 64MiB}}}}
"""


START_SPEC = """
name: {name}
inputs: {{x: {{dtype: float32, shape: [-1]}}}}
outputs: {{y: f.y}}
functions:
  - {{name: f, kind: cpu, handler: "gfaas.bench.autoscale_handlers:hold", params: {{seconds: 0}}, {model}
     inputs: {{x: input.x}}, outputs: {{y: null}}, scaling: {{min: 1, max: 1}}}}
"""
START_MODEL = "efficientnet_b0"  # a zoo model (small scale), mapped from the node's shared weight store


def worker_starts(n: int = 12, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Worker start, request to ready, one at a time: ``n`` deploys of a one-worker workflow with no model
    and ``n`` with a zoo model whose weights are in the node's shared store (``dedup="shared"``; the
    first deploy put them there). Each workflow is a tenant of its own (its own uid when sandboxed).
    The first start of each runtime also starts the fork server's template: it is reported apart
    (``first_ms``) and left out of the medians."""
    from ..runtime.local import LocalRuntime, RuntimeConfig
    from ..runtime.pool import start_phase_p50

    say = say or (lambda m: None)
    out: dict[str, Any] = {"starts": n, "model": START_MODEL}
    for kind, model, dedup in (("no_model", "", "off"), ("zoo_model", f"model: {START_MODEL},", "shared")):
        phases: list[dict[str, float]] = []
        with LocalRuntime(RuntimeConfig(queue_hints=False, dedup=dedup)) as rt:  # type: ignore[arg-type]
            for k in range(n + 1):
                name = f"start-{k}"
                rt.deploy(START_SPEC.format(name=name, model=model))
                pool = next(p for key, p in rt.deployments.pools.items() if key.startswith(name + "/"))
                res = rt.invoke(name, {"x": np.zeros(4, np.float32)}, timeout=120)  # served: its worker is up
                if not res.ok:
                    raise ConfigError(f"the worker-start workflow failed: {res.error}")
                phases.extend(pool.start_phases)
                rt.undeploy(name)
        first, rest = phases[0], phases[1:]
        p50 = start_phase_p50(rest)
        out[f"{kind}_p50"] = p50.get("ready")
        out[f"{kind}_phases_p50"] = p50
        out[f"{kind}_first_ms"] = round(first["ready"] * 1e3, 2)
        say(f"  worker start, {kind.replace('_', ' ')}: p50 {p50.get('ready')} ms ({p50}); the first, with the "
            f"template: {out[f'{kind}_first_ms']} ms")
    return out


def burst_from_zero(n: int = 8, service_s: float = 0.1, tick_s: float = 0.5,
                    say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """A 0-to-``n`` burst: ``n`` requests at once at a function with no worker (``gfaas`` policy, its
    template up, as on a node that has served anything), then the same burst again once its workers
    are warm. The first request's latency against the warm burst's first (target: at most 50 ms more)."""
    from ..runtime.local import LocalRuntime, RuntimeConfig

    say = say or (lambda m: None)
    spec = SPEC.format(seconds=service_s, min=0, max=n, keep="gfaas", stable=60.0, panic=6.0, tc=0.7)
    x = np.zeros(4, np.float32)
    with LocalRuntime(RuntimeConfig(queue_hints=False, scale_tick_s=tick_s, prewarm=False)) as rt:
        rt.deploy(spec)
        rt.deployments.templates_ready(120.0)
        pool = rt.deployments.pools["bench-autoscale/f"]
        rounds = []
        for _ in range(2):
            ids = [rt.submit("bench-autoscale", {"x": x}) for _ in range(n)]
            res = [rt.result(i, timeout=120) for i in ids]
            if not all(r.ok for r in res):
                raise ConfigError(f"the burst failed: {[r.error for r in res if not r.ok][:1]}")
            rounds.append([r.breakdown.total_s * 1e3 for r in res])
        starts = pool.counts()["starts"]
    first, warm = rounds[0][0], rounds[1][0]
    out = {"requests": n, "first_ms": round(first, 2), "warm_first_ms": round(warm, 2),
           "first_over_warm_ms": round(first - warm, 2), "burst_p50_ms": round(float(np.median(rounds[0])), 2),
           "warm_burst_p50_ms": round(float(np.median(rounds[1])), 2), "starts": starts}
    say(f"  0-to-{n} burst: the first request {out['first_ms']} ms, warm {out['warm_first_ms']} ms "
        f"(+{out['first_over_warm_ms']} ms; target +50 ms); {starts} workers started")
    return out


def burst_arrivals(duration_s: float, peak_rps: float, seed: int = 0) -> np.ndarray:
    """Request times (seconds, sorted) following the bundled burst rates squeezed into ``duration_s``."""
    from ..sim.bundled import trace_path

    if not duration_s > 0 or not peak_rps > 0:
        raise ConfigError(f"duration_s={duration_s} and peak_rps={peak_rps} must be > 0")
    rates = np.loadtxt(trace_path("lambdascale-burst"), dtype=float)
    step = duration_s / len(rates)
    lam = rates / rates.max() * peak_rps * step  # expected requests per step
    rng = np.random.default_rng(seed)
    counts = rng.poisson(lam)
    times = np.concatenate([k * step + np.sort(rng.uniform(0, step, n)) for k, n in enumerate(counts)])
    return np.sort(times)


def _replay_real(policy: str, scaling: dict[str, Any], arrivals: np.ndarray, service_s: float, tick_s: float,
                 say: Callable[[str], None]) -> dict[str, Any]:
    from ..runtime.local import LocalRuntime, RuntimeConfig

    spec = SPEC.format(seconds=service_s, **scaling)
    cfg = RuntimeConfig(queue_hints=False, scale_tick_s=tick_s, max_queue=100_000)
    with LocalRuntime(cfg) as rt:
        rt.deploy(spec)
        pool = rt.deployments.pools["bench-autoscale/f"]
        before = pool.counts()
        x = np.zeros(4, np.float32)
        ids: list[str] = []
        dropped = 0
        t0 = time.monotonic()
        for k, t in enumerate(arrivals):
            delay = t0 + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                ids.append(rt.submit("bench-autoscale", {"x": x}))
            except Overloaded:
                dropped += 1
            if k % 500 == 0:
                c = pool.counts()
                say(f"  {policy}: {k}/{len(arrivals)} requests, {c['warm']} warm, {c['starting']} starting")
        results = [rt.result(i, timeout=300) for i in ids]
        elapsed = time.monotonic() - t0
        after = pool.counts()
    failed = sum(1 for r in results if not r.ok)
    lat = np.array([r.breakdown.total_s for r in results if r.ok]) * 1e3
    return {"policy": policy, "requests": len(arrivals), "dropped": dropped + failed,
            "p50_ms": round(float(np.percentile(lat, 50)), 2), "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "cold_starts": after["cold_starts"] - before["cold_starts"],
            "worker_seconds": round(after["worker_seconds"] - before["worker_seconds"], 2),
            "starts": after["starts"] - before["starts"], "elapsed_s": round(elapsed, 2),
            "start_s_p50": after["start_s_p50"], "median_latency_s": float(np.median(lat)) / 1e3,
            "latencies_s": [float(x) / 1e3 for x in lat]}


def _policies_once(arrivals: np.ndarray, plans: list[tuple[str, dict[str, Any]]], common: dict[str, Any],
                   service_s: float, tick_s: float, gspec: ScalingSpec, say: Callable[[str], None]) -> dict[str, Any]:
    """One run of the three policies on ``arrivals`` and the simulator's replay of the ``gfaas`` one."""
    from ..sim.autoscale import replay

    rows = []
    for name, p in plans:
        say(f"- {name}")
        rows.append(_replay_real(name, {**common, **p}, arrivals, service_s, tick_s, say))
    warm, real = rows[0], rows[2]
    # The replay's worker start is the median of the gfaas run's own starts (its cold starts waited
    # for those; the mean would count the run's first start, the template's, which the replay's
    # pre-warmed worker does not make), and its requests take the always-warm run's own times in
    # arrival order: with every request at the median, it misses the moments of queueing that fire
    # the real scaler's panic mode.
    start_s = float(real["start_s_p50"] or warm["start_s_p50"] or 0.5)
    svc = float(warm["median_latency_s"])
    sim = replay(arrivals.tolist(), gspec, service_s=warm["latencies_s"] or [svc], start_s=start_s, tick_s=tick_s,
                 end_s=float(real["elapsed_s"]))
    ratio = real["p99_ms"] / warm["p99_ms"] if warm["p99_ms"] else float("inf")
    ws = real["worker_seconds"] / warm["worker_seconds"] if warm["worker_seconds"] else float("inf")
    sim_err = (sim.cold_starts - real["cold_starts"]) / real["cold_starts"] if real["cold_starts"] else None
    return {"policies": [{k: r[k] for k in ("policy", "requests", "dropped", "p50_ms", "p99_ms", "cold_starts",
                                            "worker_seconds", "starts", "elapsed_s")} for r in rows],
            "sim": {**sim.as_dict(), "start_s": round(start_s, 4), "service_s": round(svc, 4)},
            "real": {"cold_starts": real["cold_starts"]},
            "checks": {"gfaas_p99_over_always_warm": round(ratio, 3),
                       "gfaas_worker_seconds_over_always_warm": round(ws, 3),
                       "sim_cold_starts_error": None if sim_err is None else round(sim_err, 3),
                       "dropped": sum(r["dropped"] for r in rows)}}


def run(*, duration_s: float = 90.0, target_concurrency: float = 0.7, peak_rps: float = 40.0, service_ms: float = 100.0,
        max_workers: int = 8, fixed: str = "fixed:1", seed: int = 0, tick_s: float = 0.5, stable_window_s: float = 60.0,
        panic_window_s: float = 6.0, runs: int = 1, starts: int = 12,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The worker starts, the burst from zero, then ``runs`` runs of the three policies with the
    simulator's replay; the document ``gfaas bench autoscale`` prints (``checks``: the means of the runs)."""
    say = progress or (lambda m: print(m, file=sys.stderr, flush=True))
    if not fixed.startswith("fixed:"):
        raise ConfigError(f"fixed={fixed!r}: give a fixed keep-alive such as fixed:1")
    if not (isinstance(runs, int) and runs >= 1):
        raise ConfigError(f"runs={runs!r}: give how many times to run the three policies (>= 1)")
    arrivals = burst_arrivals(duration_s, peak_rps, seed)
    service_s = service_ms / 1e3
    common = {"max": max_workers, "stable": stable_window_s, "panic": panic_window_s, "tc": target_concurrency}
    plans = [("always-warm", {"min": max_workers, "keep": "gfaas"}), (fixed, {"min": 0, "keep": fixed}),
             ("gfaas", {"min": 0, "keep": "gfaas"})]
    gspec = ScalingSpec(max=max_workers, keep_alive="gfaas", stable_window_s=stable_window_s,
                        panic_window_s=panic_window_s, target_concurrency=target_concurrency)
    say(f"bench autoscale: {len(arrivals)} requests over {duration_s:g} s (peak {peak_rps:g}/s), "
        f"{service_ms:g} ms each, up to {max_workers} workers, {runs} run(s)")
    say("- worker starts, one at a time")
    ws = worker_starts(starts, say=say)
    say("- a burst at zero workers")
    zero = burst_from_zero(max_workers, service_s, tick_s, say)
    done = []
    for k in range(runs):
        if runs > 1:
            say(f"run {k + 1} of {runs}")
        done.append(_policies_once(arrivals, plans, common, service_s, tick_s, gspec, say))

    def mean(key: str) -> float | None:
        vals = [r["checks"][key] for r in done if r["checks"][key] is not None]
        return round(float(np.mean(vals)), 3) if vals else None

    first = done[0]
    return {"policies": first["policies"], "sim": first["sim"], "real": first["real"],
            "runs": [{"policies": r["policies"], "sim": r["sim"], "checks": r["checks"]} for r in done],
            "worker_start_ms": ws, "burst_from_zero": zero,
            "checks": {"gfaas_p99_over_always_warm": mean("gfaas_p99_over_always_warm"),
                       "gfaas_worker_seconds_over_always_warm": mean("gfaas_worker_seconds_over_always_warm"),
                       "sim_cold_starts_error": mean("sim_cold_starts_error"),
                       "worker_start_no_model_p50_ms": ws["no_model_p50"],
                       "worker_start_zoo_model_p50_ms": ws["zoo_model_p50"],
                       "burst_first_over_warm_ms": zero["first_over_warm_ms"],
                       "dropped": sum(r["checks"]["dropped"] for r in done)},
            "targets": {"gfaas_p99_over_always_warm": 1.5, "gfaas_worker_seconds_over_always_warm": 0.5,
                        "sim_cold_starts_error": 0.2, "worker_start_no_model_p50_ms": 20.0,
                        "worker_start_zoo_model_p50_ms": 50.0, "burst_first_over_warm_ms": 50.0},
            "workload": {"trace": "lambdascale-burst", "duration_s": duration_s, "peak_rps": peak_rps,
                         "service_ms": service_ms, "max_workers": max_workers, "seed": seed, "tick_s": tick_s,
                         "target_concurrency": target_concurrency, "stable_window_s": stable_window_s,
                         "panic_window_s": panic_window_s, "runs": runs, "worker_starts": starts,
                         "requests": int(len(arrivals))}}


def main(a: Any) -> int:
    """The CLI entry (``gfaas bench autoscale``)."""
    import json

    from ..provenance import provenance

    kw: dict[str, Any] = {"duration_s": 20.0, "peak_rps": 30.0, "stable_window_s": 10.0} if a.quick else {}
    if getattr(a, "duration", None):
        kw["duration_s"] = float(a.duration)
    if getattr(a, "runs", None):
        kw["runs"] = int(a.runs)
    res = run(**kw)
    res["provenance"] = provenance()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{'policy':12s} {'requests':>8} {'dropped':>7} {'p50 ms':>8} {'p99 ms':>8} {'cold':>5} {'worker-s':>9}")
    for r in res["policies"]:
        print(f"{r['policy']:12s} {r['requests']:>8} {r['dropped']:>7} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
              f"{r['cold_starts']:>5} {r['worker_seconds']:>9.1f}")
    c = res["checks"]
    if len(res["runs"]) > 1:
        print(f"(the table: run 1 of {len(res['runs'])}; the ratios below: the mean of the runs)")
    ws = res["worker_start_ms"]
    print(f"worker start, request to ready, p50: {ws['no_model_p50']} ms without a model, {ws['zoo_model_p50']} ms "
          f"with {ws['model']} from the shared store (targets 20 and 50 ms)")
    print(f"gfaas p99 / always-warm p99 = {c['gfaas_p99_over_always_warm']}; worker-seconds ratio = "
          f"{c['gfaas_worker_seconds_over_always_warm']}; sim cold starts {res['sim']['cold_starts']} vs real "
          f"{res['real']['cold_starts']}")
    return 0
