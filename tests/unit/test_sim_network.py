"""The fluid network model against hand-computed max-min fair schedules."""

from __future__ import annotations

import pytest

from gfaas.errors import ConfigError
from gfaas.sim.kernel import Simulator
from gfaas.sim.network import Network
from gfaas.topology import Device, Link, Topology

# Every test here runs on each implementation (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("sim_core")

GB = 1e9


def line() -> Topology:
    """a -(10 GB/s)- b -(4 GB/s)- c, and a -(2 GB/s)- d."""
    devs = tuple(Device(n, "gpu") for n in "abcd")
    return Topology("line", devs, (Link("a", "b", "nvlink", 10), Link("b", "c", "nvlink", 4),
                                   Link("a", "d", "pcie", 2)))


def run(flows: list[tuple[list[str], float, float | None, float]]) -> dict[int, float]:
    """Start flows (hops, bytes, cap GB/s, start time); return each one's finish time."""
    sim = Simulator()
    net = Network(sim, line())
    done: dict[int, float] = {}
    for i, (hops, nbytes, cap, at) in enumerate(flows):
        sim.at(at, lambda i=i, hops=hops, nbytes=nbytes, cap=cap: net.start(
            hops, nbytes, lambda: done.__setitem__(i, sim.now), cap))
    sim.run()
    return done


def test_single_flow_runs_at_the_bottleneck() -> None:
    """A two-hop flow moves at its narrowest link: 8 GB over min(10, 4) GB/s = 2 s."""
    assert run([(["a", "b", "c"], 8 * GB, None, 0.0)]) == {0: pytest.approx(2.0)}


def test_two_flows_share_a_link_equally_then_the_survivor_speeds_up() -> None:
    """Flows of 10 and 20 GB on a 10 GB/s link: 5 GB/s each until t=2, then 10 GB/s: ends at 2 and 3."""
    done = run([(["a", "b"], 10 * GB, None, 0.0), (["a", "b"], 20 * GB, None, 0.0)])
    assert done == {0: pytest.approx(2.0), 1: pytest.approx(3.0)}


def test_max_min_fairness_gives_leftover_to_the_unconstrained_flow() -> None:
    """a->b->c is held to 4 GB/s by b->c, so a->b gets the other 6 of a->b's 10."""
    done = run([(["a", "b", "c"], 4 * GB, None, 0.0), (["a", "b"], 6 * GB, None, 0.0)])
    assert done == {0: pytest.approx(1.0), 1: pytest.approx(1.0)}


def test_cap_limits_a_flow_and_others_use_the_rest() -> None:
    """A flow capped at 1 GB/s next to an uncapped one: 1 and 9 GB/s."""
    done = run([(["a", "b"], 1 * GB, 1.0, 0.0), (["a", "b"], 9 * GB, None, 0.0)])
    assert done == {0: pytest.approx(1.0), 1: pytest.approx(1.0)}


def test_late_arrival_slows_the_first_flow() -> None:
    """10 GB alone for 0.5 s (5 GB), then shared at 5 GB/s: the first ends at 1.5, the second (5 GB) at 1.5."""
    done = run([(["a", "b"], 10 * GB, None, 0.0), (["a", "b"], 5 * GB, None, 0.5)])
    assert done == {0: pytest.approx(1.5), 1: pytest.approx(1.5)}


def test_directions_are_independent() -> None:
    """a->b and b->a each get the full 10 GB/s."""
    done = run([(["a", "b"], 10 * GB, None, 0.0), (["b", "a"], 10 * GB, None, 0.0)])
    assert done == {0: pytest.approx(1.0), 1: pytest.approx(1.0)}


def test_set_cap_changes_the_rate_mid_flight() -> None:
    sim = Simulator()
    net = Network(sim, line())
    done: list[float] = []
    f = net.start(["a", "d"], 4 * GB, lambda: done.append(sim.now), cap_gbps=1.0)
    sim.at(1.0, net.set_cap, f, None)  # 3 GB left at 2 GB/s
    sim.run()
    assert done == [pytest.approx(2.5)]


def test_bad_paths_are_refused() -> None:
    net = Network(Simulator(), line())
    with pytest.raises(ConfigError, match="c->d"):
        net.start(["c", "d"], 1, lambda: None)
    with pytest.raises(ConfigError, match="-1"):
        net.start(["a", "b"], -1, lambda: None)


def test_bytes_moved_are_accounted_per_edge() -> None:
    sim = Simulator()
    net = Network(sim, line())
    net.start(["a", "b", "c"], 3 * GB, lambda: None)
    sim.run()
    assert net.bytes_moved[("a", "b")] == pytest.approx(3 * GB)
    assert net.bytes_moved[("b", "c")] == pytest.approx(3 * GB)


def test_a_finished_or_abandoned_simulation_is_collected() -> None:
    """Callbacks refer back to the model that holds the kernel and the network: those cycles must be
    collectable on every core (the native classes report what they hold to the cycle collector),
    also when the run stopped with events and flows pending."""
    import gc

    freed: list[int] = []

    class Model:
        def __del__(self) -> None:
            freed.append(1)

        def cb(self) -> None:
            pass

    for _ in range(4):
        m, sim = Model(), Simulator()
        m.sim, m.net = sim, Network(sim, line())
        sim.schedule(5.0, m.cb)
        sim.at_many([6.0, 7.0], m.cb)
        m.net.start(["a", "b", "c"], 100 * GB, m.cb)
        sim.run(1.0)
        del m, sim
    gc.collect()
    assert len(freed) == 4
