"""CLI commands for the in-storage accelerator: ``gfaas accel compile`` prints the compiled program's
layers and statistics, ``gfaas accel run`` also emulates it and compares with onnxruntime."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .accel.arch import AccelConfig
    from .accel.compiler import Program
    from .accel.emulate import CheckResult


def config_from_args(a: argparse.Namespace) -> AccelConfig:
    """--config (a preset or YAML file), then --array / --dataflow / --precision over it."""
    from .accel.arch import load_config, parse_array

    cfg = load_config(a.config)
    changes: dict[str, Any] = {}
    if a.array:
        changes["rows"], changes["cols"] = parse_array(a.array)
    if a.dataflow:
        changes["dataflow"] = a.dataflow
    if getattr(a, "precision", None):
        changes["precision"] = a.precision
    return cfg.with_(**changes) if changes else cfg


def _dims(items: list[str] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items or []:
        key, _, val = item.partition("=")
        if not key or not val.isdigit() or int(val) < 1:
            raise ConfigError(f"--dim {item!r}: write NAME=VALUE with a positive integer, e.g. --dim L=128")
        out[key] = int(val)
    return out


def compile_from_args(a: argparse.Namespace) -> Program:
    from pathlib import Path

    from .accel.compiler import compile_model
    from .models import zoo

    cfg = config_from_args(a)
    if a.model in zoo.names():
        model: Any = zoo.build(a.model, a.scale, a.seed)
    elif Path(a.model).suffix == ".onnx":
        model = a.model
    else:
        raise ConfigError(f"MODEL {a.model!r} is neither an .onnx file nor a zoo model ({', '.join(zoo.names())})")
    return compile_model(model, cfg, batch=a.batch, dims=_dims(a.dim))


def layer_rows(prog: Program) -> list[dict[str, Any]]:
    from .accel.compiler import MatStep

    rows: list[dict[str, Any]] = []
    for s in prog.steps:
        if isinstance(s, MatStep):
            lay = s.layer
            rows.append({"name": lay.name, "op": lay.op, "unit": "matrix", "m": lay.m, "k": lay.k, "n": lay.n,
                         "groups": lay.groups, "macs": lay.macs, "tiles": len(s.tiles), "tile": list(s.tile),
                         "fused": s.op.fused})
        else:
            vl = s.layer
            rows.append({"name": vl.name, "op": vl.op, "unit": "vector", "elements": vl.elements,
                         "ops": vl.ops, "bytes_in": vl.bytes_in, "bytes_out": vl.bytes_out, "fused": s.fused})
    return rows


def compile_report(prog: Program) -> dict[str, Any]:
    return {"model": prog.name, "config": prog.config.to_dict(), "batch": prog.batch, "stats": prog.stats(),
            "layers": layer_rows(prog)}


def run_report(prog: Program, check: CheckResult, precision: str) -> dict[str, Any]:
    """The document ``gfaas accel run --json`` prints: the emulation's verdict, the timing model's
    cycles (compute apart from memory stalls) and the energy model's joules, per model and per layer."""
    from .accel.power import energy
    from .accel.timing import time_model

    cfg = prog.config
    timing = time_model(cfg, prog.layers)
    joules = energy(cfg, timing)
    rows = layer_rows(prog)
    return {
        "model": prog.name, "config": cfg.name, "precision": precision, "batch": prog.batch,
        "cycles": timing.cycles, "compute_cycles": timing.compute_cycles, "stall_cycles": timing.stall_cycles,
        "seconds": timing.seconds(cfg), "energy_j": joules.total_j, "avg_power_w": joules.avg_power_w,
        "energy_breakdown_j": {**joules.dynamic_j, "leakage": joules.leakage_j},
        "utilization": timing.utilization(cfg), "macs": timing.macs, "dram_bytes": timing.dram_bytes,
        "outputs_match": check.outputs_match, "max_rel_err": check.max_rel_err, "tolerance": check.tolerance,
        "errors": check.errors, "stats": prog.stats(),
        "layers": [{"name": r["name"], "op": r["op"], "compute_cycles": t.compute_cycles,
                    "stall_cycles": t.stall_cycles} for r, t in zip(rows, timing.layers, strict=True)],
    }


def _print_layers(prog: Program) -> None:
    print(f"{'layer':<40} {'op':<18} {'m':>8} {'k':>7} {'n':>7} {'groups':>6} {'tiles':>6}")
    for r in layer_rows(prog):
        if r["unit"] == "matrix":
            print(f"{r['name'][:40]:<40} {r['op']:<18} {r['m']:>8} {r['k']:>7} {r['n']:>7} {r['groups']:>6} "
                  f"{r['tiles']:>6}")
        elif r["ops"] or r["bytes_in"] or r["bytes_out"]:
            print(f"{r['name'][:40]:<40} {r['op']:<18} {'vector:':>8} {r['elements']} elements x {r['ops']} ops")
    st = prog.stats()
    print(f"{prog.name} on {prog.config.name} ({prog.config.rows}x{prog.config.cols} {prog.config.dataflow}, "
          f"{prog.config.precision}), batch {prog.batch}: {st['matrix_layers']} matrix + {st['vector_layers']} "
          f"vector layers, {st['tiles']} tiles, {st['macs']:,} MACs, DRAM {st['dram_load_bytes']:,} B in / "
          f"{st['dram_store_bytes']:,} B out")


def cmd_accel_compile(a: argparse.Namespace) -> int:
    prog = compile_from_args(a)
    if a.json:
        print(json.dumps(compile_report(prog)))
    else:
        _print_layers(prog)
    return 0


def cmd_accel_run(a: argparse.Namespace) -> int:
    from .accel.emulate import check

    prog = compile_from_args(a)
    precision = prog.config.precision
    res = check(prog, precision, seed=a.seed)
    doc = run_report(prog, res, precision)
    if a.json:
        print(json.dumps(doc))
    else:
        _print_layers(prog)
        verdict = "match" if res.outputs_match else "DO NOT match"
        print(f"timing: {doc['cycles']:,} cycles ({doc['compute_cycles']:,} compute + {doc['stall_cycles']:,} "
              f"memory stall) = {doc['seconds'] * 1e3:.3f} ms at {prog.config.freq_mhz:g} MHz, utilization "
              f"{doc['utilization']:.1%}; energy {doc['energy_j'] * 1e3:.3f} mJ")
        print(f"emulated at {precision}: outputs {verdict} onnxruntime (max relative error "
              f"{res.max_rel_err:.3g}, bound {res.tolerance:g})")
    return 0 if res.outputs_match else 1


def _common(p: argparse.ArgumentParser) -> None:
    from .accel.arch import DATAFLOWS, PRESETS

    p.add_argument("model", metavar="MODEL", help="a zoo model name or an .onnx file")
    p.add_argument("--config", default="dscs", help=f"a preset ({', '.join(PRESETS)}) or a YAML file (default dscs)")
    p.add_argument("--array", help="override the array size, ROWSxCOLS (e.g. 32x32)")
    p.add_argument("--dataflow", choices=DATAFLOWS, help="override the dataflow (output/weight/input-stationary)")
    p.add_argument("--batch", type=int, default=1, help="the batch dimension (default 1)")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE",
                   help="fix another dynamic dimension, e.g. --dim L=128 (zoo models default to their info)")
    p.add_argument("--scale", choices=["small", "full"], default="small", help="zoo model size (default small)")
    p.add_argument("--seed", type=int, default=0, help="zoo weights and emulation inputs seed (default 0)")
    p.add_argument("--precision", choices=["fp32", "int8"],
                   help="the matrix unit's precision (default: the config's; the presets are int8)")
    p.add_argument("--json", action="store_true")


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("accel", help="the in-storage accelerator: compile and emulate models")
    ssub = s.add_subparsers(dest="accel_command", required=True)
    c = ssub.add_parser("compile", help="compile a model and print its layers and tile program statistics")
    _common(c)
    c.set_defaults(func=cmd_accel_compile)
    r = ssub.add_parser("run", help="compile, emulate and compare the outputs with onnxruntime")
    _common(r)
    r.set_defaults(func=cmd_accel_run)
    d = ssub.add_parser("dse", help="design-space exploration: ~650 configs x the zoo, Pareto frontiers (docs/accel-dse.md)")
    _dse_args(d)
    d.set_defaults(func=cmd_accel_dse)


def _dse_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", type=float, default=4.2, help="peak-power budget of the accelerator, W (default 4.2)")
    p.add_argument("--models", help="comma-separated zoo models (default: all)")
    p.add_argument("--scale", choices=["small", "full"], default="full", help="zoo model size (default full)")
    p.add_argument("--steps", type=int, default=4, help="scratchpad sizes per doubling (default 4: 651 points)")
    p.add_argument("--out", metavar="DIR", help="also write DIR/dse.json, DIR/dse_rows.csv, DIR/dse_frontiers.png")
    p.add_argument("--json", action="store_true")


def cmd_accel_dse(a: argparse.Namespace) -> int:
    import math
    import sys
    from pathlib import Path

    from .accel import dse
    from .models import zoo

    if not math.isfinite(a.budget) or a.budget <= 0:
        raise ConfigError(f"--budget {a.budget:g}: give the accelerator's power budget in watts, > 0 (e.g. 4.2)")
    models = [m.strip() for m in a.models.split(",")] if a.models else zoo.names()
    bad = [m for m in models if m not in zoo.names()]
    if bad or not models:
        raise ConfigError(f"--models {a.models!r}: {', '.join(bad) or 'none given'} not in the zoo "
                          f"({', '.join(zoo.names())})")
    from .provenance import provenance

    prov = provenance()  # before the run, so it names the code that ran
    res = dse.explore(models, a.budget, steps_per_octave=a.steps, scale=a.scale,
                      progress=lambda line: print(f"dse: {line}", file=sys.stderr, flush=True))
    doc = {**res.to_dict(), "provenance": prov}
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "dse.json").write_text(json.dumps(doc, indent=1))
        dse.write_rows(res, str(out / "dse_rows.csv"))
        dse.plot(res, str(out / "dse_frontiers.png"))
    if a.json:
        print(json.dumps(doc))
        return 0
    pp, ch, ppw = doc["paper_point"], doc["chosen"], doc["best_perf_per_w"]
    print(f"{doc['points']} points x {len(models)} models in {doc['seconds']:.1f} s; "
          f"{doc['feasible_points']} within {a.budget:g} W peak")
    for label, p in (("chosen (best perf under budget)", ch), ("best perf/W", ppw)):
        if p:
            print(f"{label}: {p['name']}  {p['geomean_ips']:.4g} inf/s geomean, {p['avg_power_w']:.3g} W chip average, "
                  f"{p['peak_power_w']:.3g} W peak, {p['area_mm2']:.3g} mm2")
        else:
            print(f"{label}: no point fits {a.budget:g} W")
    rank = f"rank {pp['rank']} of {pp['of']} feasible" if pp["rank"] else "infeasible"
    rel = f"{pp['perf_vs_chosen']:.2f}x the chosen point's performance; " if pp["perf_vs_chosen"] else ""
    print(f"paper's point {pp['name']}: {pp['geomean_ips']:.4g} inf/s, {pp['peak_power_w']:.3g} W peak; {rank}; "
          f"{rel}on power frontier: {pp['on_power_frontier']}, on area frontier: {pp['on_area_frontier']}")
    print(f"power-performance frontier: {len(doc['frontier_power'])} points; "
          f"area-performance frontier: {len(doc['frontier_area'])} points")
    return 0
