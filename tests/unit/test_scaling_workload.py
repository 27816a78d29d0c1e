"""Rescaling an Azure LLM trace into a burst for the testbed."""

from __future__ import annotations

import numpy as np
import pytest

from gfaas.errors import ConfigError
from gfaas.scaling.workload import burst, percentile
from gfaas.sim.arrivals import LLMTrace
from gfaas.sim.bundled import trace_path


def _trace() -> LLMTrace:
    return LLMTrace(np.array([0.0, 10.0, 12.0, 30.0, 50.0]), np.array([64, 6400, 1, 640, 128]),
                    np.array([1, 30, 5, 100, 12]), None, "test")


def test_times_are_rescaled_keeping_relative_gaps() -> None:
    """Four requests from index 1 span 4 s: gaps 2, 18, 20 of 40 become 0.2, 1.8, 2.0 s."""
    reqs = burst(_trace(), 4, 4.0, vocab=100, start=1)
    assert [r.rid for r in reqs] == [0, 1, 2, 3]
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 0.2, 2.0, 4.0])


def test_lengths_are_scaled_and_clipped() -> None:
    """Context x 1/64 clipped to 4..64, generated x 1 clipped to 2..24; prompts within the vocab."""
    reqs = burst(_trace(), 5, 1.0, vocab=100)
    assert [len(r.prompt) for r in reqs] == [4, 64, 4, 10, 4]
    assert [r.gen for r in reqs] == [2, 24, 5, 24, 12]
    assert all(0 <= t < 100 for r in reqs for t in r.prompt)


def test_seeded_and_checked() -> None:
    """The same seed gives the same prompts, another seed others; out-of-range windows are refused."""
    assert burst(_trace(), 5, 1.0, 100, seed=1) == burst(_trace(), 5, 1.0, 100, seed=1)
    assert burst(_trace(), 5, 1.0, 100, seed=1) != burst(_trace(), 5, 1.0, 100, seed=2)
    with pytest.raises(ConfigError, match="requests 3..5 are not in a trace of 5"):
        burst(_trace(), 3, 1.0, 100, start=3)


def test_bundled_trace_burst() -> None:
    """The bundled Azure code trace gives 40 requests within the span, lengths in range."""
    from gfaas.sim.arrivals import load_azure_llm_trace

    reqs = burst(load_azure_llm_trace(trace_path("azure-llm-code")), 40, 2.0, 1024)
    assert len(reqs) == 40 and reqs[-1].arrival_s == pytest.approx(2.0)
    assert all(4 <= len(r.prompt) <= 64 and 2 <= r.gen <= 24 for r in reqs)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert np.isnan(percentile([], 90))
