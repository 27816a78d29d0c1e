"""``gfaas bench pull``'s document (gfaas.bench.pull.document): rows and targets from the driver's
samples, with both outcomes of each target, and its argument checks."""

from __future__ import annotations

import pytest

from gfaas.bench import pull as P
from gfaas.errors import ConfigError

MiB = 1 << 20


def _samples(tcp: float, warm: float, cold: float, sizes: list[int]) -> dict[str, dict[str, list[float]]]:
    """Seconds per pull such that each system moves ``x`` GB/s at every size (three samples, median x)."""
    return {str(n): {k: [n / (g * 1e9) * f for f in (0.5, 1.0, 3.0)] for k, g in
                     (("tcp", tcp), ("warm", warm), ("cold", cold))} for n in sizes}


def test_document_rows_are_medians_and_the_targets_pass_at_their_bounds() -> None:
    sizes = [MiB, 64 * MiB]
    doc = P.document(_samples(2.0, 1.8, 0.9, sizes), sizes, 3, 1e5, 1.0, 2.0)
    big = doc["rows"][1]
    assert big["bytes"] == 64 * MiB and big["tcp_gbps"] == 2.0 and big["warm_gbps"] == 1.8
    assert big["warm_over_tcp"] == 0.9 and big["warm_over_cold"] == 2.0
    assert big["warm_ms"] == round(64 * MiB / 1.8e9 * 1e3, 3)
    assert [(t["id"], t["value"], t["status"]) for t in doc["targets"]] == [("tcp", 0.9, "pass"), ("cold", 2.0, "pass")]
    assert "warm_over_engine" not in big


def test_document_targets_fail_below_their_bounds_and_count_only_large_sizes_for_tcp() -> None:
    sizes = [MiB, 64 * MiB, 256 * MiB]
    s = _samples(2.0, 1.9, 1.0, sizes)
    s[str(MiB)]["warm"] = [x * 10 for x in s[str(MiB)]["warm"]]  # 1 MiB: far below tcp, and below cold
    s[str(256 * MiB)]["warm"] = [x * 2.5 for x in s[str(256 * MiB)]["warm"]]  # 256 MiB: 0.76 GB/s
    doc = P.document(s, sizes, 3, 1e5, 1.0, 2.0)
    tcp, cold = doc["targets"]
    assert tcp["status"] == "fail" and tcp["value"] == round(0.76 / 2.0, 3)  # 1 MiB is not counted...
    assert cold["status"] == "fail" and cold["value"] == round(0.19 / 1.0, 3)  # ...but is for cold
    only_small = P.document(_samples(2.0, 0.1, 0.05, [MiB]), [MiB], 3, 1e5, 1.0, 2.0)
    assert only_small["targets"][0]["status"] is None  # no size of 64 MiB or more: not judged


def test_document_has_an_engine_row_when_measured() -> None:
    sizes = [64 * MiB]
    s = _samples(2.0, 1.8, 0.9, sizes)
    s[str(64 * MiB)]["engine"] = [64 * MiB / 1.2e9] * 3
    assert P.document(s, sizes, 3, 1e5, 1.0, 2.0)["rows"][0]["warm_over_engine"] == 1.5


@pytest.mark.parametrize("text", ["", "512KiB", "1MiB,2GiB", "lots"])
def test_sizes_outside_1MiB_to_1GiB_are_refused_with_an_example(text: str) -> None:
    with pytest.raises(ConfigError, match="e.g. 1MiB"):
        P.parse_sizes(text)
