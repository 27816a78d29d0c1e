"""CPU latency of every zoo model at batch 1 with its default input, as a Markdown table.

    .venv/bin/python benchmarks/model_latency.py [--scale full|small|both] [--runs 10]
        [--models resnet50,yolo] [--threads N] [--cache-dir DIR]

For each model: parameters (ours, and the reference at full scale), the time to build and cache the
file (0 when it was already cached), the time to open an onnxruntime session on it, the first call
(warm-up) and the median / min of ``--runs`` further calls. Full-scale models are built into the
cache on first use (about 1.3 GB in all; GPT-2 is 0.5 GB), so the first run takes a few minutes.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import onnxruntime as ort

import gfaas.models as models


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=["full", "small", "both"], default="full")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--models", default=",".join(models.names()))
    ap.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads (default: its own)")
    ap.add_argument("--cache-dir", default=None, help="default: $GFAAS_CACHE_DIR or ~/.cache/gfaas/models")
    a = ap.parse_args()
    scales = ["small", "full"] if a.scale == "both" else [a.scale]
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, "
          f"threads={a.threads or 'default'}, batch 1, median of {a.runs} runs after one warm-up\n")
    print("| model | scale | input | params | reference | build s | session s | first ms | median ms | min ms |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for scale in scales:
        for name in a.models.split(","):
            info = models.info(name, scale)
            cached = (models.resolve_cache_dir(a.cache_dir) / f"{name}-{scale}-0-{models.VERSION}.onnx").exists()
            t = time.perf_counter()
            models.path(name, scale, 0, a.cache_dir)
            build = 0.0 if cached else time.perf_counter() - t
            t = time.perf_counter()
            m = models.load(name, scale, cache_dir=a.cache_dir, threads=a.threads)
            session = time.perf_counter() - t
            x = m.example_inputs()
            t = time.perf_counter()
            m(**x)
            first = time.perf_counter() - t
            times = []
            for _ in range(a.runs):
                t = time.perf_counter()
                m(**x)
                times.append(time.perf_counter() - t)
            shape = "x".join(str(d) for d in next(iter(info.inputs.values()))[0])
            ref = f"{info.reference_params:,}" if info.reference_params else "-"
            print(f"| {name} | {scale} | {shape} | {models.param_count(name, scale):,} | {ref} | {build:.2f} | "
                  f"{session:.2f} | {_ms(first)} | {_ms(statistics.median(times))} | {_ms(min(times))} |",
                  flush=True)
            del m


if __name__ == "__main__":
    main()
