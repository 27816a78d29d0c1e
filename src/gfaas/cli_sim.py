"""CLI commands for topologies, the simulator and its benchmark (``gfaas topo|sim``, ``bench sim``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from .errors import ConfigError
from .provenance import provenance


def _emit(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def cmd_topo(a: argparse.Namespace) -> int:
    from .topology.io import resolve

    if a.action == "show":
        topo = resolve(a.name)
        if a.json:
            _emit(topo.summary())
            return 0
        _show(topo)
        return 0
    if not (a.topology and a.src and a.dst):
        raise ConfigError("topo paths needs --topology NAME|FILE --src DEVICE --dst DEVICE")
    from .policy import Router

    topo = resolve(a.topology)
    topo.device(a.src)
    topo.device(a.dst)
    plan = Router(topo).plan("cli", a.src, a.dst)
    paths = [{"hops": list(p.hops), "gbps": round(p.gbps, 3)} for p in plan.paths]
    out: dict[str, Any] = {"paths": paths, "total_gbps": round(plan.total_gbps, 3), "unit": "GB/s"}
    flow = _max_flow(topo, a.src, a.dst)
    if flow is not None:  # same node, GPU pair or host and GPU: the idle optimum the plan aims at
        out["max_flow_gbps"] = round(flow, 3)
    if a.json:
        _emit(out)
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{a.src} -> {a.dst} on {topo.name} (idle machine)")
    t.add_column("path")
    t.add_column("GB/s", justify="right")
    for p in paths:
        t.add_row(" -> ".join(p["hops"]), f"{p['gbps']:.1f}")  # type: ignore[arg-type]
    t.add_row("[b]total[/b]", f"[b]{out['total_gbps']:.1f}[/b]")
    if flow is not None:
        t.add_row("max flow (NVLink for GPU pairs)", f"{flow:.1f}")
    Console().print(t)
    if not plan.paths:
        print("(same device: zero-copy, nothing moves)")
    return 0


def _max_flow(topo: Any, src: str, dst: str) -> float | None:
    """The idle maximum flow src -> dst over the links a planned route may use, or None when the
    planner does not compute one (same device, different nodes, no GPU-GPU or host-GPU pair)."""
    from .policy.paths import flow_paths

    try:
        return flow_paths(topo, src, dst)[0]
    except ConfigError:
        return None


def _show(topo: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    s = topo.summary()
    con = Console()
    con.print(f"[b]{s['name']}[/b]: {s['description']}")
    gpus = [g["name"] for g in s["gpus"]]
    if gpus:
        t = Table(title="GPU to GPU NVLink GB/s per direction (. = none: PCIe P2P at "
                        f"{s['pcie_p2p_gbps']} GB/s)")
        t.add_column("")
        for g in gpus:
            t.add_column(g, justify="right")
        for a in gpus:
            row = s["nvlink_gbps"].get(a, {})
            t.add_row(a, *["X" if b == a else (f"{row[b]:.0f}" if row.get(b) else ".") if b in row else "-"
                           for b in gpus])
        con.print(t)
        sw = Table(title="GPUs")
        for col in ("gpu", "model", "memory GiB", "PCIe switch", "node"):
            sw.add_column(col)
        for g in s["gpus"]:
            sw.add_row(g["name"], g["model"], f"{g['memory_bytes'] / 2**30:.0f}", str(g["pcie_switch"]), str(g["node"]))
        con.print(sw)
    other = [ln for ln in s["links"] if ln["kind"] != "nvlink"]
    con.print(f"{len(s['links'])} links ({len(other)} PCIe/NIC/network); host pageable rate {s['pageable_gbps']} GB/s")


def cmd_sim(a: argparse.Namespace) -> int:
    if a.action == "keepalive":
        return cmd_keepalive(a)
    from .sim.experiments import REGISTRY

    if a.action == "list":
        if a.json:
            _emit([{"name": e.name, "title": e.title, "paper": e.paper_ref, "params": list(e.params),
                    "in_all": e.in_all} for e in REGISTRY.values()])
        else:
            for e in REGISTRY.values():
                extra = f"  --set {'|'.join(e.params)}" if e.params else ""
                extra += "" if e.in_all else "  (not in 'all')"
                print(f"{e.name:16} {e.title}  [{e.paper_ref}]{extra}")
        return 0
    if not a.name:
        raise ConfigError(f"sim run needs an experiment name: one of {', '.join(REGISTRY)} or 'all'")
    names = [n for n, e in REGISTRY.items() if e.in_all] if a.name == "all" else a.name.split(",")
    for n in names:
        if n not in REGISTRY:
            raise ConfigError(f"unknown experiment {n!r}; `gfaas sim list` shows: {', '.join(REGISTRY)}")
    params = _params(a.set or [])
    if params and len(names) > 1:
        raise ConfigError("--set applies to one experiment; name it instead of 'all' or a list")
    results = []
    for n in names:
        t0 = time.monotonic()
        res = _with_progress(n, a.quick, quiet=a.json, params=params)
        results.append(res)
        if a.out:
            paths = res.write(a.out)
            if not a.json:
                print(f"wrote {', '.join(paths)}", file=sys.stderr)
        if not a.json:
            _show_result(res, time.monotonic() - t0)
    if a.save:
        with open(a.save, "w") as f:
            # One experiment per line: series (timelines, ramps) stay compact, and a re-run's diff
            # still shows which experiments moved.
            f.write('{"provenance": ' + json.dumps(provenance(), indent=1) + ',\n"experiments": [\n')
            f.write(",\n".join(json.dumps(r.as_json(), separators=(",", ":")) for r in results))
            f.write("\n]}\n")
    if a.json:
        _emit(results[0].as_json() if len(results) == 1 else [r.as_json() for r in results])
    return 0


def cmd_keepalive(a: argparse.Namespace) -> int:
    """``gfaas sim keepalive``: a day of functions replayed under keep-alive policies (docs/autoscaling.md)."""
    from .sim.keepalive import DEFAULT_POLICIES, fixed_curve, pareto_figure, simulate

    if a.name:
        raise ConfigError(f"sim keepalive takes no experiment name (got {a.name!r}); use --trace DIR for a trace")
    policies = [p.strip() for p in a.policies.split(",") if p.strip()] if a.policies else list(DEFAULT_POLICIES)
    t0 = time.monotonic()
    if a.trace:
        from .sim.azure_trace import load_function_day

        day = load_function_day(a.trace)
    else:
        from .sim.synthetic_functions import synthetic_day

        day = synthetic_day(a.functions, a.seed)
    print(f"{day.functions:,} functions, {day.invocations:,} invocations ({day.source}) in "
          f"{time.monotonic() - t0:.1f} s", file=sys.stderr)

    def progress(name: str, done: int, total: int) -> None:
        if done == 0:
            print(f"  {name} ...", file=sys.stderr)

    doc = simulate(day, policies, progress)
    doc["seconds"] = round(time.monotonic() - t0, 2)
    if a.figure:
        curve = fixed_curve(day)
        if pareto_figure(doc, curve, a.figure):
            print(f"wrote {a.figure}", file=sys.stderr)
        else:
            print("no figure: matplotlib is missing (pip install 'gfaas[dev]')", file=sys.stderr)
        doc["fixed_curve"] = curve
    doc["provenance"] = provenance()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    if a.json:
        _emit(doc)
        return 0
    print(f"{'policy':12} {'cold starts':>12} {'cold % p75':>11} {'idle GB-min':>12}")
    for p in doc["policies"]:
        print(f"{p['policy']:12} {p['cold_starts']:>12,} {p['cold_start_pct_p75']:>11.2f} {p['idle_memory_gb_min']:>12,.1f}")
    print(f"({doc['seconds']:.1f} s)")
    return 0


def _params(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set {pair!r}: write KEY=VALUE, e.g. --set nodes=16")
        out[key.strip()] = value.strip()
    return out


def _with_progress(name: str, quick: bool, quiet: bool, params: dict[str, str] | None = None) -> Any:
    from .sim.experiments import run_experiment

    if quiet or not sys.stderr.isatty():
        return run_experiment(name, quick, params=params)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=True) as prog:
        task = prog.add_task(name, total=None)

        def cb(done: int, total: int, what: str) -> None:
            prog.update(task, completed=done, total=total, description=f"{name}: {what}")

        return run_experiment(name, quick, cb, params)


def _show_result(res: Any, seconds: float) -> None:
    from rich.console import Console
    from rich.table import Table

    if not res.paper:  # no paper figure to compare with (cluster-day): its own table
        print(res.markdown() + f"({seconds:.1f} s)")
        return

    t = Table(title=f"{res.title}  ({seconds:.1f} s)")
    for col in ("metric", "paper", "ours", "tolerance", "within", "direction"):
        t.add_column(col)
    for c in res.paper:
        u = "%" if c.unit == "%" else "x"
        t.add_row(c.metric, f"{c.paper:g}{u}", f"{c.ours:.1f}{u}", c.tolerance_text, "yes" if c.within else "[red]no[/red]",
                  "yes" if c.same_direction else "[red]no[/red]")
    Console().print(t)


def _save_or_emit(res: dict[str, Any], a: argparse.Namespace) -> bool:
    """Stamp a benchmark result with its provenance, write it to ``--out``, and print it as JSON if
    ``--json`` asked for that (True: the caller prints nothing else)."""
    res["provenance"] = provenance()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    if a.json:
        _emit(res)
    return bool(a.json)


def bench_sim(a: argparse.Namespace) -> int:
    from .bench.sim import run

    res = run(events=20_000 if a.quick else 200_000)
    try:
        from .bench.policy import run as policy_run
        from .policy import Router

        # The router the simulator plans with (the native one where it is built), and the reference
        # on the same samples (same seed).
        from .sim.dataplane import router_class

        n = 500 if a.quick else 20_000
        res["policy_decision"] = policy_run(n=n, router=router_class())
        if router_class() is not Router:
            res["policy_decision_python"] = policy_run(n=n, router=Router)
    except ImportError:  # pragma: no cover - the policy benchmark ships with the policy package
        pass
    if _save_or_emit(res, a):
        return 0
    print(f"event kernel ({res['core']}): gfaas {res['gfaas_events_per_s']:,.0f} events/s, SimPy "
          f"{res['simpy_events_per_s']:,.0f} events/s; ratio {res['ratio']:.2f}x (same M/M/1 jobs); "
          f"{res['core_over_python']:.2f}x the pure-Python kernel")
    if "policy_decision" in res:
        print("policy decision times:", json.dumps(res["policy_decision"], indent=1))
    return 0


def bench_simscale(a: argparse.Namespace) -> int:
    from .bench.simscale import NODES, run

    res = run((1, 8), 1.0) if a.quick else run(NODES)
    if _save_or_emit(res, a):
        return 0
    for r in res["rows"]:  # type: ignore[attr-defined]
        ref = (f"  (pure-Python core {r['python_us_per_request']:.1f} us/request: {r['speedup']:.2f}x)"
               if "speedup" in r else "")
        print(f"{r['nodes']:>4} nodes {r['gpus']:>5} GPUs {r['requests']:>7} requests  {r['wall_s']:>8.2f} s wall"
              f"  {r['us_per_request']:>7.1f} us/request  p50 {r['p50_ms']:.2f} ms{ref}")
    return 0


def add_parsers(sub: Any) -> None:
    t = sub.add_parser("topo", help="topology presets and multi-path plans")
    t.add_argument("action", choices=["show", "paths"])
    t.add_argument("name", nargs="?", default="dgx-v100", help="show: preset name (NAME*N for N nodes) or YAML file")
    t.add_argument("--topology", help="paths: preset name or YAML file")
    t.add_argument("--src", help="paths: source device, e.g. gpu0 or host")
    t.add_argument("--dst", help="paths: destination device")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_topo)

    s = sub.add_parser("sim", help="simulator experiments, one per paper figure")
    s.add_argument("action", choices=["list", "run", "keepalive"],
                   help="keepalive: replay a day of functions under keep-alive policies (docs/autoscaling.md)")
    s.add_argument("name", nargs="?", help="run: experiment name, several joined by commas, or 'all'")
    s.add_argument("--quick", action="store_true", help="a smaller sweep (smoke test)")
    s.add_argument("--out", help="write NAME.json, NAME.md and NAME.png here")
    s.add_argument("--save", metavar="FILE",
                   help="write every experiment's result to FILE with its provenance (commit, machine)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="run: an experiment parameter (repeatable; `gfaas sim list` names them)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--trace", metavar="DIR", help="keepalive: an Azure Functions 2019 trace directory "
                   "(default: the synthetic day)")
    s.add_argument("--policies", metavar="LIST", help="keepalive: policies joined by commas "
                   "(default fixed:10,fixed:60,hybrid,gfaas)")
    s.add_argument("--functions", type=int, default=10_000, help="keepalive: synthetic functions (default 10000)")
    s.add_argument("--seed", type=int, default=0, help="keepalive: synthetic seed (default 0)")
    s.add_argument("--figure", metavar="PNG", help="keepalive: write the Pareto plot here")
    s.set_defaults(func=cmd_sim)
