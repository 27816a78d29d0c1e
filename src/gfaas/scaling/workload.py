"""Requests for the scaling experiments: a burst cut from an Azure LLM trace, rescaled to the testbed.

The trace (``TIMESTAMP,ContextTokens,GeneratedTokens``; the bundled one is the Azure LLM inference
trace 2023, code) times requests in seconds and sizes them for a 7B-70B model on GPUs; the testbed
serves a small model on two CPUs, so :func:`burst` keeps the trace's order, relative gaps and
relative lengths and rescales both: arrival times so that ``count`` consecutive requests span
``span_s`` seconds, context lengths by ``context_scale`` and generated lengths by ``gen_scale``,
each clipped to a range the model serves. Prompt token ids are drawn from a seeded generator.
Pure: no clock, no files (the caller loads the trace).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..sim.arrivals import LLMTrace


@dataclass(frozen=True)
class Request:
    """Request ``rid`` arrives ``arrival_s`` after the burst starts with ``prompt`` and wants ``gen``
    more tokens."""

    rid: int
    arrival_s: float
    prompt: tuple[int, ...]
    gen: int


def burst(trace: LLMTrace, count: int, span_s: float, vocab: int, start: int = 0, context_scale: float = 1 / 64,
          gen_scale: float = 1.0, context_range: tuple[int, int] = (4, 64), gen_range: tuple[int, int] = (2, 24),
          seed: int = 0) -> list[Request]:
    """``count`` consecutive requests of ``trace`` from index ``start``, rescaled (module docstring)."""
    if count < 1 or start < 0 or start + count > len(trace):
        raise ConfigError(f"requests {start}..{start + count - 1} are not in a trace of {len(trace)}; "
                          f"pass 1 <= count and start + count <= {len(trace)}")
    if not span_s >= 0:
        raise ConfigError(f"span_s={span_s}: give a span >= 0 seconds")
    times = trace.arrivals[start:start + count] - trace.arrivals[start]
    width = float(times[-1])
    times = times * (span_s / width) if width > 0 else np.zeros_like(times)
    ctx = np.clip(np.rint(trace.context_tokens[start:start + count] * context_scale), *context_range).astype(int)
    gen = np.clip(np.rint(trace.generated_tokens[start:start + count] * gen_scale), *gen_range).astype(int)
    rng = np.random.default_rng(seed)
    return [Request(i, float(times[i]), tuple(int(t) for t in rng.integers(0, vocab, int(ctx[i]))), int(gen[i]))
            for i in range(count)]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation, numpy's default); NaN for no values."""
    return float(np.percentile(values, q)) if values else float("nan")
