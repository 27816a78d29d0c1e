"""CLI commands for model scaling: ``gfaas scale plan`` prints a multicast schedule, ``gfaas scale demo``
and ``gfaas bench scale`` run real scale-outs on network namespaces (root)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .policy.multicast import Schedule
    from .scaling.bench import ScaleBench


def _compact_json(sched: Schedule) -> str:
    """``json.dumps(sched.to_json())`` without spaces, written directly: a plan for 1,000 nodes has
    ~64,000 transfers, and this is 4x faster than building and encoding the dicts."""
    item = '{"src":%d,"dst":%d,"block":%d}'
    steps = ",".join("[" + ",".join(item % tr for tr in step) + "]" for step in sched.steps)
    return f'{{"num_steps":{sched.num_steps},"steps":[{steps}]}}'


def cmd_scale_plan(a: argparse.Namespace) -> int:
    from .policy.multicast import plan, step_bound

    sched = plan(a.nodes, a.blocks, a.sources, a.scheme)
    if a.json:
        sys.stdout.write(_compact_json(sched) + "\n")
        return 0
    sizes = sorted({len(g) for g in sched.groups})
    bound = max(step_bound(a.scheme, n, a.blocks) for n in sizes)
    kind = "at most" if a.scheme == "tree" else "exactly"
    print(f"{a.scheme} multicast of {a.blocks} blocks from {a.sources} source(s) to {a.nodes} nodes")
    print(f"  sub-groups: {len(sched.groups)} of {' or '.join(map(str, sizes))} nodes (source included)")
    print(f"  steps:      {sched.num_steps} (the scheme's count: {kind} {bound})")
    print(f"  transfers:  {sched.num_transfers} = (nodes - sources) x blocks")
    done = sched.completion_step()
    dest = done[a.sources:]
    if dest:
        print(f"  first destination complete after {min(dest)} steps, last after {max(dest)}")
    return 0


def _scale_run(a: argparse.Namespace, what: str) -> dict[str, Any] | None:
    """Run the testbed experiment with progress on stderr; None (after saying how) without root."""
    from .errors import ScalingError
    from .scaling.bench import run_bench
    from .scaling.netns import check_capable

    try:
        check_capable()
    except ScalingError as exc:
        print(f"gfaas {what}: {exc}", file=sys.stderr)
        print(f"  it builds one network namespace per node; as root: sudo {sys.executable} -m gfaas {what} ...",
              file=sys.stderr)
        return None
    return run_bench(scale_bench(a), progress=lambda msg: print(msg, file=sys.stderr, flush=True))


def scale_bench(a: argparse.Namespace) -> ScaleBench:
    """The testbed's settings: the command's flags that name one of them, the rest at their defaults."""
    from .scaling.bench import ScaleBench

    return ScaleBench(**{k: v for k, v in vars(a).items() if k in ScaleBench.__dataclass_fields__ and v is not None})


def _clean(x: Any) -> Any:
    """JSON without NaN (as null)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def bench_scale(a: argparse.Namespace) -> int:
    res = _scale_run(a, "bench scale")
    if res is None:
        return 2
    from .provenance import provenance

    res = _clean(res)
    # The commit, tree state and machine measured, as every committed result file carries them.
    res["provenance"] = provenance()
    text = json.dumps(res, indent=None if a.json else 2)
    if a.out:
        Path(a.out).write_text(text + "\n")
    if getattr(a, "figure", None):
        from .scaling.bench import plot_ramp

        plot_ramp(res, a.figure)
    print(text if a.json else _summary(res))
    return 0


def _summary(res: dict[str, Any]) -> str:
    lines = ["multicast of the model's blocks:"]
    for m in res["multicast"]:
        lines.append(f"  {m['scheme']:<9} k={m['sources']} N={m['nodes']} B={m['blocks']}: {m['seconds']:.2f} s, bound "
                     f"{m['bound_seconds']:.2f} s (x{m['ratio_to_bound']:.3f}), node CPU {m['node_cpu_seconds']:.2f} s")
    lines.append(f"  binomial is {res['binomial_speedup_vs_tree']:.2f}x faster than the tree")
    lines.append(f"TTFT of {res['settings']['requests']} requests during a scale-out from "
                 f"{res['settings']['sources']} loaded nodes:")
    for t in res["ttft"]:
        lines.append(f"  {t['system']:<16} p50 {t['p50_s']:.2f} s  p90 {t['p90_s']:.2f} s  all loaded after "
                     f"{t['all_loaded_s']:.2f} s  migrations {t['migrations']}")
    lines.append(f"  P90 gain over load-then-serve: {res['ttft_p90_gain_vs_load_then_serve']:.2f}x")
    t = res["tiers"]
    lines.append(f"startup tiers: hot 0 s; warm (host-memory cache) {t['warm_s']:.3f} s for {t['warm_hits']} of "
                 f"{t['warm_nodes']} nodes; cold (binomial multicast) {t['cold_binomial_s']:.2f} s")
    lines.append(f"outputs identical to a one-process run: {res['outputs_identical']}")
    return "\n".join(lines)


def cmd_scale_demo(a: argparse.Namespace) -> int:
    res = _scale_run(a, "scale demo")
    if res is None:
        return 2
    res = _clean(res)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    fig = ""
    try:
        from .scaling.bench import plot_ramp

        plot_ramp(res, out / "ramp.png")
        fig = f", {out / 'ramp.png'}"
    except ImportError as exc:
        print(f"no figure: {exc}", file=sys.stderr)
    print(_summary(res))
    print(f"wrote {out / 'results.json'}{fig}")
    return 0


def add_parsers(sub: Any) -> None:
    s = sub.add_parser("scale", help="model scaling: block multicast plans")
    ssub = s.add_subparsers(dest="scale_command", required=True)
    p = ssub.add_parser("plan", help="the step-by-step multicast schedule of a model's blocks")
    p.add_argument("--nodes", type=int, required=True, help="nodes in all, sources included (N)")
    p.add_argument("--blocks", type=int, required=True, help="blocks the model is cut into (B)")
    p.add_argument("--sources", type=int, default=1, help="nodes 0..K-1 hold the model at step 0 (default 1)")
    p.add_argument("--scheme", default="binomial", choices=["binomial", "tree", "chain", "sequential"],
                   help="binomial pipeline (default), binary tree (FaaSNet), chain, or one by one (NCCL-like)")
    p.add_argument("--json", action="store_true",
                   help='print {"num_steps": int, "steps": [[{"src", "dst", "block"}, ...], ...]}')
    p.set_defaults(func=cmd_scale_plan)
    d = ssub.add_parser("demo", help="real scale-out on network namespaces: multicast and serving vs baselines (root)")
    d.add_argument("--trace", help="an Azure LLM trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens); default: "
                   "the bundled code trace")
    d.add_argument("--nodes", type=int, help="node processes, one namespace each (default 8)")
    d.add_argument("--rate-mbit", dest="rate_mbit", type=float, help="each port's rate in Mbit/s (default 40)")
    d.add_argument("--requests", type=int, help="requests of the burst (default 40)")
    d.add_argument("--out", default="out/scale-demo", help="directory for results.json and ramp.png")
    d.set_defaults(func=cmd_scale_demo)
