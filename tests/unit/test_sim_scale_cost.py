"""The simulator's cost per simulated request does not grow with the cluster (issue 24 item 3).

Measured inside one run, as a ratio with a generous bound (timings on a shared machine vary): the
wall time per request of ``gfaas bench simscale``'s setup at 32 nodes against 2 nodes, the same load
per GPU, cluster construction included. Before the network was partitioned per component, the heap
fed lazily and the route sets shared between identical nodes, the ratio was about 1.6 at 32 nodes and
4.5 at 128, and building the Router of a 32-node cluster alone took seconds.
"""

from __future__ import annotations

from gfaas.bench.simscale import row


def _us_per_request(nodes: int, seconds: float) -> float:
    return min(float(row(nodes, seconds)["us_per_request"]) for _ in range(2))  # type: ignore[arg-type]


def test_cost_per_request_at_32_nodes_is_within_2_5x_of_2_nodes() -> None:
    small = _us_per_request(2, 4.0)  # about 160 requests
    large = _us_per_request(32, 0.5)  # about 320 requests
    assert large <= 2.5 * small, (small, large)
