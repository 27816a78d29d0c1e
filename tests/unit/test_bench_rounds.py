"""``gfaas bench overload --rounds``: the order rounds run in, and what a count's line says over them."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gfaas.bench.overload import targets
from gfaas.bench.rounds import round_order, summarize


def _row(n: int, goodput: float, rnd: int = 0, *, p99: float | None = None, later: float | None = None,
         rejected: int = 0) -> dict[str, Any]:
    return {"connections": n, "round": rnd, "goodput_rps": goodput, "p50_ms": goodput / 100, "p99_ms": goodput / 50,
            "loadgen_cpu_frac": 0.3, "sent": 10 + rejected, "ok": 10, "rejected": rejected, "failed": 0, "lost": 0,
            "duplicated": 0, "reject_p99_ms": p99, "reject_p99_after_1s_ms": later}


def test_rounds_run_forward_then_backward() -> None:
    assert round_order([16, 256, 2000], 3) == [(0, 16), (0, 256), (0, 2000), (1, 2000), (1, 256), (1, 16),
                                               (2, 16), (2, 256), (2, 2000)]
    assert round_order([8], 2) == [(0, 8), (1, 8)]
    assert round_order([16, 2000], 1) == [(0, 16), (0, 2000)]


def test_a_count_takes_the_median_goodput_the_worst_refusal_p99_and_summed_counts() -> None:
    rows = [_row(16, 1600.0, 0), _row(2000, 1500.0, 0, p99=80.0, later=3.0, rejected=40),
            _row(2000, 1300.0, 1, p99=120.0, later=None, rejected=50), _row(16, 1900.0, 1),
            _row(16, 1700.0, 2), _row(2000, 1450.0, 2, p99=None, later=6.5, rejected=60)]
    low, high = summarize(rows)
    assert low["connections"] == 16 and low["rounds"] == 3 and low["goodput_rps"] == 1700.0
    assert low["goodput_runs"] == [1600.0, 1900.0, 1700.0]
    assert low["reject_p99_ms"] is None and low["rejected"] == 0
    assert high["goodput_rps"] == 1450.0 and high["goodput_runs"] == [1500.0, 1300.0, 1450.0]
    assert high["reject_p99_ms"] == 120.0 and high["reject_p99_after_1s_ms"] == 6.5
    assert high["rejected"] == 150 and high["sent"] == 30 + 150 and high["ok"] == 30


def test_targets_use_the_medians_not_the_last_round() -> None:
    rows = [_row(16, 2000.0, 0), _row(2000, 1000.0, 0), _row(2000, 1900.0, 1), _row(16, 2000.0, 1),
            _row(16, 2000.0, 2), _row(2000, 1850.0, 2)]
    doc = {"rows": rows, "invoke_p50_us": 300.0, "floor_us": 50.0, "cpu_ms_per_invocation": 0.3,
           "config": {"retry_after_cap_s": 30.0}}
    got = {t["id"]: t for t in targets(doc)}
    assert got["goodput_2000"]["value"] == 0.925 and got["goodput_2000"]["status"] == "pass"
    assert "medians of 3 rounds" in got["goodput_2000"]["target"]
    doc["rows"] = rows[:2]  # one round: the 1,000/s row alone decides
    assert {t["id"]: t for t in targets(doc)}["goodput_2000"]["status"] == "fail"


@given(st.lists(st.tuples(st.sampled_from([16, 256, 2000]), st.floats(1.0, 1e4)), min_size=1, max_size=12))
def test_each_median_lies_within_its_rounds_and_one_round_gives_its_row_back(pairs: list[tuple[int, float]]) -> None:
    rows = [_row(n, g, i) for i, (n, g) in enumerate(pairs)]
    lines = summarize(rows)
    assert [x["connections"] for x in lines] == list(dict.fromkeys(n for n, _ in pairs))
    for line in lines:
        runs = [g for n, g in pairs if n == line["connections"]]
        assert line["goodput_runs"] == runs and line["rounds"] == len(runs)
        assert min(runs) - 1e-3 <= line["goodput_rps"] <= max(runs) + 1e-3
        if len(runs) == 1:
            assert line["goodput_rps"] == round(runs[0], 3)
