"""gfaas sim keepalive: the trace loader, the synthetic day and the minute-level replay."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gfaas.cli import main
from gfaas.errors import ConfigError
from gfaas.sim import keepalive as ka
from gfaas.sim.azure_trace import load_function_day
from gfaas.sim.synthetic_functions import KINDS, FunctionDay, synthetic_day

DATA = Path(__file__).resolve().parent.parent / "data" / "azure_functions_2019"


def _day(rows: list[list[int]], memory_mb: float = 1024.0, minutes: int = 1440) -> FunctionDay:
    counts = np.zeros((len(rows), minutes), dtype=np.int32)
    for i, r in enumerate(rows):
        counts[i, r] = 1
    n = len(rows)
    return FunctionDay(counts, np.full(n, memory_mb), np.full(n, 100.0), [f"f{i}" for i in range(n)],
                       ["periodic"] * n, "test")


# ---- closed forms ---------------------------------------------------------------------------------

def test_every_15_minutes_fixed_10_is_always_cold_fixed_20_only_first() -> None:
    """96 invocations, every 15 minutes, 1 GB: fixed:10 misses each one and holds 9 idle minutes per
    gap; fixed:20 misses only the first and holds 14 per gap; both hold to the day's end after the last."""
    day = _day([list(range(0, 1440, 15))])
    r10, r20 = ka.simulate_policy(day, "fixed:10"), ka.simulate_policy(day, "fixed:20")
    assert r10.cold_starts == 96 and r10.cold_start_pct_p75 == 100.0
    assert r10.idle_memory_gb_min == pytest.approx(95 * 9 + 9)  # last at minute 1425: 14 left, 9 idle
    assert r20.cold_starts == 1
    assert r20.idle_memory_gb_min == pytest.approx(95 * 14 + 14)


def test_prewarm_window_closed_form() -> None:
    """A policy that unloads after use and pre-loads at 14 minutes for 2 minutes catches a 15-minute
    period and holds 1 idle minute per gap (minute 14)."""

    class Window:
        stationary = True

        def on_invocation(self, now: float) -> None: ...
        def keep_alive_s(self, now: float) -> float: return 120.0
        def prewarm_after_s(self, now: float) -> float | None: return 14 * 60.0

    day = _day([list(range(0, 1440, 15))])
    cold, idle = ka._stationary(day, Window())
    assert cold.tolist() == [1] and idle[0] == pytest.approx(95 * 1 + 1)


@pytest.mark.parametrize("name", ["fixed:1", "fixed:7", "fixed:30", "fixed:240"])
def test_the_vector_path_equals_the_stepped_path(name: str) -> None:
    """fixed:N evaluated for all functions at once gives the per-invocation replay's numbers."""
    day = synthetic_day(300, seed=3)
    v_cold, v_idle = ka._stationary(day, ka.keep_alive_policy(name))
    s_cold, s_idle = ka._stepped(day, name, None)
    assert v_cold.tolist() == s_cold.tolist()
    np.testing.assert_allclose(v_idle, s_idle, atol=1e-9)


def test_gfaas_catches_a_period_fixed_10_misses() -> None:
    """Every 45 minutes: gfaas pre-warms from the fourth invocation on; fixed:10 is always cold."""
    day = _day([list(range(0, 1440, 45))])
    g, f = ka.simulate_policy(day, "gfaas"), ka.simulate_policy(day, "fixed:10")
    assert f.cold_starts == 32
    assert g.cold_starts <= 4 and g.idle_memory_gb_min < f.idle_memory_gb_min


# ---- the loader -----------------------------------------------------------------------------------

def test_loads_the_three_file_example() -> None:
    day = load_function_day(DATA)
    assert day.functions == 4 and day.minutes == 1440
    assert day.memory_mb.tolist() == [120.0, 176.0, 170.0, 112.0]
    assert day.duration_ms.tolist() == [100.0, 500.0, 250.0, 125.0]
    assert day.invocations == int(day.counts.sum()) > 0


def test_per_day_names_and_app_memory_split(tmp_path: Path) -> None:
    """The published names are accepted; an app's memory is split evenly among its functions."""
    shutil.copy(DATA / "invocations.csv", tmp_path / "invocations_per_function_md.anon.d01.csv")
    shutil.copy(DATA / "durations.csv", tmp_path / "function_durations_percentiles.anon.d01.csv")
    inv = load_function_day(DATA)
    lines = (DATA / "invocations.csv").read_text().splitlines()
    owner, app = lines[1].split(",")[:2]
    (tmp_path / "app_memory_percentiles.anon.d01.csv").write_text(
        "HashOwner,HashApp,SampleCount,AverageAllocatedMb\n" f"{owner},{app},10,300\n")
    day = load_function_day(tmp_path)
    assert day.counts.tolist() == inv.counts.tolist()
    n_app = sum(1 for ln in lines[1:] if ln.split(",")[1] == app)
    assert day.memory_mb[0] == pytest.approx(300.0 / n_app)


@pytest.mark.parametrize("broken, match", [
    ("missing", "no memory file; expected memory.csv"),
    ("header", "HashOwner,HashApp,HashFunction,SampleCount,AverageAllocatedMb"),
    ("value", "AverageAllocatedMb = 'lots'"),
])
def test_bad_files_name_the_file_and_columns(tmp_path: Path, broken: str, match: str) -> None:
    for f in ("invocations.csv", "durations.csv"):
        shutil.copy(DATA / f, tmp_path / f)
    if broken == "header":
        (tmp_path / "memory.csv").write_text("HashOwner,HashApp,Mem\n")
    elif broken == "value":
        (tmp_path / "memory.csv").write_text(
            "HashOwner,HashApp,HashFunction,SampleCount,AverageAllocatedMb\na,b,c,1,lots\n")
    with pytest.raises(ConfigError, match=match):
        load_function_day(tmp_path)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        load_function_day(tmp_path / "nope")


# ---- the synthetic day ----------------------------------------------------------------------------

def test_synthetic_day_is_deterministic_and_mixed() -> None:
    a, b, c = synthetic_day(2000, seed=7), synthetic_day(2000, seed=7), synthetic_day(2000, seed=8)
    assert np.array_equal(a.counts, b.counts) and np.array_equal(a.memory_mb, b.memory_mb)
    assert not np.array_equal(a.counts, c.counts)
    share = {k: a.kinds.count(k) / 2000 for k in KINDS}
    assert share["sporadic"] == pytest.approx(0.5, abs=0.04)
    assert share["periodic"] == pytest.approx(0.3, abs=0.04)
    assert share["bursty"] == pytest.approx(0.2, abs=0.04)
    per_fn = a.counts.sum(axis=1)
    # Heavy-tailed popularity: many functions invoked at most once an hour on average, the busiest
    # 10% make more than half of all invocations.
    assert (per_fn <= 24).mean() > 0.35
    top = np.sort(per_fn)[::-1]
    assert top[:200].sum() > 0.5 * per_fn.sum()
    kinds = np.array(a.kinds)
    periodic = a.counts[kinds == "periodic"] > 0
    gaps = [np.diff(np.flatnonzero(r)) for r in periodic if r.sum() > 3]
    assert np.mean([np.median(g) == np.bincount(g).argmax() for g in gaps]) > 0.9  # regular gaps


# ---- the CLI ---------------------------------------------------------------------------------------

def test_cli_json_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "k.json"
    rc = main(["sim", "keepalive", "--functions", "200", "--seed", "1", "--json", "--out", str(out)])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text())
    assert doc["functions"] == 200 and isinstance(doc["invocations"], int)
    assert [p["policy"] for p in doc["policies"]] == ["fixed:10", "fixed:60", "hybrid", "gfaas"]
    for p in doc["policies"]:
        assert set(p) == {"policy", "cold_starts", "cold_start_pct_p75", "idle_memory_gb_min"}
        assert isinstance(p["cold_starts"], int) and 0 <= p["cold_start_pct_p75"] <= 100
    assert "commit" in json.dumps(doc["provenance"])


def test_cli_trace_and_bad_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "keepalive", "--trace", str(DATA), "--policies", "fixed:10,gfaas", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["functions"] == 4 and len(doc["policies"]) == 2
    with pytest.raises(ConfigError, match="unknown keep-alive policy 'lru'"):
        ka.simulate(synthetic_day(5), ["fixed:10", "lru"])
