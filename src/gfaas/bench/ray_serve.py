"""``gfaas bench ray-serve``: the overload benchmark's two-function pipeline through gfaas and through a
Ray Serve composition, in one run. Targets: gfaas at least 10x faster at 64 KiB (where the control
path is all there is) and 4x at 64 MiB, p50 against p50.

Both run the same work: ``gen`` makes a float32 array of ``n`` elements, ``red`` sums a strided slice
of it, and the answer is checked against the closed form. gfaas: ``gfaas bench overload``'s embedded
``LocalRuntime.invoke`` of the ``tiny`` workflow (:mod:`gfaas.workflows.tiny`: two worker processes,
the array carried in the task messages up to 64 KiB, passed through the node's data plane above),
with its breakdown. Ray Serve: two deployments, ``Gen`` calling ``Red`` through its
deployment handle (the array passed as a Ray object), driven through a handle from this process.
Requests go one at a time; the p50 of each is compared, per size.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any, cast

import numpy as np

from ..errors import ConfigError
from ..units import KiB, MiB, format_bytes, parse_size
from ..workflows.tiny import expected_total
from .overload import embedded_invoke

SIZES = "64KiB,4MiB,64MiB"
# (array size, the least Ray Serve p50 / gfaas p50 in the same run)
TARGETS = ((64 * KiB, 10.0), (64 * MiB, 4.0))


def _sizes(text: str) -> list[int]:
    try:
        out = [parse_size(s.strip()) for s in text.split(",") if s.strip()]
    except ValueError as exc:
        raise ConfigError(f"--sizes {text!r}: {exc}; give e.g. 64KiB,4MiB,64MiB") from None
    if not out or any(n < 4 * KiB for n in out):
        raise ConfigError(f"--sizes {text!r}: give sizes of at least 4KiB, e.g. 64KiB,4MiB,64MiB")
    return out


def _p50(xs: list[float]) -> float:
    return round(float(np.percentile(np.asarray(xs), 50)) * 1e3, 3)


def measure_gfaas(sizes: list[int], samples: int, warmup: int, say: Any) -> dict[int, dict[str, Any]]:
    """Per size: the overload benchmark's own embedded invocation (:func:`.overload.embedded_invoke`)."""
    out: dict[int, dict[str, Any]] = {}
    for size in sizes:
        out[size] = embedded_invoke(samples=samples, warmup=warmup, elements=size // 4)
        say(f"  gfaas {format_bytes(size)}: p50 {out[size]['p50_us'] / 1e3:.2f} ms")
    return out


def measure_bare(sizes: list[int], samples: int, warmup: int) -> dict[int, float]:
    """Per size, the p50 (ms) of the same work with no platform at all: ``gen`` and ``red`` called one
    after the other in this process. What each system adds is its p50 less this."""
    from ..runtime.context import in_process_context
    from ..workflows import tiny

    out: dict[int, float] = {}
    for size in sizes:
        n = size // 4
        lat = []
        for i in range(warmup + samples):
            t0 = time.perf_counter()
            ctx, refs = in_process_context({"n": np.asarray(n, dtype=np.int64)})
            x = tiny.gen(ctx, refs)["x"]
            ctx, refs = in_process_context({"x": x}, params={"stride": 4})
            tiny.red(ctx, refs)
            if i >= warmup:
                lat.append(time.perf_counter() - t0)
        out[size] = _p50(lat)
    return out


def measure_ray_serve(sizes: list[int], samples: int, warmup: int, say: Any) -> tuple[dict[int, list[float]], str]:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ConfigError("gfaas bench ray-serve needs Ray Serve: pip install -e '.[ray]'") from None

    @serve.deployment
    class Red:
        def __call__(self, x: np.ndarray) -> float:
            return float(x[::4].sum(dtype=np.float64))

    @serve.deployment
    class Gen:
        def __init__(self, red: Any) -> None:
            self.red = red

        async def __call__(self, n: int) -> float:
            x = np.arange(n, dtype=np.float32)
            total: float = await self.red.remote(x)
            return total

    ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    out: dict[int, list[float]] = {}
    try:
        app = cast(Any, Gen).bind(cast(Any, Red).bind())  # serve.deployment makes Deployments of the classes
        handle = serve.run(app, name="gfaas-compare", route_prefix=None)
        for size in sizes:
            n = size // 4
            lat = []
            for i in range(warmup + samples):
                t0 = time.perf_counter()
                total = handle.remote(n).result(timeout_s=120)
                took = time.perf_counter() - t0
                if not np.isclose(total, expected_total(n), rtol=1e-5):
                    raise RuntimeError(f"Ray Serve answered {total} for n={n}")
                if i >= warmup:
                    lat.append(took)
            out[size] = lat
            say(f"  Ray Serve {format_bytes(size)}: p50 {_p50(lat)} ms")
    finally:
        serve.shutdown()
        ray.shutdown()
    return out, str(ray.__version__)


def measure(sizes: list[int], samples: int = 30, warmup: int = 5, say: Any = None) -> dict[str, Any]:
    say = say or (lambda msg: None)
    t0 = time.perf_counter()
    say("gfaas: embedded LocalRuntime.invoke of gen -> red ...")
    g = measure_gfaas(sizes, samples, warmup, say)
    say("Ray Serve: Gen -> Red composition through deployment handles ...")
    r, version = measure_ray_serve(sizes, samples, warmup, say)
    bare = measure_bare(sizes, samples, warmup)
    rows = []
    for size in sizes:
        gfaas_ms = round(g[size]["p50_us"] / 1e3, 3)
        ray_ms = _p50(r[size])
        added = (gfaas_ms - bare[size], ray_ms - bare[size])  # what each platform adds to the bare work
        rows.append({"size_bytes": size, "gfaas_p50_ms": gfaas_ms, "ray_serve_p50_ms": ray_ms,
                     "ray_serve_over_gfaas": round(ray_ms / gfaas_ms, 2), "bare_p50_ms": bare[size],
                     "ray_serve_added_over_gfaas_added": round(added[1] / added[0], 2) if added[0] > 0 else None,
                     "gfaas_breakdown_p50_ms": g[size]["breakdown_p50_ms"]})
    targets = []
    for size, bound in TARGETS:
        row = next((r for r in rows if r["size_bytes"] == size), None)
        targets.append({"size_bytes": size, "bound": bound, "value": row["ray_serve_over_gfaas"] if row else None,
                        "what": f"the {format_bytes(size)} pipeline at least {bound:g}x faster than Ray Serve "
                                "(p50, same run)",
                        "met": None if row is None else row["ray_serve_over_gfaas"] >= bound})
    return {
        "rows": rows,
        "samples": samples, "warmup": warmup, "ray_version": version,
        "targets": targets,
        "duration_s": round(time.perf_counter() - t0, 1),
    }


def main(a: argparse.Namespace) -> int:
    from ..provenance import provenance
    from . import emit

    sizes = _sizes(a.sizes or SIZES)
    samples = 10 if a.quick else 30

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    doc = measure(sizes, samples=samples, warmup=2 if a.quick else 5, say=say)
    doc["provenance"] = provenance()
    if emit(doc, a.out, a.json):
        return 0
    print(f"{'size':>8} {'gfaas p50 ms':>13} {'Ray Serve p50 ms':>17} {'Ray Serve / gfaas':>18}")
    for row in doc["rows"]:
        print(f"{format_bytes(row['size_bytes']):>8} {row['gfaas_p50_ms']:13.2f} {row['ray_serve_p50_ms']:17.2f} "
              f"{row['ray_serve_over_gfaas']:17.1f}x")
    for t in doc["targets"]:
        print(f"target: {t['what']}: {t['value']}x ({'not measured' if t['met'] is None else 'met' if t['met'] else 'not met'})")
    return 0
