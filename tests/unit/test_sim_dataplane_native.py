"""The native data plane (``gfaas_native.DataPlaneCore``) against the reference ``PyDataPlane``.

Both run on the same kernel, network and router classes, so any difference comes from the transfer
lifecycle: planning, ``Plan.split``, re-routing, the SLO shares of host links, caps. Each scenario
records every completion (time, transfer), every live flow (rate, cap, bytes, finish) and every
edge's bytes at checkpoints, and the events the kernel ran; the two must be equal, floats exactly.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gfaas.errors import ConfigError
from gfaas.sim import dataplane
from gfaas.sim.dataplane import NativeDataPlane, PyDataPlane, native_dataplane_available
from gfaas.sim.kernel import Simulator
from gfaas.sim.systems import SystemConfig, system
from gfaas.topology import preset

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
from sim_switch import printed_with  # noqa: E402

pytestmark = pytest.mark.skipif(not native_dataplane_available(),
                                reason="gfaas_native (with DataPlaneCore) is not built here: make setup builds it "
                                       "(needs cargo)")

MB = 1 << 20
Move = tuple[float, str, str, int, float]  # (at, src, dst, nbytes, deadline)


def _done(log: list[tuple[Any, ...]], sim: Any, i: int) -> None:
    log.append(("done", sim.now, i))


def _snapshot(log: list[tuple[Any, ...]], sim: Any, dp: Any) -> None:
    flows = sorted((f.ident, f.rate, f.cap, f.remaining, f.t, f.finish, f.edges) for f in dp.net.flows.values())
    log.append(("flows", sim.now, flows))
    log.append(("bytes", sim.now, sorted(dp.net.bytes_moved.items())))
    log.append(("active", sim.now, sorted(dp.active)))


class _Count:
    """What the reference did that the scenario is meant to exercise: re-routes and direct fallbacks."""

    def __init__(self, dp: PyDataPlane) -> None:
        self.rerouted = 0
        self.direct = 0
        changed, plan = dp.router.changed, dp._direct.plan

        def counted_changed() -> Any:
            plans = changed()
            self.rerouted += sum(1 for p in plans if p.transfer in dp.active and dp.active[p.transfer].flows)
            return plans

        def counted_plan(*a: Any) -> Any:
            self.direct += 1
            return plan(*a)

        dp.router.changed = counted_changed  # type: ignore[method-assign]
        dp._direct.plan = counted_plan  # type: ignore[method-assign]


def _run(cls: type[Any], topo: str, cfg: SystemConfig, moves: list[Move], *, checkpoints: int = 12,
         count: bool = False) -> tuple[list[tuple[Any, ...]], _Count | None]:
    sim = Simulator()
    dp = cls(sim, preset(topo), cfg)
    counter = _Count(dp) if count else None
    log: list[tuple[Any, ...]] = []
    for i, (at, src, dst, n, deadline) in enumerate(moves):
        sim.at(at, dp.move, src, dst, n, partial(_done, log, sim, i), deadline)
    end = max((m[0] for m in moves), default=0.0)
    for k in range(checkpoints):
        sim.at(end * k / max(checkpoints - 1, 1) + 1e-4 * k, _snapshot, log, sim, dp)
    sim.run()
    _snapshot(log, sim, dp)
    log.append(("events", sim.events_run))
    return log, counter


def _same(topo: str, cfg: SystemConfig, moves: list[Move], **kw: Any) -> _Count:
    ref, counter = _run(PyDataPlane, topo, cfg, moves, count=True, **kw)
    nat, _ = _run(NativeDataPlane, topo, cfg, moves, **kw)
    assert sum(1 for e in ref if e[0] == "done") == len(moves)  # every transfer landed
    assert len(nat) == len(ref)
    for a, b in zip(ref, nat, strict=True):
        assert a == b
    assert counter is not None
    return counter


def _burst(srcs: list[str], dsts: list[str], n: int, *, size: int = 64 * MB, gap: float = 3e-4,
           deadline: float = 5e-3) -> list[Move]:
    """``n`` transfers that overlap, cycling through the pairs, with mixed sizes and deadlines."""
    out = []
    for i in range(n):
        s, d = srcs[i % len(srcs)], dsts[(i * 7 + 3) % len(dsts)]
        if s == d:
            d = dsts[(i * 7 + 4) % len(dsts)]
        at = i * gap
        out.append((at, s, d, size // (1 + i % 5) + i * 4099, at + deadline * (1 + i % 3) if i % 4 else at + 1e-5))
    return out


GPUS = [f"gpu{i}" for i in range(8)]


@pytest.mark.parametrize("slo", [True, False])
@pytest.mark.parametrize("pinned", ["ring", "alloc", "pageable"])
def test_host_transfers_with_slo_shares_and_pinning_are_the_reference_run(slo: bool, pinned: str) -> None:
    cfg = replace(system("gfaas"), slo_control=slo, pinned=pinned)  # type: ignore[arg-type]
    up = _burst(["host"], GPUS, 24)
    down = [(at + 1e-4, d, s, n, dl) for at, s, d, n, dl in _burst(["host"], GPUS, 12, gap=7e-4)]
    _same("dgx-v100", cfg, up + down)


def test_late_transfers_share_the_host_links_in_proportion_to_their_bytes() -> None:
    """Deadlines already past at the start: slo_rates' late branch, every time a transfer starts or ends."""
    moves = [(i * 1e-4, "host", GPUS[i % 8], (i + 1) * 3 * MB + 17, 0.0) for i in range(16)]
    _same("dgx-a100", system("gfaas"), moves)


@pytest.mark.parametrize("name", ["gfaas", "gfaas-TA", "gfaas-BH", "deepplan+", "nvshmem+", "faastube*"])
def test_gpu_to_gpu_transfers_are_the_reference_run(name: str) -> None:
    moves = _burst(GPUS, GPUS, 40, gap=1e-4)
    _same("dgx-v100", system(name), moves)


def test_pcie_only_gpus_are_capped_at_the_p2p_rate_as_in_the_reference() -> None:
    moves = _burst([f"gpu{i}" for i in range(4)], [f"gpu{i}" for i in range(4)], 16, gap=2e-4)
    moves += _burst(["host"], [f"gpu{i}" for i in range(4)], 8, gap=5e-4)
    _same("4xa10", system("gfaas"), moves)


def test_re_routed_transfers_move_their_remaining_bytes_as_in_the_reference() -> None:
    """Newcomers claim direct links back from transfers using them as indirect hops (``_apply_changes``)."""
    moves = _burst(GPUS, GPUS, 60, size=256 * MB, gap=2e-4)
    counter = _same("dgx-v100", system("gfaas"), moves)
    assert counter.rerouted > 0, "the scenario no longer re-routes anything: make it"


def test_cross_node_transfers_and_direct_fallbacks_are_the_reference_run() -> None:
    n0 = [f"n0.gpu{i}" for i in range(8)] + ["n0.host"]
    n1 = [f"n1.gpu{i}" for i in range(8)] + ["n1.host"]
    moves = _burst(n0, n1, 40, size=128 * MB, gap=1e-4) + _burst(n1, n0, 20, size=32 * MB, gap=2e-4)
    counter = _same("dgx-v100*2", system("gfaas"), moves)
    assert counter.direct > 0 or counter.rerouted > 0


def test_trivial_moves_finish_as_in_the_reference() -> None:
    """Same device (a setup time), nothing to move (at once), in the same order as real ones."""
    moves = [(0.0, "gpu0", "gpu0", 10 * MB, 0.0), (0.0, "gpu1", "gpu2", 0, 0.0), (0.0, "host", "gpu3", -5, 0.0),
             (0.0, "gpu1", "gpu2", 1, 0.0), (1e-5, "host", "gpu0", 1, 1.0)]
    _same("dgx-a100", system("gfaas"), moves, checkpoints=3)


def test_a_cluster_run_prints_the_same_numbers_with_either_data_plane() -> None:
    """Whole experiments, each data plane in its own process: the same bytes."""
    out = {dp: printed_with("GFAAS_SIM_DATAPLANE", dp, "nvlink-vs-mapa,isolation") for dp in ("python", "native")}
    assert len(out["python"]) > 1000
    assert out["native"] == out["python"]


# ---- bad input: the same errors ---------------------------------------------------------------------

def _error(cls: type[Any], src: str, dst: str, deadline: float = 1.0) -> str:
    sim = Simulator()
    dp = cls(sim, preset("dgx-a100"), system("gfaas"))
    with pytest.raises(ConfigError) as e:
        dp.move(src, dst, 10 * MB, lambda: None, deadline)
        sim.run()
    return str(e.value)


@pytest.mark.parametrize("src,dst,deadline", [("gpu0", "gpu99", 1.0), ("nowhere", "gpu1", 1.0),
                                              ("host", "gpu1", math.nan)])
def test_bad_input_raises_the_references_config_error(src: str, dst: str, deadline: float) -> None:
    ref = _error(PyDataPlane, src, dst, deadline)
    assert _error(NativeDataPlane, src, dst, deadline) == ref
    assert ("gpu99" in ref or "nowhere" in ref) if math.isfinite(deadline) else "deadline is NaN" in ref


def test_the_data_plane_is_chosen_like_the_core_and_can_be_kept_python() -> None:
    code = "from gfaas.sim.dataplane import DataPlane; print(DataPlane.__name__)"

    def run(**env: str) -> subprocess.CompletedProcess[str]:
        e = {k: v for k, v in os.environ.items() if k not in ("GFAAS_SIM_CORE", "GFAAS_SIM_DATAPLANE")}
        return subprocess.run([sys.executable, "-c", code], env=dict(e, **env), capture_output=True, text=True,
                              timeout=120)

    assert run().stdout.split() == ["NativeDataPlane"]
    assert run(GFAAS_SIM_DATAPLANE="python").stdout.split() == ["PyDataPlane"]
    assert run(GFAAS_SIM_CORE="python").stdout.split() == ["PyDataPlane"]
    # the Python core is all reference: a benchmark's reference child inherits the variable
    assert run(GFAAS_SIM_CORE="python", GFAAS_SIM_DATAPLANE="native").stdout.split() == ["PyDataPlane"]
    bad = run(GFAAS_SIM_DATAPLANE="fast")
    assert bad.returncode != 0 and "GFAAS_SIM_DATAPLANE='fast'" in bad.stderr
    assert dataplane.DataPlane in (PyDataPlane, NativeDataPlane)


# ---- a property: random transfer sequences on a small cluster ---------------------------------------

_DEVICES = ["n0.host", "n0.gpu0", "n0.gpu1", "n0.gpu2", "n0.gpu3", "n1.host", "n1.gpu0", "n1.gpu2"]
_SYSTEMS = ["gfaas", "gfaas-BH", "gfaas-TA", "infless+", "faastube*", "deepplan+"]

_move = st.tuples(st.floats(0.0, 2e-3, allow_nan=False), st.sampled_from(_DEVICES), st.sampled_from(_DEVICES),
                  st.integers(0, 300 * MB), st.floats(-1e-3, 1e-2, allow_nan=False))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_move, min_size=1, max_size=24), st.sampled_from(_SYSTEMS), st.booleans())
def test_random_transfer_sequences_complete_at_the_same_times_with_the_same_bytes_per_edge(
        moves: list[Move], name: str, slo: bool) -> None:
    cfg = replace(system(name), slo_control=slo)
    moves = [(at, s, d, n, at + dl) for at, s, d, n, dl in moves]
    _same("dgx-v100*2", cfg, moves, checkpoints=4)


def test_an_abandoned_run_with_transfers_in_flight_is_collected() -> None:
    """The core holds the caller's callbacks and its flows' callbacks hold the core: the cycle
    collector must see through it, also with transfers waiting and flows live."""
    import gc

    freed: list[int] = []

    class Model:
        def __del__(self) -> None:
            freed.append(1)

        def done(self) -> None:
            pass

    for _ in range(3):
        m, sim = Model(), Simulator()
        m.plane = NativeDataPlane(sim, preset("dgx-a100"), system("gfaas"))  # type: ignore[attr-defined]
        for _, s, d, n, dl in _burst(["host", *GPUS], GPUS, 12):
            sim.at(1e-5, m.plane.move, s, d, n, m.done, dl)  # type: ignore[attr-defined]
        sim.run(1e-4)
        assert m.plane.active  # type: ignore[attr-defined]
        del m, sim
    gc.collect()
    assert len(freed) == 3
