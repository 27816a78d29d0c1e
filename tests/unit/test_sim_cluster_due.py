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


def test_every_transfer_of_a_run_is_due_at_input_deadline() -> None:
    """``_Exec.body`` and ``_Exec.go`` inline ``_due``: each transfer they start is due at
    ``input_deadline(now, compute)`` of the function that starts it, to the bit."""
    from gfaas.sim.arrivals import poisson
    from gfaas.sim.cluster import Cluster
    from gfaas.sim.systems import system
    from gfaas.sim.workflows import workflow
    from gfaas.topology import preset

    c = Cluster(preset("dgx-a100"), system("gfaas"), seed=0)
    assert c.memory is None  # every transfer goes through plane.move
    c.deploy(workflow("traffic"), 2)
    seen: list[tuple[float, float]] = []
    move = c.plane.move

    def recording(src: str, dst: str, nbytes: int, on_done: object, deadline: float = 0.0) -> None:
        seen.append((c.sim.now, deadline))
        move(src, dst, nbytes, on_done, deadline)

    c.plane.move = recording  # type: ignore[method-assign]
    c.submit_many("traffic", poisson(20.0, 1.0, 1))
    recs = c.run()
    assert recs and all(r.finish >= 0 for r in recs)
    computes = {cost[0] for cost in c._fn_cost.values()}
    assert len(computes) >= 2 and len(seen) > 3 * len(recs)
    for now, deadline in seen:
        assert any(deadline == input_deadline(now, compute) for compute in computes), (now, deadline)
