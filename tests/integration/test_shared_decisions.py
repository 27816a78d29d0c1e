"""One policy, two executors: the runtime's invoker (``gfaas.runtime.local``) and the simulator
(``gfaas.sim.cluster``) step the same spec through the same DagState and compute SLOs and deadlines
with the same policy functions, so for the same condition values and execution times they take the
same decisions.

The runtime runs each reference spec with its handlers replaced by a stand-in that returns the
condition values the test picks (``rt_handlers:emit``); the simulator gets the same values through
``Cluster.condition_values``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import yaml

import gfaas.policy.bandwidth as bandwidth
import gfaas.runtime.invoker as runtime_invoker
import gfaas.sim.cluster as sim_cluster
from gfaas import policy
from gfaas import workflows as W
from gfaas.runtime.local import LocalRuntime, RuntimeConfig
from gfaas.sim.cluster import Cluster
from gfaas.sim.systems import system
from gfaas.sim.workflows import workflow
from gfaas.topology import preset

V100 = preset("dgx-v100")
Scalars = Mapping[str, Mapping[str, float]]


def stand_in_spec(name: str, label: str, scalars: Scalars) -> str:
    """The reference spec ``name`` (same functions, edges, conditions) with stand-in handlers."""
    doc = yaml.safe_load(W.spec_text(name))
    doc["name"] = f"{name}-{label}"
    doc["inputs"] = dict.fromkeys(doc["inputs"])
    for f in doc["functions"]:
        f["handler"] = "rt_handlers:emit"
        f.pop("model", None)
        outs = f["outputs"]
        scalar = [o for o, d in outs.items() if d and d.get("shape") == []]
        f["outputs"] = {o: ({"shape": []} if o in scalar else None) for o in outs}
        f["params"] = {"outputs": list(outs), "scalar_outputs": scalar, "scalars": dict(scalars.get(f["name"], {}))}
        f["inputs"] = {i: ({k: v for k, v in src.items() if k in ("from", "when")} if isinstance(src, dict) else src)
                       for i, src in f["inputs"].items()}
    return yaml.safe_dump(doc)


@pytest.fixture(scope="module")
def rt() -> Iterator[LocalRuntime]:
    mp = pytest.MonkeyPatch()
    support = os.path.join(os.path.dirname(__file__), "..", "support")
    mp.syspath_prepend(support)
    r = LocalRuntime(RuntimeConfig(executor="inproc", node_capacity_bytes=64 << 20))
    r.invoker.keep_retired = {}  # the finished invocations' DAG events are compared
    try:
        yield r
    finally:
        r.close()
        mp.undo()


_deployed: set[str] = set()


def run_runtime(rt: LocalRuntime, name: str, label: str, scalars: Scalars) -> tuple[list[tuple[str, str]], Any]:
    wf = f"{name}-{label}"
    if wf not in _deployed:
        rt.deploy(stand_in_spec(name, label, scalars))
        _deployed.add(wf)
    inputs = {k: np.zeros(4, np.uint8) for k in yaml.safe_load(W.spec_text(name))["inputs"]}
    inv = rt.submit(wf, inputs)
    res = rt.result(inv, timeout=60)
    assert res.ok, res.error
    return list(rt.invoker.keep_retired[inv].dag.events), res


def run_sim(name: str, scalars: Scalars, profile: Any = None) -> tuple[list[tuple[str, str]], Any]:
    c = Cluster(V100, system("gfaas"), profile=profile)
    c.keep_events = True
    c.condition_values = lambda wf, ident: scalars
    c.deploy(workflow(name))
    c.submit(name, 0.0)
    (rec,) = c.run()
    assert rec.finish >= 0
    return rec.events, rec


CASES: list[tuple[str, str, dict[str, dict[str, float]], list[tuple[str, str]]]] = [
    ("traffic", "both", {"detect": {"num_persons": 2, "num_vehicles": 3}},
     [("decode", "ready"), ("preprocess", "ready"), ("detect", "ready"), ("recog_person", "ready"),
      ("recog_vehicle", "ready")]),
    ("traffic", "cars", {"detect": {"num_persons": 0, "num_vehicles": 1}},
     [("decode", "ready"), ("preprocess", "ready"), ("detect", "ready"), ("recog_person", "skipped"),
      ("recog_vehicle", "ready")]),
    ("traffic", "empty", {"detect": {"num_persons": 0, "num_vehicles": 0}},
     [("decode", "ready"), ("preprocess", "ready"), ("detect", "ready"), ("recog_person", "skipped"),
      ("recog_vehicle", "skipped")]),
    ("social", "text", {"ocr": {"num_tokens": 12}}, [("ocr", "ready"), ("bert", "ready")]),
    ("social", "blank", {"ocr": {"num_tokens": 0}}, [("ocr", "ready"), ("bert", "skipped")]),
    ("video", "all", {}, [("split", "ready"), ("detect_face_0", "ready"), ("detect_face_1", "ready"),
                          ("detect_face_2", "ready"), ("detect_face_3", "ready"), ("recognise", "ready")]),
    ("image", "all", {}, [("denoise", "ready"), ("classify_resnet", "ready"), ("classify_effnet", "ready"),
                          ("classify_vit", "ready"), ("aggregate", "ready")]),
    ("driving", "all", {}, [("denoise", "ready"), ("segment", "ready"), ("colour", "ready")]),
    ("yelp", "all", {}, [("bert_filter", "ready"), ("bert_sentiment", "ready")]),
]


@pytest.mark.parametrize(("name", "label", "scalars", "expected"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_runtime_and_simulator_take_the_same_dag_decisions(rt: LocalRuntime, name: str, label: str,
                                                           scalars: dict[str, dict[str, float]],
                                                           expected: list[tuple[str, str]]) -> None:
    runtime_log, res = run_runtime(rt, name, label, scalars)
    sim_log, rec = run_sim(name, scalars)
    assert runtime_log == expected
    assert sim_log == expected
    # what ran is what the records say on both sides
    skipped = {f for f, e in expected if e == "skipped"}
    assert {r.function for r in res.functions if r.skipped} == skipped
    gpu_ran = {f.name for f in workflow(name).functions if f.kind == "gpu"} - skipped
    assert set(rec.fns) == gpu_ran


class _Fixed:
    """A simulator profile that returns given execution times per model."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.s = seconds

    def seconds(self, model: str, gpu_model: str | None, batch: int) -> float:
        return self.s.get(model, 1e-3)


def test_slo_and_deadline_come_from_one_function_and_agree(rt: LocalRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    # one function, imported by both executors
    assert runtime_invoker.slo_for is sim_cluster.slo_for is policy.slo_for
    assert runtime_invoker.input_deadline is sim_cluster.input_deadline is policy.input_deadline
    calls: list[tuple[str, float, float]] = []
    original = bandwidth.slo_for

    def spy(who: str) -> Any:
        def slo_for(exec_time_s: float, factor: float = policy.SLO_FACTOR) -> float:
            out = original(exec_time_s, factor)
            calls.append((who, exec_time_s, out))
            return out
        return slo_for

    monkeypatch.setattr(runtime_invoker, "slo_for", spy("runtime"))
    monkeypatch.setattr(sim_cluster, "slo_for", spy("sim"))
    _, res = run_runtime(rt, "image", "slo", {})
    measured = {r.function: r.compute_s for r in res.functions}
    # the simulator, given the runtime's execution times for the three classifiers (its profiles
    # resnet50, alexnet, resnet101), computes the very same SLOs and deadlines
    profile = _Fixed({"resnet50": measured["classify_resnet"], "alexnet": measured["classify_effnet"],
                      "resnet101": measured["classify_vit"]})
    _, rec = run_sim("image", {}, profile)
    for fn in ("classify_resnet", "classify_effnet", "classify_vit"):
        (r,) = [r for r in res.functions if r.function == fn]
        s = rec.fns[fn]
        assert s.compute_s == r.compute_s > 0
        assert s.slo_s == r.slo_s == r.compute_s * policy.SLO_FACTOR
        assert s.deadline_s == r.deadline_s == policy.input_deadline(0.0, r.compute_s)
        assert ("runtime", r.compute_s, r.slo_s) in calls and ("sim", s.compute_s, s.slo_s) in calls


# ---- placement ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["traffic", "video", "image"])
def test_runtime_and_simulator_place_gpu_functions_alike(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a node with several GPUs, the runtime's placement and the simulator's deployment call
    place_workflow with the same functions, edge bytes and free GPUs, and get the same mapping."""
    import gfaas.runtime.placement as rt_placement
    from gfaas.runtime.spec import loads
    from gfaas.workflows.measured import edge_sizes

    calls: list[tuple[str, Any, dict[str, str]]] = []
    real = policy.place_workflow

    def spy(who: str) -> Any:
        def call(topology: Any, functions: Any, edges: Any, free: Any, **kw: Any) -> dict[str, str]:
            out = real(topology, functions, edges, free, **kw)
            calls.append((who, (topology.name, list(functions), list(edges), list(free),
                                kw.get("topology_aware", True)), out))
            return out
        return call

    monkeypatch.setattr(rt_placement, "place_workflow", spy("runtime"))
    monkeypatch.setattr(sim_cluster, "place_workflow", spy("sim"))
    spec = loads(W.spec_text(name), check_handlers=False)
    rt_placement.place_gpu_functions(spec, V100, list(V100.gpus), edge_sizes()[name])
    Cluster(V100, system("gfaas"), seed=1).deploy(workflow(name))
    (w1, args1, out1), (w2, args2, out2) = calls
    assert (w1, w2) == ("runtime", "sim")
    assert args1 == args2 and out1 == out2


def test_the_runtime_runs_gpu_functions_where_it_placed_them(rt_handlers: str) -> None:
    """A runtime given a multi-GPU topology places a workflow's GPU functions (heavy edges on one
    GPU or an NVLink pair) and each worker sees its GPU; a second workflow gets the GPUs left."""
    from gfaas.runtime.placement import place_gpu_functions
    from gfaas.runtime.spec import loads

    spec = f"""
name: gpus
inputs: {{x: null}}
outputs: {{out: c.y}}
functions:
  - {{name: a, kind: gpu, handler: "{rt_handlers}:which_gpu", inputs: {{x: input.x}},
     outputs: {{y: {{dtype: float64, shape: [1000000]}}, gpu: {{shape: []}}}}}}
  - {{name: b, kind: gpu, handler: "{rt_handlers}:which_gpu", inputs: {{x: a.y}},
     outputs: {{y: {{dtype: float64, shape: [1000000]}}, gpu: {{shape: []}}}}}}
  - {{name: c, kind: gpu, handler: "{rt_handlers}:which_gpu", inputs: {{x: b.y}},
     outputs: {{y: {{dtype: float64, shape: [1000000]}}, gpu: {{shape: []}}}}}}
"""
    with LocalRuntime(RuntimeConfig(executor="inproc", topology="dgx-v100")) as r:
        r.deploy(spec)
        placed = r.placement("gpus")
        assert placed == place_gpu_functions(loads(spec), V100, list(V100.gpus))
        res = r.invoke("gpus", {"x": np.ones(1_000_000)})
        assert res.ok
        assert {f: f"gpu{int(res.scalars[f'{f}.gpu'])}" for f in "abc"} == placed
        r.deploy(spec.replace("name: gpus", "name: gpus2"))
        assert not set(r.placement("gpus2").values()) & set(placed.values())
    with LocalRuntime(RuntimeConfig(executor="inproc")) as r:  # no topology: nothing is placed
        r.deploy(spec)
        assert r.placement("gpus") == {} and r.invoke("gpus", {"x": np.ones(1_000_000)}).scalars["a.gpu"] == -1
