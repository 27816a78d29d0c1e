"""Decision time of the routing policy: how long one ``plan()`` + ``release()`` takes.

Seed 000 §6.2 and seed 001 §4.3.3 report path selection under 10 us. This benchmark measures our
:class:`~gfaas.policy.Router` in the situation the papers describe: a few other transfers are
active on the node when a new one is planned.

Each sample: ``background`` other transfers (3 by default; two thirds GPU to GPU, one third host
to GPU, random endpoints) are planned untimed, then the measured transfer is planned and released under ``time.perf_counter_ns``, then
the background is released (untimed). Re-planning the background every sample keeps the load the
same throughout the run; otherwise reroutes and balancing would slowly wear the background plans
down. Route lists are built once per (source, destination) pair, so the first samples of a pair
are slower; they are included (as a real runtime would pay them once).

The garbage collector is paused while sampling, as :mod:`timeit` does. The numbers depend on the
CPU and on what else runs on it; compare runs on the same machine only.

Kinds: ``gpu->gpu`` (same node), ``host->gpu`` (same node) and ``cross-node`` (GPU to GPU on a
two-node copy of the machine, NIC harvesting on). The policy code never reads the clock; only
this benchmark does.

``router``: the class timed, :class:`~gfaas.policy.Router` (the reference) by default or
:class:`~gfaas.policy.routing_native.NativeRouter` (the same plans, planned in Rust); ``gfaas bench sim``
times both on the same samples.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections.abc import Callable

from ..policy import Router
from ..topology import Topology, preset

#: Background transfers active while a sample is planned ("a few", seed 000 §6.2).
BACKGROUND = 3
TOPOLOGIES = ("dgx-v100", "dgx-a100")


def _pct(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000.0


def _sample(topo: Topology, rng: random.Random, n: int, n_bg: int,
            pick: Callable[[random.Random], tuple[str, str]],
            background: Callable[[random.Random], tuple[str, str]], router_class: type[Router] = Router
            ) -> dict[str, float]:
    router = router_class(topo)
    times: list[int] = []
    clock = time.perf_counter_ns
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: a collection landing in one sample says nothing about the policy
    try:
        _loop(router, rng, n, n_bg, pick, background, times, clock)
    finally:
        if was_enabled:
            gc.enable()
    times.sort()
    return {"median_us": round(_pct(times, 0.5), 2), "p99_us": round(_pct(times, 0.99), 2), "samples": n}


def _loop(router: Router, rng: random.Random, n: int, n_bg: int,
          pick: Callable[[random.Random], tuple[str, str]],
          background: Callable[[random.Random], tuple[str, str]],
          times: list[int], clock: Callable[[], int]) -> None:
    for i in range(n):
        bg = []
        for k in range(n_bg):
            s, d = background(rng)
            router.plan(("bg", k), s, d)
            bg.append(("bg", k))
        src, dst = pick(rng)
        t0 = clock()
        router.plan(i, src, dst)
        router.release(i)
        times.append(clock() - t0)
        for b in bg:
            router.release(b)
        router.changed()


def run(n: int = 20000, seed: int = 1, background: int = BACKGROUND,
        router: type[Router] = Router) -> dict[str, object]:
    """Median and p99 microseconds per plan()+release(), per topology and transfer kind.

    ``background=0`` measures an idle machine (the floor of the decision time).
    """
    rng = random.Random(seed)
    out: dict[str, object] = {"n": n, "seed": seed, "background": background, "unit": "us",
                              "router": router.__name__}
    for name in TOPOLOGIES:
        one = preset(name)
        two = preset(f"{name}*2")
        gpus = one.gpus
        g0 = [g for g in two.gpus if two.device(g).node == 0]
        g1 = [g for g in two.gpus if two.device(g).node == 1]

        def gpu_pair(r: random.Random, gpus: list[str] = gpus) -> tuple[str, str]:
            a, b = r.sample(gpus, 2)
            return a, b

        def host_pair(r: random.Random, gpus: list[str] = gpus) -> tuple[str, str]:
            return "host", r.choice(gpus)

        def mixed(r: random.Random, gpus: list[str] = gpus) -> tuple[str, str]:
            return gpu_pair(r) if r.random() < 0.67 else host_pair(r)

        def cross(r: random.Random, g0: list[str] = g0, g1: list[str] = g1) -> tuple[str, str]:
            return r.choice(g0), r.choice(g1)

        def cross_bg(r: random.Random, g0: list[str] = g0, g1: list[str] = g1) -> tuple[str, str]:
            if r.random() < 0.5:
                return cross(r)
            a, b = r.sample(g0, 2)
            return a, b

        out[name] = {
            "gpu->gpu": _sample(one, rng, n, background, gpu_pair, mixed, router),
            "host->gpu": _sample(one, rng, n, background, host_pair, mixed, router),
            "cross-node": _sample(two, rng, n, background, cross, cross_bg, router),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gfaas.bench.policy", description=__doc__.split("\n")[0])
    p.add_argument("-n", type=int, default=20000, help="samples per topology and kind")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--background", type=int, default=BACKGROUND, help="other transfers active (0: idle)")
    a = p.parse_args(argv)
    print(json.dumps(run(a.n, a.seed, a.background), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
