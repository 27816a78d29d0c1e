"""The native DAG stepping (``gfaas_native.DagCore``) against the reference ``DagState``.

The same decisions for the same inputs: ``start``, every ``finished``, ``readers`` of every function
at every step, ``complete`` and the logged events, on random DAGs with ``when:`` conditions and skips
finished in random orders; the same ``FunctionFailed`` messages for bad input; and whole cluster runs
with either, every record field equal, floats exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gfaas.errors import FunctionFailed
from gfaas.runtime.dag import DagState
from gfaas.runtime.spec import loads
from gfaas.sim import cluster as cluster_mod
from gfaas.sim.arrivals import poisson
from gfaas.sim.cluster import Cluster
from gfaas.sim.dag_native import compile_plan, native_dag_available, new_core
from gfaas.sim.systems import system
from gfaas.sim.workflows import workflow
from gfaas.topology import preset

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))
from sim_switch import printed_with  # noqa: E402

pytestmark = pytest.mark.skipif(not native_dag_available(),
                                reason="gfaas_native (with DagPlan and DagCore) is not built here: make setup "
                                       "builds it (needs cargo)")


@pytest.fixture(autouse=True)
def _handlers(rt_handlers: str) -> None:
    """The random specs name ``tests/support/rt_handlers.py``'s handlers."""


def _random_spec(data: Any) -> Any:
    n = data.draw(st.integers(1, 7))
    outs = ", ".join(f"o{k}: f{k}.y" for k in range(n))
    lines = ["name: rnd", "inputs: {x: null}", f"outputs: {{{outs}}}", "functions:"]
    ops = (">", ">=", "<", "<=", "==", "!=")
    for k in range(n):
        srcs = data.draw(st.lists(st.integers(0, k - 1), max_size=3, unique=True)) if k else []
        ins: dict[str, Any] = {"x": "input.x"} if not srcs or data.draw(st.booleans()) else {}
        for j, src in enumerate(srcs):
            if data.draw(st.booleans()):
                op = data.draw(st.sampled_from(ops))
                ins[f"i{j}"] = {"from": f"f{src}.y", "when": f"f{src}.n {op} {data.draw(st.integers(-1, 1))}"}
            else:
                ins[f"i{j}"] = f"f{src}.y"
        lines.append(f"  - {{name: f{k}, kind: cpu, handler: 'rt_handlers:double', inputs: {ins!r}, "
                     "outputs: {y: null, n: {shape: []}}}")
    return loads(textwrap.dedent("\n".join(lines).replace("'", '"'))), n


def _outcome(f: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", f(*args)
    except FunctionFailed as e:
        return "FunctionFailed", str(e)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_native_dag_decides_as_dagstate_on_random_workflows(data: Any) -> None:
    """Random DAGs of up to 7 functions with conditions of every operator, random scalars (some
    missing, ints or floats), random finish orders, and now and then a function finished that is not
    ready: every answer and every error the same."""
    s, n = _random_spec(data)
    value = st.one_of(st.integers(-2, 2), st.floats(-2, 2, allow_nan=False))
    # mostly a scalar "n"; now and then none (a condition over it then raises FunctionFailed)
    scalars = {f"f{k}": {} if data.draw(st.integers(0, 15)) == 0 else {"n": data.draw(value)} for k in range(n)}
    ref, events = DagState(s), []
    nat = new_core(compile_plan(s), events)
    names = [f"f{k}" for k in range(n)]

    def readers_all() -> None:
        for name in names:
            sc = scalars[name]
            assert _outcome(nat.readers, name, sc) == _outcome(ref.readers, name, sc)

    got = _outcome(ref.start)
    assert _outcome(nat.start) == got
    pending = list(got[1][0]) if got[0] == "ok" else []
    readers_all()
    while pending:
        if data.draw(st.integers(0, 9)) == 0:  # bad input: one not ready (or unknown)
            bad = data.draw(st.sampled_from([*names, "nobody"]))
            if bad not in pending:
                assert _outcome(nat.finished, bad, {}) == _outcome(ref.finished, bad, {})
        name = pending.pop(data.draw(st.integers(0, len(pending) - 1)))
        got = _outcome(ref.finished, name, scalars[name])
        assert _outcome(nat.finished, name, scalars[name]) == got
        if got[0] != "ok":
            break
        pending.extend(got[1][0])
        readers_all()
        assert nat.complete == ref.complete
    assert events == ref.events and nat.events is events
    assert nat.complete == ref.complete


def _records(kind: str, topo: str, wf: str, rate: float, seconds: float, keep: bool,
             monkeypatch: pytest.MonkeyPatch, **cfg: Any) -> tuple[list[dict[str, Any]], int]:
    monkeypatch.setattr(cluster_mod, "DAG_KIND", kind)
    c = Cluster(preset(topo), system("gfaas", **cfg), seed=3)
    c.keep_events = keep
    w = workflow(wf)
    c.deploy(w, 2)
    c.submit_many(wf, poisson(rate, seconds, 7))
    recs = c.run()
    return [asdict(r) for r in recs], c.sim.events_run


@pytest.mark.parametrize("wf", ["traffic", "driving", "social", "moa"])
@pytest.mark.parametrize("keep", [False, True])
def test_a_cluster_gives_the_same_records_with_either_dag(wf: str, keep: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record field (stats, edges, events), floats exactly, and the same count of kernel events."""
    ref = _records("python", "dgx-a100", wf, 40.0, 1.0, keep, monkeypatch)
    nat = _records("native", "dgx-a100", wf, 40.0, 1.0, keep, monkeypatch)
    assert len(ref[0]) > 10
    assert nat == ref


def test_the_dag_is_chosen_like_the_core_and_can_be_kept_python() -> None:
    code = "from gfaas.sim.dag_native import DAG_KIND; print(DAG_KIND)"

    def run(**env: str) -> subprocess.CompletedProcess[str]:
        e = {k: v for k, v in os.environ.items() if k not in ("GFAAS_SIM_CORE", "GFAAS_SIM_DAG")}
        return subprocess.run([sys.executable, "-c", code], env=dict(e, **env), capture_output=True, text=True,
                              timeout=120)

    assert run().stdout.split() == ["native"]
    assert run(GFAAS_SIM_DAG="python").stdout.split() == ["python"]
    assert run(GFAAS_SIM_CORE="python", GFAAS_SIM_DAG="native").stdout.split() == ["python"]
    bad = run(GFAAS_SIM_DAG="fast")
    assert bad.returncode != 0 and "GFAAS_SIM_DAG='fast'" in bad.stderr and "ConfigError" in bad.stderr


def test_experiments_print_the_same_numbers_with_either_dag() -> None:
    out = {kind: printed_with("GFAAS_SIM_DAG", kind, "nvlink-vs-mapa,passing-latency") for kind in ("python", "native")}
    assert len(out["python"]) > 1000
    assert out["native"] == out["python"]
