"""The cluster model: closed forms on small scenarios, and baselines behaving as configured."""

from __future__ import annotations

import pytest

from gfaas.errors import ConfigError
from gfaas.sim.cluster import Cluster
from gfaas.sim.dataplane import CHUNK
from gfaas.sim.experiments.moa import kv_passing_parts
from gfaas.sim.experiments.passing import infless_pinned, passing_parts, passing_seconds
from gfaas.sim.systems import CUDA_MALLOC_S, POOL_ALLOC_S, TRANSFER_SETUP_S, system
from gfaas.sim.workflows import DataEdge, Function, Workflow
from gfaas.topology import preset

MB = 10**6
V100 = preset("dgx-v100")


def test_host_centric_passing_is_two_pageable_copies() -> None:
    """INFless+: GPU -> host at 3 GB/s then host -> GPU at 3 GB/s, plus two transfer set-ups."""
    t = passing_seconds(V100, system("infless+"), "gpu0", "gpu3", 300 * MB)
    assert t == pytest.approx(2 * (0.1 + TRANSFER_SETUP_S), rel=1e-6)


def test_gfaas_passing_uses_every_free_nvlink_path() -> None:
    """gpu0 -> gpu3 idle: 48 direct + 4 x 24 indirect = 144 GB/s (the NVLink max flow), after a
    pooled allocation."""
    t = passing_seconds(V100, system("gfaas"), "gpu0", "gpu3", 1200 * MB)
    ideal = POOL_ALLOC_S + TRANSFER_SETUP_S + 1200 * MB / 144e9
    # Plan.split deals whole 2 MiB chunks, so the slowest path may carry up to one chunk more.
    assert ideal <= t <= ideal + CHUNK / 24e9


def test_without_elastic_pool_each_put_pays_a_cuda_malloc() -> None:
    with_pool = passing_seconds(V100, system("gfaas"), "gpu0", "gpu3", 12 * MB)
    without = passing_seconds(V100, system("gfaas-ES"), "gpu0", "gpu3", 12 * MB)
    assert without - with_pool == pytest.approx(CUDA_MALLOC_S - POOL_ALLOC_S, rel=1e-6)


def test_same_gpu_is_zero_copy() -> None:
    t = passing_seconds(V100, system("gfaas"), "gpu2", "gpu2", 500 * MB)
    assert t == pytest.approx(POOL_ALLOC_S + TRANSFER_SETUP_S)


def test_passing_parts_split_a_passing_into_its_put_and_its_get() -> None:
    """The decomposition the a10 and passing-latency rows print: INFless+ is two host copies of
    equal length; a random GPU store (NVSHMEM+) makes one copy when it picks the producer's or the
    consumer's GPU and two otherwise; gfaas one, after an allocation."""
    a10 = preset("4xa10")
    host = passing_parts(a10, system("infless+"), "gpu0", "gpu1", 16 * MB)
    assert (host["copies"], host["host_copies"]) == (2, 2)
    assert host["put_s"] == pytest.approx(host["get_s"]) == pytest.approx(16 * MB / 3e9 + TRANSFER_SETUP_S)
    pinned = passing_parts(a10, infless_pinned(), "gpu0", "gpu1", 16 * MB)  # the notes' second reading
    assert (pinned["copies"], pinned["host_copies"]) == (2, 2)
    assert pinned["put_s"] == pytest.approx(pinned["get_s"]) == pytest.approx(16 * MB / 24e9 + TRANSFER_SETUP_S)
    ours = passing_parts(a10, system("gfaas"), "gpu0", "gpu1", 16 * MB)
    assert (ours["copies"], ours["put_s"]) == (1, POOL_ALLOC_S)
    for seed in range(8):
        p = passing_parts(a10, system("nvshmem+"), "gpu0", "gpu1", 16 * MB, seed)
        store = Cluster(a10, system("nvshmem+"), seed=seed).store_device("gpu0")  # the same draw
        assert p["copies"] == (1 if store in ("gpu0", "gpu1") else 2), (seed, store)
        assert p["put_s"] + p["get_s"] == pytest.approx(p["total_s"])
        assert p["total_s"] == passing_seconds(a10, system("nvshmem+"), "gpu0", "gpu1", 16 * MB, seed)


def test_kv_passing_parts_add_up_for_the_shard_that_lands_last() -> None:
    topo = preset("h800x8*2")
    for name in ("gfaas", "infless+", "nvshmem+"):
        p = kv_passing_parts(topo, system(name), 4, 1024 * MB)
        assert p["put_s"] + p["get_s"] == pytest.approx(p["total_s"])
    host = kv_passing_parts(topo, system("infless+"), 1, 1024 * MB)
    assert host["put_s"] > 0 and host["get_s"] >= host["put_s"]  # down to host, then across and up


def test_host_to_gpu_harvests_route_gpus_only_with_bh() -> None:
    """gfaas stripes host -> gpu0 over 4 PCIe switches (48 GB/s); without BH only gpu0's own 12 GB/s."""
    fast = passing_seconds(V100, system("gfaas"), "host", "gpu0", 480 * MB)
    slow = passing_seconds(V100, system("gfaas-BH"), "host", "gpu0", 480 * MB)
    ideal = TRANSFER_SETUP_S + 480 * MB / 48e9
    assert ideal <= fast <= ideal + CHUNK / 12e9  # whole chunks per path
    assert slow == pytest.approx(TRANSFER_SETUP_S + 480 * MB / 12e9, rel=1e-3)


def _two_stage() -> Workflow:
    return Workflow("pair", "sequence", (Function("a", "gpu", "resnet50", batch=8),
                                         Function("b", "gpu", "resnet50", batch=8)),
                    (DataEdge("a", "b", 24 * MB),))


def test_one_request_latency_is_the_sum_of_its_stages() -> None:
    """a computes 11.5 ms, puts locally (pool), b gets 24 MB at 144 GB/s (gpu0/gpu3: the NVLink max flow) and computes."""
    c = Cluster(V100, system("gfaas"))
    (dep,) = c.deploy(_two_stage(), gpus=["gpu0", "gpu3"])
    assert sorted(dep.gpu.values()) == ["gpu0", "gpu3"]
    c.submit("pair", 0.0)
    (rec,) = c.run()
    bw = c.topo.nvlink_gbps(dep.gpu["a"], dep.gpu["b"])
    assert bw == 48.0
    expected = 2 * 0.0115 + POOL_ALLOC_S + TRANSFER_SETUP_S + 24 * MB / 144e9
    assert expected <= rec.latency <= expected + CHUNK / 24e9  # whole chunks per path
    get = TRANSFER_SETUP_S + 24 * MB / 144e9
    assert get <= rec.fns["b"].get_s <= get + CHUNK / 24e9


@pytest.mark.parametrize(("name", "alloc"), [("gfaas", POOL_ALLOC_S), ("gfaas-ES", CUDA_MALLOC_S)])
def test_passing_splits_into_gets_moves_and_allocations(name: str, alloc: float) -> None:
    """``parts_s`` adds up to ``passing_s``; a's one GPU put costs one allocation (a pooled one, or a
    cudaMalloc without the elastic pool), which is not part of the bytes' move."""
    c = Cluster(V100, system(name))
    c.deploy(_two_stage(), gpus=["gpu0", "gpu3"])
    c.submit("pair", 0.0)
    (rec,) = c.run()
    get, put, allocs = rec.parts_s
    assert get + put + allocs == pytest.approx(rec.passing_s, rel=1e-12)
    assert allocs == pytest.approx(alloc) and rec.fns["a"].alloc_s == pytest.approx(alloc)
    assert rec.fns["b"].alloc_s == 0.0  # b puts nothing on a GPU
    assert get == pytest.approx(rec.fns["b"].get_s + rec.fns["a"].get_s)


def test_requests_queue_fifo_on_a_shared_gpu() -> None:
    """Two requests at t=0 on one GPU: the second waits for the whole first execution."""
    wf = Workflow("one", "sequence", (Function("a", "gpu", "resnet50", batch=8),), ())
    c = Cluster(V100, system("gfaas"))
    c.deploy(wf, gpus=["gpu5"])
    c.submit("one", 0.0)
    c.submit("one", 0.0)
    first, second = c.run()
    assert first.latency == pytest.approx(0.0115)
    assert second.latency == pytest.approx(0.023)
    assert second.fns["a"].queue_s == pytest.approx(0.0115)


def test_same_seed_same_results() -> None:
    def once() -> list[float]:
        c = Cluster(V100, system("nvshmem+"), seed=3)
        c.deploy(_two_stage(), replicas=2)
        for i in range(20):
            c.submit("pair", i * 0.004)
        return [r.latency for r in c.run()]

    assert once() == once()


def test_undeployed_workflow_and_gpu_less_machine_are_errors() -> None:
    c = Cluster(V100, system("gfaas"))
    c.submit("pair", 0.0)
    with pytest.raises(ConfigError, match="not deployed"):
        c.run()
    with pytest.raises(ConfigError, match="no GPU"):
        Cluster(preset("cpu-only"), system("gfaas")).deploy(_two_stage())
    with pytest.raises(ConfigError, match="unknown system"):
        system("magic")


def test_a_request_leaves_no_garbage_for_the_cycle_collector() -> None:
    """What a request allocates (its closures, transfers, flows and their callbacks) is freed by
    reference counting as it finishes. One cycle (a transfer holding its flows, whose callbacks
    hold the transfer) once kept about 190 objects per request for the cycle collector, whose young
    collections then took a fifth of the wall time at 1,024 GPUs and grew with the cluster."""
    import gc

    from gfaas.sim.arrivals import poisson
    from gfaas.sim.workflows import workflow

    topo = preset("dgx-a100*2")
    c = Cluster(topo, system("gfaas"), seed=0)
    wf = workflow("traffic")
    c.deploy(wf, len(topo.gpus) // len(wf.gpu_functions))
    c.submit_many("traffic", poisson(40.0, 4.0, 1))
    c.run(1.0)  # first uses (route sets, profiles) leave their own one-time garbage
    gc.collect()
    done = sum(r.finish >= 0 for r in c.records)
    gc.disable()
    try:
        c.run()
        found = gc.collect()
    finally:
        gc.enable()
    requests = sum(r.finish >= 0 for r in c.records) - done
    assert requests > 100
    assert found < requests / 10, f"{found} objects in reference cycles after {requests} requests"
