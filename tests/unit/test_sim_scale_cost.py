"""The simulator's cost per simulated request does not grow with the cluster (issue 24 item 3).

Measured inside one run, as a ratio with a generous bound (timings on a shared machine vary): the
wall time per request of ``gfaas bench simscale``'s setup at 32 nodes against 2 nodes, the same load
per GPU and the same number of requests (about 1,900), cluster construction included. Before issue
24's changes building the 32-node cluster took about 7 s (every node's route sets solved up front,
each cache lookup hashing the whole topology), more than 10x the time of its 640 simulated requests,
and the run itself cost 1.6x per request (one global fluid network, a heap holding every arrival).
Both sizes run the same number of requests since the native data plane and DAG stepping made a
request several times cheaper: over 640 requests the 32-node cluster's one-off costs (building it,
compiling the route sets of the pairs it uses) outweighed the requests themselves, and the ratio
measured those, not growth per request.

The bound is 4x. Per request, the 32-node cluster costs more than the 2-node one even with the same
requests: its requests overlap sixteen times as often and its objects spread over a larger working set.
On an Intel Xeon VM the best-of-five ratio stayed under 2.5x; on a 2-core AMD EPYC VM it was 1.5-2.7x on
a quiet machine and 2.64x in a full parallel test run (125.6 against 47.5 us), which failed a 2.5x bound.
What this guards against is still far outside 4x: a cluster whose construction or route compilation
grows with its size (7 s to build 32 nodes before issue 24, tens of times the run) or a per-request cost
that scans every node.
"""

from __future__ import annotations

import gc

from gfaas.bench.simscale import row


def test_cost_per_request_at_32_nodes_is_within_4x_of_2_nodes() -> None:
    small, large = [], []
    # Late in a full test run this process holds a large heap of earlier tests' objects, and each full
    # collection the bigger run triggers walks all of it: freeze it, so the ratio is the simulator's.
    gc.collect()
    gc.freeze()
    try:
        for _ in range(5):  # interleaved, best of five: a busy neighbour slows some samples, not the ratio
            small.append(float(row(2, 48.0)["us_per_request"]))  # type: ignore[arg-type]  # ~1,920 requests
            large.append(float(row(32, 3.0)["us_per_request"]))  # type: ignore[arg-type]  # ~1,920 requests
    finally:
        gc.unfreeze()
    assert min(large) <= 4.0 * min(small), (small, large)
