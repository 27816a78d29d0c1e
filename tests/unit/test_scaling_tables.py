"""benchmarks/scale_tables.py: the Measured block of docs/scaling.md comes from the committed result."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "scale-netns.json"
PAGE = ROOT / "docs" / "scaling.md"


@pytest.fixture()
def scale_tables(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import scale_tables  # type: ignore[import-not-found]

    return scale_tables


def _doc(ratio: float, tree_s: float, gain: float, identical: bool) -> dict[str, Any]:
    mc = [{"scheme": "binomial", "sources": 1, "nodes": 8, "blocks": 8, "seconds": 3.0 * ratio,
           "bound_seconds": 3.0, "steps": 10, "node_cpu_seconds": 0.5, "node_cpu_share_of_host": 0.07},
          {"scheme": "tree", "sources": 1, "nodes": 8, "blocks": 8, "seconds": tree_s, "bound_seconds": 6.1,
           "steps": 18, "node_cpu_seconds": 0.5, "node_cpu_share_of_host": 0.04},
          {"scheme": "binomial", "sources": 2, "nodes": 8, "blocks": 8, "seconds": 2.9, "bound_seconds": 3.3,
           "steps": 9, "node_cpu_seconds": 0.4, "node_cpu_share_of_host": 0.07}]
    ttft = [{"system": s, "p50_s": p / 2, "p90_s": p, "requests": 40, "all_loaded_s": 3.0 + i, "migrations": 7 - 7 * i,
             "hidden_hops": 0 if i else 123, "tokens_identical": identical}
            for i, (s, p) in enumerate([("gfaas", 4.0 / gain), ("tree", 4.5), ("load-then-serve", 4.0)])]
    return {"settings": {"nodes": 8, "blocks": 8, "rate_mbit": 40.0, "sources": 2, "requests": 40, "span_s": 2.0,
                         "floor_s": 0.05, "trace": None},
            "multicast": mc, "binomial_speedup_vs_tree": tree_s / (3.0 * ratio), "ttft": ttft,
            "ttft_p90_gain_vs_load_then_serve": gain, "outputs_identical": identical,
            "tiers": {"warm_s": 0.02, "warm_hits": 6, "warm_nodes": 6},
            "provenance": {"commit": "c" * 40, "utc": "T", "dirty": False, "machine": {"cpu_model": "cpu"}}}


def test_rows_and_targets(scale_tables: Any) -> None:
    """Each number lands in its row, and each target row says whether the run met it."""
    met = scale_tables.table(_doc(0.99, 6.0, 2.5, True))
    assert "| measured / bound | 0.990 | <= 1.15 | yes |" in met
    assert "| tree / binomial | 2.02x | >= 1.5x | yes |" in met
    assert "| TTFT P90 gain over load-then-serve | 2.50x | >= 2x | yes |" in met
    assert "| TTFT P90 gfaas / tree / load-then-serve | 1.60 / 4.50 / 4.00 s | | |" in met
    assert "(gfaas) | 123 |" in met and "Run of commit `cccccccccc`" in met
    missed = scale_tables.table(_doc(1.2, 3.3, 1.5, False))
    assert "| measured / bound | 1.200 | <= 1.15 | **no** |" in missed
    assert "| tree / binomial | 0.92x | >= 1.5x | **no** |" in missed
    assert "| TTFT P90 gain over load-then-serve | 1.50x | >= 2x | **no** |" in missed
    assert "| no | identical | **no** |" in missed
    assert "warm scale-out" not in missed  # a result without the warm scale-out has no warm rows
    doc = _doc(0.99, 6.0, 2.5, True)
    doc["settings"]["warm_rate_mbit"] = 160.0
    doc["warm_ttft"] = [{"system": "gfaas", "p50_s": 0.5, "p90_s": 1.0, "all_loaded_s": 0.7, "pipelines": 3,
                         "hidden_hops": 40, "migrations": 5},
                        {"system": "warm-then-serve", "p50_s": 0.9, "p90_s": 1.5, "all_loaded_s": 0.7,
                         "pipelines": 0, "hidden_hops": 0, "migrations": 0}]
    doc["warm_ttft_p90_gain_vs_warm_then_serve"] = 1.5
    warm = scale_tables.table(doc)
    assert "| warm scale-out at 160 Mbit/s host-to-device: TTFT P90 gfaas / warm-then-serve | 1.00 / 1.50 s |" in warm
    assert "| warm: pipelines formed while loading, passes over a link, requests moved | 3, 40, 5 |" in warm


def test_page_block_is_the_committed_result(scale_tables: Any) -> None:
    """docs/scaling.md's Measured block is exactly what the generator makes of the committed file
    (re-run `benchmarks/scale_tables.py ... --write docs/scaling.md` after a new result)."""
    block = re.search(r"<!-- scale-netns -->\n(.*?)\n<!-- /scale-netns -->", PAGE.read_text(), re.S)
    assert block is not None, "docs/scaling.md has no scale-netns block"
    assert block.group(1) == scale_tables.table(json.loads(RESULT.read_text()))
