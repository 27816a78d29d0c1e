"""``gfaas.sim.cluster._due``: the policy's ``input_deadline`` in one frame, to the bit."""

import random

from gfaas.policy import input_deadline, slo_for
from gfaas.sim.cluster import _due


def test_due_is_input_deadline() -> None:
    rng = random.Random(7)
    starts = [0.0, 1e-9, 0.5, 3.0, 1e6] + [rng.uniform(0, 100) for _ in range(500)]
    computes = [0.0, -1.0, 1e-9, 1e-4, 2e-3, 0.01, 1.0] + [rng.uniform(0, 0.05) for _ in range(500)]
    for start in starts:
        for compute in computes:
            slo = slo_for(compute) if compute > 0 else 0.0
            assert _due(start, compute, slo) == input_deadline(start, compute), (start, compute)
