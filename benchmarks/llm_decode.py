"""Size and speed of the Llama-style presets on this CPU (numpy): parameters, packed bytes, build,
pack and unpack times, prefill and greedy decoding rate of one request, in one process.

Run: ``OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/llm_decode.py [--presets tiny,small,demo]
[--prompt 64] [--tokens 32] [--json FILE]``. One BLAS thread: on a shared 2-core machine OpenBLAS's
spinning threads slow a busy process down many times (measured: 6 vs 153 tokens/s for ``medium``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from gfaas.models.llm import LlamaModel, LlamaStage, generate, packed_size, param_count, preset
from gfaas.provenance import provenance


def measure(name: str, prompt_len: int, tokens: int, blocks: int = 4) -> dict[str, Any]:
    cfg = preset(name)
    t0 = time.perf_counter()
    model = LlamaModel(cfg, seed=0)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    bufs = model.pack(blocks)
    packed = time.perf_counter() - t0
    t0 = time.perf_counter()
    stages = [LlamaStage.from_packed(cfg, [b]) for b in bufs]
    unpacked = time.perf_counter() - t0
    prompt = [(7 * i + 1) % cfg.vocab for i in range(prompt_len)]
    t0 = time.perf_counter()
    first = generate(stages, "r", prompt, 1)
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    rest = generate(stages, "r", prompt + first, tokens)
    decode = time.perf_counter() - t0
    return {"preset": name, "params": param_count(cfg), "dtype": cfg.dtype, "blocks": blocks,
            "packed_bytes": sum(packed_size(cfg, b, blocks) for b in range(blocks)),
            "build_s": round(built, 3), "pack_s": round(packed, 3), "unpack_s": round(unpacked, 4),
            "prompt": prompt_len, "prefill_s": round(prefill, 4), "tokens": tokens,
            "decode_tokens_per_s": round(tokens / decode, 1), "distinct_tokens": len(set(first + rest))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="tiny,small,medium,demo,demo-half")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = [measure(p, args.prompt, args.tokens) for p in args.presets.split(",")]
    for r in rows:
        print(f"{r['preset']:>9}  {r['params']:>12,} params  {r['packed_bytes'] / 1e6:8.1f} MB  "
              f"build {r['build_s']:.2f} s  prefill({r['prompt']}) {r['prefill_s'] * 1e3:7.1f} ms  "
              f"decode {r['decode_tokens_per_s']:7.1f} tok/s  distinct {r['distinct_tokens']}/{r['tokens'] + 1}")
    if args.json:
        out = {"provenance": provenance(), "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
