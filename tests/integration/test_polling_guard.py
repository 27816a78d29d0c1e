"""A guard on the waiters' polling (policy.polling): with it on, the tiny embedded invocation is not
slower than with it off, in the same minutes. On an idle 2-vCPU machine it is faster (``make
profile-results``: ``without_polling`` in benchmarks/results/profile-after-cpu.json); the bound here
is generous, a ratio inside one run, never an absolute time."""

from __future__ import annotations

import numpy as np
import pytest

from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.workflows.tiny import SPEC, timed_invokes

pytestmark = pytest.mark.timeout(300)


def _p50_us(rt: LocalRuntime, n: int) -> float:
    return float(np.median(timed_invokes(rt, n))) * 1e6


def test_polling_does_not_slow_the_tiny_invocation() -> None:
    cfg = {"sandbox": "none", "queue_hints": False}
    with LocalRuntime(RuntimeConfig(poll_us=0, **cfg)) as off, LocalRuntime(RuntimeConfig(**cfg)) as on:
        for rt in (off, on):
            rt.deploy(SPEC)
            _p50_us(rt, 50)
        rounds = [(_p50_us(off, 300), _p50_us(on, 300)) for _ in range(3)]  # interleaved: the same minutes
    off_us = float(np.median([a for a, _ in rounds]))
    on_us = float(np.median([b for _, b in rounds]))
    assert on_us <= 1.3 * off_us, f"polling {on_us:.0f} us against {off_us:.0f} us without, rounds {rounds}"
