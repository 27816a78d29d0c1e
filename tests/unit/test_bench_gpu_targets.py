"""The GPU benchmark's target arithmetic, on made-up rows (the rows themselves need a GPU)."""

from __future__ import annotations

import pytest

from gfaas.bench.gpu import _row, ipc_row, targets
from gfaas.policy.pool import MiB


def test_targets_compare_against_peers_of_the_same_run() -> None:
    n = 64 * MiB
    rows = [
        _row("h2d", "gfaas-ring", n, n / 46e9), _row("h2d", "cuda-pinned", n, n / 50e9),
        _row("h2d", "cuda-pageable", n, n / 20e9),
        _row("same-gpu-get", "gfaas-ipc", n, 30e-6), _row("same-gpu-get", "host-round-trip", n, 6e-3),
        _row("alloc", "gfaas-pool", MiB, 2e-6), _row("alloc", "cuda-malloc", MiB, 100e-6),
    ]
    got = {t["target"]: (t["value"], t["met"]) for t in targets(rows)}
    assert got["h2d 64 MiB ring >= 90% of pinned"] == (0.92, True)
    assert got["h2d 64 MiB ring >= 2x pageable"] == (2.3, True)
    assert got["same-GPU 64 MiB get >= 100x faster than host round trip"] == (200.0, True)
    assert got["same-GPU get p50 <= 50 us"] == (30.0, True)
    assert got["pool alloc 1 MiB >= 100x faster than cudaMalloc+cudaFree"] == (50.0, False)
    assert not any("d2h" in t for t in got)  # no d2h rows measured, no d2h verdicts invented


def test_the_ipc_row_times_gets_of_arenas_already_open() -> None:
    """cudaIpcOpenMemHandle is paid once per arena: gets that opened one are counted and the first is
    reported, but the row's p50 is of the gets whose arena was open (issue 18, item 8)."""
    gets = [(900e-6, True), (850e-6, True), (30e-6, False), (20e-6, False), (25e-6, False), (700e-6, True)]
    row = ipc_row(64 * MiB, gets)
    assert row["p50_us"] == 25.0 and row["cold_gets"] == 3 and row["first_get_us"] == 900.0
    assert (row["kind"], row["system"], row["size_bytes"]) == ("same-gpu-get", "gfaas-ipc", 64 * MiB)
    assert ipc_row(MiB, [(10e-6, False)])["first_get_us"] is None
    with pytest.raises(SystemExit, match="every same-GPU get opened a new arena"):
        ipc_row(MiB, [(900e-6, True)])
