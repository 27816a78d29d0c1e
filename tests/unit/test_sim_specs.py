"""The simulator runs the runtime's workflow specs with the runtime's measured edge sizes."""

from __future__ import annotations

import json
import random
from importlib import resources

import pytest

from gfaas import workflows as W
from gfaas.errors import ConfigError
from gfaas.runtime.spec import Condition, loads
from gfaas.sim.workflows import (
    CONDITION_PROBABILITY,
    GPU_PROFILES,
    REFERENCE,
    DataEdge,
    Function,
    Workflow,
    condition_value,
    edge_sizes,
    from_spec,
    workflow,
)
from gfaas.workflows.sizes import sizes_doc


def _spec(name: str):
    return loads(W.spec_text(name), check_handlers=False)


def test_the_simulator_has_exactly_the_runtime_workflows() -> None:
    assert sorted(REFERENCE) == W.names()
    for name in REFERENCE:
        spec, wf = _spec(name), workflow(name)
        assert [f.name for f in wf.functions] == [f.name for f in spec.functions]
        assert {f.name: f.kind for f in wf.functions} == {f.name: f.kind for f in spec.functions}
        pairs = {(i.source, f.name) for f in spec.functions for i in f.inputs if not i.from_workflow}
        assert {(e.src, e.dst) for e in wf.edges} == pairs
        conds = {(i.when.function, i.when.output) for f in spec.functions for i in f.inputs if i.when}
        assert set(wf.conditions) == conds
        assert wf.spec is not None and wf.spec.functions == spec.functions


def test_edge_sizes_cover_every_edge_and_output_of_every_spec() -> None:
    doc = json.loads((resources.files("gfaas.workflows") / "edge_sizes.json").read_text())
    assert doc["scale"] == "full" and not doc["stub"]
    assert sorted(doc["workflows"]) == W.names()
    for name in W.names():
        spec = _spec(name)
        want = {(f"{i.source}.{i.output}", f"{f.name}.{i.name}") for f in spec.functions for i in f.inputs}
        want |= {(f"{fn}.{o}", f"caller.{out}") for out, (fn, o) in spec.outputs.items()}
        got = {(r["from"], r["to"]) for r in doc["workflows"][name]}
        assert got == want, name
        assert all(r["nbytes"] > 0 for r in doc["workflows"][name])


def test_sizes_are_the_bytes_on_each_edge_and_the_simulator_uses_them() -> None:
    rows = {(r["from"], r["to"]): r["nbytes"] for r in edge_sizes()["traffic"]}
    wf = workflow("traffic")
    by_pair = {(e.src, e.dst): e.nbytes for e in wf.edges}
    assert by_pair[("decode", "detect")] == rows[("decode.frames", "detect.frames")] == 2 * 1080 * 1920 * 3 * 4
    assert by_pair[("detect", "recog_person")] == rows[("detect.person_crops", "recog_person.crops")]
    # yelp's two token tensors travel between the same pair of functions: one object of both
    yelp = {(e.src, e.dst): e.nbytes for e in workflow("yelp").edges}
    assert yelp == {("bert_filter", "bert_sentiment"): 2 * 4 * 128 * 8}
    assert workflow("yelp").function("bert_filter").input_bytes == 156  # the review, from host memory


@pytest.mark.parametrize("name", ["social", "image"])
def test_committed_sizes_agree_with_a_stub_run(name: str) -> None:
    """A cheap re-measurement (stand-in models) gives the committed bytes on every edge."""
    fresh = sizes_doc([name], stub=True)["workflows"][name]
    assert fresh == edge_sizes()[name]


def test_every_gpu_function_has_a_profile_and_every_condition_a_probability() -> None:
    for name in REFERENCE:
        for f in _spec(name).functions:
            assert (f.kind == "gpu") == ((name, f.name) in GPU_PROFILES), (name, f.name)
    assert {(w, f) for w, f, _ in CONDITION_PROBABILITY} <= {(w, f) for w in REFERENCE for f in
                                                            [g.name for g in _spec(w).functions]}


def test_a_missing_size_is_an_error_that_says_how_to_regenerate() -> None:
    rows = [r for r in edge_sizes()["social"] if r["to"] != "bert.tokens"]
    with pytest.raises(ConfigError, match="edge_sizes.json"):
        from_spec(_spec("social"), rows)


@pytest.mark.parametrize("op", [">", ">=", "<", "<=", "==", "!="])
def test_condition_values_make_the_condition_hold_or_not(op: str) -> None:
    c = Condition("f", "n", op, 2.0)
    assert c.holds(condition_value(c, True)) and not c.holds(condition_value(c, False))


def test_condition_scalars_are_drawn_with_their_probability() -> None:
    rng = random.Random(1)
    wf = workflow("traffic")
    draws = [wf.draw_scalars(rng)["detect"] for _ in range(4000)]
    assert sum(d["num_persons"] > 0 for d in draws) / 4000 == pytest.approx(0.6, abs=0.03)
    assert sum(d["num_vehicles"] > 0 for d in draws) / 4000 == pytest.approx(0.8, abs=0.03)


def test_hand_built_workflows_get_a_spec_with_their_conditional_edges() -> None:
    wf = Workflow("pair", "condition", (Function("a", "gpu", "resnet50"), Function("b", "gpu", "resnet50")),
                  (DataEdge("a", "b", 10, prob=0.25),))
    assert wf.spec is not None and [f.name for f in wf.spec.functions] == ["a", "b"]
    (cond,) = [i.when for i in wf.spec.function("b").inputs]
    assert str(cond) == "a.take_b > 0" and dict(wf.conditions) == {("a", "take_b"): 0.25}


def test_the_simulators_deadlines_are_the_policys() -> None:
    from gfaas.policy import SLO_FACTOR, deadline_for, input_deadline, slo_for

    assert SLO_FACTOR == 1.5
    assert input_deadline(2.0, 0.04) == deadline_for(2.0, slo_for(0.04), 0.04) == pytest.approx(2.02)
    assert input_deadline(2.0, 0.0) == input_deadline(2.0, 1e-6) == 2.0 + 1e-3  # the floor
    from gfaas.sim.cluster import Cluster
    from gfaas.sim.systems import system
    from gfaas.topology import preset

    c = Cluster(preset("dgx-v100"), system("gfaas"))
    c.deploy(workflow("yelp"))
    c.submit("yelp", 0.0)
    (rec,) = c.run()
    for s in rec.fns.values():
        assert s.slo_s == slo_for(s.compute_s) and s.deadline_s == input_deadline(0.0, s.compute_s)


def test_dag_readers_follow_the_producers_own_conditions() -> None:
    from gfaas.runtime.dag import DagState

    dag = DagState(_spec("traffic"))
    dag.start()
    for fn in ("decode", "preprocess"):
        dag.finished(fn, {})
    assert dag.readers("detect", {"num_persons": 0, "num_vehicles": 2}) == ["recog_vehicle"]
    assert dag.readers("decode", {}) == ["preprocess", "detect"]
    dag.finished("detect", {"num_persons": 0, "num_vehicles": 2})
    assert dag.events[-2:] == [("recog_person", "skipped"), ("recog_vehicle", "ready")]


def test_a_skipped_branch_is_neither_stored_nor_run_in_the_simulator() -> None:
    from gfaas.sim.cluster import Cluster
    from gfaas.sim.systems import system
    from gfaas.topology import preset

    c = Cluster(preset("dgx-v100"), system("gfaas").with_storage("gfaas"))
    c.keep_events = True
    c.condition_values = lambda wf, ident: {"detect": {"num_persons": 0, "num_vehicles": 1}}
    c.deploy(workflow("traffic"))
    c.submit("traffic", 0.0)
    (rec,) = c.run()
    assert ("recog_person", "skipped") in rec.events and "recog_person" not in rec.fns
    assert set(rec.edges) == {("detect", "recog_vehicle")}
    assert c.memory is not None and not c.memory.objects  # the one crop object was read and freed
