"""``gfaas bench NAME``: the benchmarks against real peers, one subcommand each with its own flags.

Each benchmark has only the flags it reads, with its own defaults: a flag shared by two benchmarks once
moved one of them from 40 to 1,000 Mbit/s unnoticed. What a run used is recorded in its result file's
``provenance.settings`` (:func:`gfaas.provenance.record_settings`, from :func:`settings_of`), and
``tests/unit/test_results_settings.py`` checks that each result's documented command still gives them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

# Not settings: where results go and how they are printed, and the command's own name (the command
# line is recorded beside the settings).
OUTPUT_KEYS = frozenset({"func", "settings", "json", "out", "figure", "save", "verbose", "results", "command", "what"})


def cli_settings(a: argparse.Namespace) -> dict[str, Any]:
    """What a command ran with: every parsed flag except those that only choose outputs."""
    return {k: v for k, v in sorted(vars(a).items()) if k not in OUTPUT_KEYS and not callable(v)}


def settings_of(a: argparse.Namespace) -> dict[str, Any]:
    """The settings a parsed command runs with: its own ``settings`` function's, else :func:`cli_settings`."""
    fn: Callable[[argparse.Namespace], dict[str, Any]] = getattr(a, "settings", None) or cli_settings
    return fn(a)


def _run(module: str, attr: str) -> Callable[[argparse.Namespace], int]:
    """A command that imports its benchmark only when it runs (``gfaas --help`` stays fast)."""
    def call(a: argparse.Namespace) -> int:
        import importlib

        return int(getattr(importlib.import_module(module, "gfaas"), attr)(a) or 0)

    return call


def _common(p: argparse.ArgumentParser, quick: bool = True, out: bool = True) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    if quick:
        p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (smoke test)")
    if out:
        p.add_argument("--out", help="also write the JSON result to this file")


def _scale_settings(a: argparse.Namespace) -> dict[str, Any]:
    """``bench scale``: the testbed's effective settings (its defaults filled in), as the result records them."""
    from dataclasses import asdict

    from .cli_scale import scale_bench

    return asdict(scale_bench(a))


def add_parsers(sub: Any) -> None:
    b = sub.add_parser("bench", help="benchmarks against real peers, in one run")
    bs = b.add_subparsers(dest="what", required=True, metavar="NAME")

    p = bs.add_parser("dataplane", help="put/get: gfaas vs Ray's object store, Redis, a pipe and memcpy")
    _common(p)
    p.add_argument("--systems", help="comma-separated subset of systems to run ('none': no CPU rows)")
    p.add_argument("--gpu", action="store_true", help="add the CUDA rows (needs a GPU and gfaas[gpu]; docs/benchmarks.md)")
    p.set_defaults(func=_run(".bench.dataplane", "main"))

    p = bs.add_parser("pipeline", help="one tensor between two stages, gfaas vs Redis")
    _common(p, quick=False, out=False)
    p.add_argument("--sizes", default="64KiB,1MiB,16MiB,64MiB", help="tensor sizes (default 64KiB,1MiB,16MiB,64MiB)")
    p.add_argument("--repeat", type=int, default=20, help="tensors per size (default 20)")
    p.set_defaults(func=_run(".bench.pipeline", "run_pipeline"))

    p = bs.add_parser("sim", help="the simulator's event kernel vs SimPy, policy decision times")
    _common(p)
    p.set_defaults(func=_run(".cli_sim", "bench_sim"))

    p = bs.add_parser("simscale", help="the simulator on 1-128 x dgx-a100: wall time per request")
    _common(p)
    p.set_defaults(func=_run(".cli_sim", "bench_simscale"))

    p = bs.add_parser("accel", help="the in-storage accelerator's cycles against SCALE-Sim v3")
    _common(p)
    p.add_argument("--full", action="store_true", help="SCALE-Sim's ResNet-50 on all four configurations")
    p.set_defaults(func=_run(".bench.accel", "main"))

    p = bs.add_parser("scale", help="multicast vs its bound and a tree; TTFT vs load-then-serve (root: namespaces)")
    _common(p, quick=False)
    p.add_argument("--trace", help="an Azure LLM trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens); default: the "
                   "bundled code trace")
    p.add_argument("--nodes", type=int, help="node processes, one namespace each (default 8)")
    p.add_argument("--rate-mbit", dest="rate_mbit", type=float, help="each port's rate in Mbit/s (default 40)")
    p.add_argument("--requests", type=int, help="requests of the burst (default 40)")
    p.add_argument("--figure", help="also draw the throughput ramp to this PNG")
    p.set_defaults(func=_run(".cli_scale", "bench_scale"), settings=_scale_settings)

    p = bs.add_parser("dedup", help="page merging vs KSM at its default settings (root)")
    _common(p)
    p.add_argument("--figure", help="also draw the figure to this PNG")
    p.set_defaults(func=_run(".bench.dedup", "main"))

    p = bs.add_parser("autoscale", help="bursty arrivals: always-warm vs fixed vs gfaas, and the simulator's replay")
    _common(p)
    p.add_argument("--duration", type=float, help="seconds of arrivals per policy (default: the benchmark's)")
    p.add_argument("--runs", type=int, default=1, help="runs of the three policies; the ratios are their mean "
                   "(default 1; the committed autoscale.json: 3)")
    p.set_defaults(func=_run(".bench.autoscale", "main"))

    p = bs.add_parser("overload", help="gfaas serve under 16 to 2,000 connections; the embedded invocation's floor")
    _common(p)
    p.add_argument("--connections", help="keep-alive connections per row (default 16,256,2000)")
    p.add_argument("--duration", type=float, help="seconds of load per row (default 10)")
    p.add_argument("--retry-jitter", type=float, default=None,
                   help="a refused client waits Retry-After times 1 + JITTER * u, u uniform in [0, 1) (default 1; 0: "
                        "exactly Retry-After, so clients refused together return together)")
    p.add_argument("--retry-after-cap", type=float, default=None,
                   help="the longest Retry-After a refused client waits, before the jitter (default 1 s: clients come "
                        "back sooner than the server asks, the harder case; 0: they retry at once)")
    p.add_argument("--rounds", type=int, default=None,
                   help="run the connection counts this many times, forward then backward; goodput is each count's "
                        "median (default 1; the committed overload*.json: 3)")
    p.set_defaults(func=_run(".bench.overload", "main"))

    p = bs.add_parser("ray-serve", help="a two-function pipeline against a Ray Serve composition (the ray extra)")
    _common(p)
    p.add_argument("--sizes", default=None, help="array sizes (default 64KiB,4MiB,64MiB)")
    p.set_defaults(func=_run(".bench.ray_serve", "main"))

    p = bs.add_parser("cluster", help="data passing between machines of a network-namespace lab (root, ray extra)")
    _common(p, quick=False)
    p.add_argument("--machines", type=int, default=3, help="machines of the lab, the head included (default 3)")
    p.add_argument("--rate-mbit", type=float, default=1000.0, help="each machine's link, Mbit/s each way (default 1000)")
    p.add_argument("--repeats", type=int, default=15, help="measured rounds per size and requests per workflow and "
                   "transport, interleaved, after one warm-up (default 15: a median of 5 moved by 10-15%% between "
                   "runs, as much as the margins it judges)")
    p.add_argument("--sizes", default=None, help="tensor sizes (default 1MiB,16MiB,64MiB)")
    p.add_argument("--workflows", help="comma-separated reference workflows end to end (default: all six; '' for none)")
    p.set_defaults(func=_run(".bench.cluster", "main"))

    p = bs.add_parser("pull", help="a pull between two machines of a network-namespace lab against one raw TCP "
                                   "stream (root)")
    _common(p, quick=False)
    p.add_argument("--rate-mbit", type=float, default=100_000.0,
                   help="each machine's link, Mbit/s each way (default 100000: the CPUs bound every system)")
    p.add_argument("--repeats", type=int, default=15, help="measured rounds, after one warm-up (default 15)")
    p.add_argument("--sizes", default=None, help="object sizes (default 1MiB,4MiB,16MiB,64MiB,256MiB)")
    p.add_argument("--engine-python", default="", help="an interpreter that has Mooncake's transfer engine: adds "
                   "its row (make pull-results builds one in .venv-te)")
    p.set_defaults(func=_run(".bench.pull", "main"))
