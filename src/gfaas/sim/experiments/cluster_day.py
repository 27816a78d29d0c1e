"""Cluster scale: an hour of bursty Azure-Functions-style arrivals for the six workflows on 1,024 GPUs.

``gfaas sim run cluster-day`` (issue 24, item 5). Not part of ``gfaas sim run all`` (minutes, not
seconds); run and save it on its own, see docs/results/cluster-day.md.

Setup, every choice stated:

* **Cluster**: ``dgx-a100`` x ``nodes`` (default 128: 1,024 A100 GPUs), every GPU holding a replica.
* **Arrivals**: an invocations file in the Azure Functions 2019 format (``HashOwner, HashApp,
  HashFunction, Trigger, 1..N`` per-minute counts). By default :mod:`gfaas.sim.synthetic` writes one
  (bursty on/off model, ``rate`` requests per second on average, ``seed``) to a temporary file; ``trace=PATH``
  replays a real one instead. Either way it is read back by
  :func:`~gfaas.sim.arrivals.load_azure_functions_invocations`. Rows drive workflows by name when
  the file has a row whose ``HashFunction`` is each workflow's name (the synthetic file does);
  otherwise its six busiest functions over the first ``minutes`` drive the workflows in
  ``REFERENCE`` order (traffic the busiest). With ``trace=`` and ``rate=`` both given, every
  minute's count is thinned binomially (seeded) to an expected total of ``rate`` x the run's
  seconds; traces are never inflated.
  Each minute's count is spread uniformly at random within its minute
  (``FunctionTrace.arrivals``, seed ``seed + 1000 + row``). Both systems get the same arrival times.
* **Replicas** (one rule, the same deployment for both systems): a replica takes one GPU per GPU
  function and sits whole on one node, the least-loaded node with room (``layout="pack"``,
  :func:`gfaas.policy.place_replicas`). One replica per workflow (larger first), then one replica at
  a time to the workflow whose replicas fall furthest short of its share of the GPUs, the share
  being proportional to its mean GPU work (mean rate x the A100 compute time of all its GPU
  functions, as if every conditional branch ran), until the GPUs are spent: those are the targets.
  They are placed largest replicas first; a replica no node has room for is dropped, and the GPUs
  left are filled the same furthest-short way with replicas that still fit whole on a node. So no
  GPU is shared, and with one-GPU workflows in the mix every GPU holds a replica. Requests go round-robin over a workflow's replicas. With
  ``util=U`` (0 < U <= 1) the replicas fill only ``ceil(total mean GPU work / U)`` GPUs (at most the
  cluster's), so that the allocated GPUs' mean compute utilisation is about U: the default fills the
  cluster, which at this request budget leaves it lightly loaded (see docs/results/cluster-day.md).
* **Systems**: ``gfaas`` and ``infless+`` (host-centric data passing), :mod:`gfaas.sim.systems`.

Measures, per system and per workflow (``all``: every request):

* ``p50_ms`` / ``p99_ms``: end-to-end latency (arrival to the last function's end);
* ``passing_ms``: mean data-passing time per request, ``RequestRecord.passing_s`` (the get + put
  time of each of its GPU functions, summed);
* ``passing_pct``: the data-passing share, ``100 * sum(get + put) / sum(get + compute + put)`` over
  every GPU execution: the part of the GPUs' busy time spent moving data. Not passing time over
  end-to-end latency: parallel branches (image's three classifiers, video's four detectors) each
  pass data at the same time, so that ratio exceeds 100% on fan-outs and means nothing there;
* ``gpu_busy_h``: GPU-hours busy, the sum over GPU executions of get + compute + put (a GPU runs one
  execution at a time and holds it through its I/O; queueing is not busy time);
* ``gpu_alloc_h``: GPU-hours allocated, the GPUs holding the workflow's replicas (all: every GPU
  holding one) x the run's span (the trace's minutes, or until the last request ends if later).
  Busy <= allocated by construction.

The wall time of each system's run (``time.perf_counter``, from building its cluster to the last
event) is in ``data``, with the part spent building and deploying the cluster (``build_s``: the
first cluster on a topology also plans its routes).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError
from ...policy import place_replicas
from ...topology import Topology, preset
from ..arrivals import FunctionTrace, load_azure_functions_invocations
from ..cluster import Cluster, RequestRecord
from ..profiles import Profile
from ..synthetic import WORKFLOW_SHARES, synthetic_azure_trace
from ..systems import system
from ..workflows import REFERENCE, workflow
from .base import Progress, Result, int_param, register

MACHINE = "dgx-a100"
SYSTEMS = ("gfaas", "infless+")
#: The full run: 128 nodes, one hour, 300,000 requests expected (83.3/s on average; both systems get
#: the same). Measured at 128 nodes on a 2-core machine: ~0.96 ms of wall time per simulated request
#: for gfaas and ~0.60 ms for infless+, so 300,000 x 1.56 ms = ~8 minutes on one core.
FULL = {"nodes": 128, "minutes": 60, "rate": 300_000 / 3600}
#: ``--quick``: 4 nodes (32 GPUs), 2 minutes at 10 requests/s (1,200 expected): a few seconds.
QUICK = {"nodes": 4, "minutes": 2, "rate": 10.0}
PARAMS = ("nodes", "minutes", "rate", "seed", "trace", "util")


@dataclass(frozen=True)
class Setup:
    """The experiment's parameters, validated (``gfaas sim run cluster-day --set KEY=VALUE``)."""

    nodes: int
    minutes: int
    rate: float | None  # mean requests/s over all workflows; None: replay ``trace`` as it is
    seed: int = 0
    trace: str | None = None  # None: the synthetic trace of gfaas.sim.synthetic
    util: float | None = None  # None: replicas fill the cluster

    @classmethod
    def parse(cls, quick: bool, params: Mapping[str, str]) -> Setup:
        base = QUICK if quick else FULL
        trace = params.get("trace") or None
        nodes = int_param(params, "nodes", int(base["nodes"]))
        minutes = int_param(params, "minutes", int(base["minutes"]))
        seed = int_param(params, "seed", 0, low=0)
        rate: float | None = base["rate"] if trace is None else None
        if params.get("rate"):
            try:
                rate = float(params["rate"])
            except ValueError:
                rate = math.nan
            if not (math.isfinite(rate) and rate > 0):
                raise ConfigError(f"rate={params['rate']!r}: give the mean number of requests per second over "
                                  "all workflows, a number > 0")
        util: float | None = None
        if params.get("util"):
            try:
                util = float(params["util"])
            except ValueError:
                util = math.nan
            if not 0.0 < util <= 1.0:
                raise ConfigError(f"util={params['util']!r}: give the target mean GPU utilisation, a number in "
                                  "(0, 1], or leave it unset to fill the cluster")
        if trace is not None and not Path(trace).is_file():
            raise ConfigError(f"trace={trace!r} is not a file; give the path of an Azure Functions 2019 "
                              "invocations CSV (HashOwner,HashApp,HashFunction,Trigger,1,2,...)")
        return cls(nodes, minutes, rate, seed, trace, util)

    @property
    def requests(self) -> float | None:
        """The expected number of requests of the run (None: whatever the trace holds)."""
        return None if self.rate is None else self.rate * 60.0 * self.minutes


# ---- arrivals -----------------------------------------------------------------------------------
def workflow_rows(fns: list[FunctionTrace], minutes: int) -> dict[str, FunctionTrace]:
    """Which trace row drives which workflow (the rule in the module docstring)."""
    short = [f for f in fns if f.minutes < minutes]
    if short:
        raise ConfigError(f"the trace has {short[0].minutes} minutes, fewer than minutes={minutes}; "
                          "ask for fewer minutes")
    by_name = {f.function: f for f in fns}
    if all(n in by_name for n in REFERENCE):
        return {n: by_name[n] for n in REFERENCE}
    if len(fns) < len(REFERENCE):
        raise ConfigError(f"the trace has {len(fns)} functions; the {len(REFERENCE)} workflows need "
                          f"{len(REFERENCE)} rows (or rows named {', '.join(REFERENCE)})")
    busiest = sorted(fns, key=lambda f: (-int(f.counts[:minutes].sum()), f.function))
    return dict(zip(REFERENCE, busiest, strict=False))


def thin(rows: Mapping[str, FunctionTrace], minutes: int, requests: float, seed: int) -> dict[str, FunctionTrace]:
    """Every minute's count thinned binomially so that the expected total is ``requests`` (``rate`` x seconds)."""
    total = sum(int(f.counts[:minutes].sum()) for f in rows.values())
    if total == 0:
        raise ConfigError(f"the trace's rows hold no invocation in the first {minutes} minutes")
    if requests > total:
        raise ConfigError(f"{requests:g} requests exceed the {total} invocations of the trace's rows in "
                          f"its first {minutes} minutes; traces are thinned, never inflated: lower rate or leave it "
                          "unset to replay it as is")
    rng = np.random.default_rng(seed)
    p = requests / total
    return {n: FunctionTrace(f.owner, f.app, f.function, f.trigger, rng.binomial(f.counts[:minutes], p))
            for n, f in rows.items()}


def arrivals(setup: Setup, trace_path: str) -> dict[str, np.ndarray]:
    """Arrival times (s) per workflow from an invocations file, as the module docstring says."""
    rows = workflow_rows(load_azure_functions_invocations(trace_path), setup.minutes)
    if setup.trace is not None and setup.requests is not None:
        rows = thin(rows, setup.minutes, setup.requests, setup.seed)
    return {n: f.arrivals(setup.seed + 1000 + i, setup.minutes) for i, (n, f) in enumerate(rows.items())}


# ---- deployment ---------------------------------------------------------------------------------
def gpu_work_s(name: str, gpu_model: str, profile: Profile | None = None) -> float:
    """Compute seconds of one request of ``name`` on ``gpu_model`` if every GPU function runs."""
    prof = profile or Profile()
    wf = workflow(name)
    return sum(prof.seconds(wf.function(f).model, gpu_model, wf.function(f).batch) for f in wf.gpu_functions)


def replica_plan(rates: Mapping[str, float], slots: Mapping[int, int], gpu_model: str,
                 budget: int | None = None) -> list[tuple[str, int]]:
    """(workflow, node) per replica, in deployment order (the rule of the module docstring).

    ``slots``: node -> GPUs; ``budget``: GPUs to fill (default all). A replica is added only where
    one fits whole on a node, the node :func:`gfaas.policy.place_replicas` picks (``pack``), so that
    no GPU is shared.
    """
    size = {n: len(workflow(n).gpu_functions) for n in rates}
    gpus = sum(slots.values()) if budget is None else budget
    if sum(size.values()) > gpus or sum(size.values()) > sum(slots.values()):
        raise ConfigError(f"{gpus} GPUs cannot hold one replica of each workflow ({sum(size.values())} GPUs); "
                          "give more nodes")
    work = {n: rates[n] * gpu_work_s(n, gpu_model) for n in rates}
    total = sum(work.values())
    # ideal replicas: the workflow's share of the GPUs, in replicas of its size
    ideal = {n: (gpus * work[n] / total / size[n]) if total > 0 else 0.0 for n in rates}
    taken = dict.fromkeys(slots, 0)
    order = sorted(rates, key=lambda n: -size[n])  # the first round: larger replicas first
    plan: list[tuple[str, int]] = []
    count = dict.fromkeys(rates, 0)
    left = gpus

    def place(n: str) -> bool:
        nonlocal left
        if size[n] > left or max(slots[nd] - taken[nd] for nd in slots) < size[n]:
            return False
        fns = workflow(n).gpu_functions
        node = place_replicas(fns, [], 1, slots, used=taken, layout="pack")[0][fns[0]]
        taken[node] += size[n]
        left -= size[n]
        plan.append((n, node))
        count[n] += 1
        return True

    for n in order:
        if not place(n):
            raise ConfigError(f"no node has {size[n]} free GPUs for one replica of {n!r}; give more nodes")
    # Targets first, ignoring nodes: one replica at a time to the furthest short of its share.
    target = dict(count)
    budget_left = left
    while True:
        fits = [n for n in order if ideal[n] > 0 and size[n] <= budget_left]
        if not fits:
            break
        n = min(fits, key=lambda n: (target[n] / ideal[n], order.index(n)))
        target[n] += 1
        budget_left -= size[n]
    # Then placed largest first (small replicas fill the gaps large ones leave, not the reverse);
    # a replica that no node has room for is dropped and its GPUs go to the fill below.
    for n in order:
        while count[n] < target[n] and place(n):
            pass
    open_ = [n for n in order if ideal[n] > 0]
    while open_:
        n = min(open_, key=lambda n: (count[n] / ideal[n], order.index(n)))
        if not place(n):
            open_.remove(n)
    return plan


def replica_counts(plan: list[tuple[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n, _ in plan:
        out[n] = out.get(n, 0) + 1
    return out


def gpus_to_fill(rates: Mapping[str, float], gpus: int, gpu_model: str, util: float | None) -> int:
    """The cluster's GPUs, or with ``util`` those that keep the mean compute utilisation at ``util``
    (never fewer than one replica of each workflow needs)."""
    if util is None:
        return gpus
    work = sum(rates[n] * gpu_work_s(n, gpu_model) for n in rates)
    least = sum(len(workflow(n).gpu_functions) for n in rates)
    return min(gpus, max(least, math.ceil(work / util)))


# ---- one system's run ---------------------------------------------------------------------------
@dataclass
class _Acc:
    latency: list[float] = field(default_factory=list)
    passing_s: float = 0.0
    busy_s: float = 0.0
    last: float = 0.0


def _finished(acc: dict[str, _Acc]) -> Callable[[RequestRecord], None]:
    def done(rec: RequestRecord) -> None:
        a = acc[rec.workflow]
        a.latency.append(rec.latency)
        a.passing_s += rec.passing_s
        a.busy_s += sum(s.get_s + s.compute_s + s.put_s for s in rec.fns.values())
        a.last = max(a.last, rec.finish)

    return done


def simulate(topo: Topology, name: str, plan: list[tuple[str, int]], times: Mapping[str, np.ndarray],
             minutes: int, seed: int, tick: Callable[[int], None]) -> tuple[dict[str, _Acc], dict[str, int], float, float]:
    """Run one system minute by minute; (per-workflow sums, GPUs per workflow, wall seconds in all,
    of which building and deploying the cluster)."""
    t0 = time.perf_counter()
    c = Cluster(topo, system(name), seed=seed)
    wfs = {n: workflow(n) for n in times}
    for n, node in plan:  # on the node the plan's place_replicas call picked (one node: a fast deploy)
        c.deploy(wfs[n], 1, nodes=[node], layout="pack")
    built = time.perf_counter() - t0
    acc = {n: _Acc() for n in times}
    c.on_finish = _finished(acc)
    edges = 60.0 * np.arange(minutes + 1)
    cuts = {n: np.searchsorted(t, edges) for n, t in times.items()}
    for m in range(minutes):
        for n, t in times.items():
            c.submit_many(n, t[cuts[n][m]:cuts[n][m + 1]])
        c.run(until=float(edges[m + 1]))
        c.records.clear()  # finished requests are summed in acc; running ones live on in their events
        tick(m + 1)
    c.run()
    gpus = {n: len({g for d in c.deployments[n] for g in d.gpu.values()}) for n in wfs}
    gpus["all"] = len({g for ds in c.deployments.values() for d in ds for g in d.gpu.values()})
    return acc, gpus, time.perf_counter() - t0, built


def _row(name: str, wf: str, reps: int, gpus: int, accs: list[_Acc], span_s: float) -> dict[str, Any]:
    lat = np.concatenate([np.asarray(a.latency) for a in accs]) if accs else np.empty(0)
    passing = sum(a.passing_s for a in accs)
    busy = sum(a.busy_s for a in accs)
    nan = float("nan")
    return {"system": name, "workflow": wf, "replicas": reps, "gpus": gpus, "requests": int(lat.size),
            "p50_ms": float(np.percentile(lat, 50)) * 1e3 if lat.size else nan,
            "p99_ms": float(np.percentile(lat, 99)) * 1e3 if lat.size else nan,
            "mean_ms": float(lat.mean()) * 1e3 if lat.size else nan,
            "passing_ms": passing / lat.size * 1e3 if lat.size else nan,
            "passing_pct": 100.0 * passing / busy if busy > 0 else nan,
            "gpu_busy_h": busy / 3600.0,
            "gpu_alloc_h": gpus * span_s / 3600.0}


@register("cluster-day", "An hour of bursty Azure-format arrivals, six workflows on 128 x dgx-a100",
          "no paper figure: the simulator at cluster scale", params=PARAMS, in_all=False)
def cluster_day(quick: bool, progress: Progress, **params: str) -> Result:
    setup = Setup.parse(quick, params)
    topo = preset(MACHINE if setup.nodes == 1 else f"{MACHINE}*{setup.nodes}")
    gpu_model = topo.device(topo.gpus[0]).model
    slots = {nd: len(topo.of_kind("gpu", nd)) for nd in range(setup.nodes)}
    replica_plan(dict.fromkeys(REFERENCE, 0.0), slots, gpu_model)  # room for one of each, before any work
    with tempfile.TemporaryDirectory(prefix="gfaas-cluster-day-") as tmp:
        path = setup.trace
        if path is None:
            assert setup.requests is not None
            path = str(Path(tmp) / "invocations.csv")
            synthetic_azure_trace(path, setup.requests, setup.minutes, setup.seed, WORKFLOW_SHARES)
        times = arrivals(setup, path)
    horizon = 60.0 * setup.minutes
    rates = {n: t.size / horizon for n, t in times.items()}
    plan = replica_plan(rates, slots, gpu_model, gpus_to_fill(rates, len(topo.gpus), gpu_model, setup.util))
    replicas = replica_counts(plan)
    total = setup.minutes * len(SYSTEMS)
    rows: list[dict[str, Any]] = []
    wall: dict[str, float] = {}
    build: dict[str, float] = {}
    for k, name in enumerate(SYSTEMS):
        def tick(m: int, k: int = k, name: str = name) -> None:
            progress(k * setup.minutes + m, total, f"{name}: minute {m}/{setup.minutes}")

        acc, gpus, wall[name], build[name] = simulate(topo, name, plan, times, setup.minutes, setup.seed, tick)
        span = max(horizon, max(a.last for a in acc.values()))
        rows += [_row(name, n, replicas[n], gpus[n], [acc[n]], span) for n in times]
        rows.append(_row(name, "all", sum(replicas.values()), gpus["all"], list(acc.values()), span))
    n_req = sum(int(t.size) for t in times.values())
    data = {"setup": {"machine": MACHINE, "nodes": setup.nodes, "gpus": len(topo.gpus), "minutes": setup.minutes,
                      "rate": setup.rate, "requests_expected": setup.requests, "seed": setup.seed, "util": setup.util,
                      "trace": setup.trace or "synthetic (gfaas.sim.synthetic)"},
            "requests_per_system": n_req,
            "arrivals_per_minute": {n: np.bincount((t // 60).astype(np.int64), minlength=setup.minutes).tolist()
                                    for n, t in times.items()},
            "wall_s": {n: round(w, 3) for n, w in wall.items()},
            "build_s": {n: round(w, 3) for n, w in build.items()},
            "us_per_request": {n: round(w / max(n_req, 1) * 1e6, 1) for n, w in wall.items()}}
    notes = (f"{setup.nodes} x {MACHINE} ({len(topo.gpus)} GPUs), {setup.minutes} minutes, {n_req} requests per "
             f"system ({'synthetic bursty trace, seed ' + str(setup.seed) if setup.trace is None else setup.trace}). "
             "passing_pct = 100 x data-passing time / GPU busy time (get + put over get + compute + put); gpu_busy_h = GPU-hours "
             "holding an execution (get + compute + put); gpu_alloc_h = GPUs holding replicas x the run's span. "
             "Wall time: " + ", ".join(f"{n} {w:.1f} s" for n, w in wall.items()) + ".")
    return Result("cluster-day", f"Six workflows, one hour of bursty arrivals, {setup.nodes} x {MACHINE}", rows, [],
                  notes=notes, data=data, plotter=plot)


def plot(res: Result, plt: Any) -> Any:
    """Arrivals per minute, P50/P99 per workflow, data-passing share and busy GPU-hours, per system."""
    wfs = [r["workflow"] for r in res.rows if r["system"] == SYSTEMS[0]]
    systems = sorted({r["system"] for r in res.rows}, key=lambda s: (s not in SYSTEMS, s))
    fig, ax = plt.subplots(2, 2, figsize=(10, 6.6))
    per_min = res.data.get("arrivals_per_minute", {})
    for n, counts in per_min.items():
        ax[0][0].step(range(1, len(counts) + 1), counts, where="mid", label=n, lw=1)
    ax[0][0].set(title="arrivals per minute (the trace)", xlabel="minute", ylabel="requests")
    ax[0][0].legend(fontsize=6, ncol=3, loc="upper center", framealpha=0.6)
    width = 0.8 / max(len(systems), 1)
    xs = np.arange(len(wfs))

    def cell(s: str, w: str, key: str) -> float:
        return next(float(r[key]) for r in res.rows if r["system"] == s and r["workflow"] == w)

    for i, s in enumerate(systems):
        off = xs + (i - (len(systems) - 1) / 2) * width
        colour = f"C{i}"
        ax[0][1].bar(off, [cell(s, w, "p99_ms") for w in wfs], width, color=colour, alpha=0.4, label=f"{s} P99")
        ax[0][1].bar(off, [cell(s, w, "p50_ms") for w in wfs], width * 0.5, color=colour, label=f"{s} P50")
        ax[1][0].bar(off, [cell(s, w, "passing_pct") for w in wfs], width, color=colour, label=s)
        ax[1][1].bar(off, [cell(s, w, "gpu_busy_h") for w in wfs], width, color=colour, label=s)
    ax[0][1].set(title="end-to-end latency", ylabel="ms")
    ax[0][1].set_yscale("log")
    ax[1][0].set(title="data passing / GPU busy time", ylabel="%")
    alloc = cell(systems[0], "all", "gpu_alloc_h") if "all" in wfs else float("nan")
    ax[1][1].set(title=f"busy GPU-hours (allocated: {alloc:.0f})", ylabel="GPU-hours")
    for a in (ax[0][1], ax[1][0], ax[1][1]):
        a.set_xticks(xs, wfs, rotation=30, fontsize=8)
        a.legend(fontsize=7)
    fig.suptitle(f"{res.title}: {res.data.get('requests_per_system', '?')} requests per system", fontsize=9)
    fig.tight_layout()
    return fig
