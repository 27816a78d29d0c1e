"""Which workflows the invoker's lane may run (gfaas.runtime.lane.lane_plan): a pure rule, stepped on a
DagState, so each shape that the lane must not take is pinned here with the chain the policy would give."""

from __future__ import annotations

import pytest

from gfaas.policy.fusion import Stage, chains
from gfaas.runtime.lane import lane_plan
from gfaas.runtime.spec import WorkflowSpec, loads


def _spec(edges: dict[str, list[str]], gated: str = "") -> WorkflowSpec:
    """Functions named by ``edges`` (function -> the functions it reads from; none: the request's input)."""
    fns = []
    for name, sources in edges.items():
        ins = {f"i{k}": f"{s}.y" for k, s in enumerate(sources)} or {"x": "input.x"}
        if name == gated:
            src = sources[0]
            ins = {"i0": f'{{from: {src}.y, when: "{src}.n > 0"}}'}
        body = ", ".join(f"{k}: {v}" for k, v in ins.items())
        fns.append(f'  - {{name: {name}, kind: cpu, handler: "h:f", inputs: {{{body}}}, outputs: {{y: null, n: null}}}}')
    read = {s for sources in edges.values() for s in sources}
    outs = ", ".join(f"{f}: {f}.y" for f in edges if f not in read)  # every function nobody reads
    text = f"name: w\ninputs: {{x: null}}\noutputs: {{{outs}}}\nfunctions:\n" + "\n".join(fns) + "\n"
    return loads(text, check_handlers=False)


def _policy(spec: WorkflowSpec) -> dict[str, tuple[str, ...]]:
    """The chains gfaas.policy.fusion gives when every function may join one (one node, CPU functions)."""
    return chains([Stage(f.name, plan[1], plan[2], True, ("node", "cpu", None))
                   for f, plan in zip(spec.functions, spec.dag_plan, strict=True)])


@pytest.mark.parametrize(("edges", "gated", "expect"), [
    ({"a": []}, "", ("a", ())),  # one function: its worker runs it all
    ({"a": [], "b": ["a"], "c": ["b"]}, "", ("a", ("b", "c"))),  # a line
    ({"a": [], "b": ["a"], "c": ["b"]}, "b", None),  # a condition: something may be skipped
    ({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}, "", None),  # a diamond: no single chain
    ({"a": [], "b": []}, "", None),  # two functions ready at the start
    ({"a": [], "b": ["a"], "c": ["a"]}, "", None),  # a fan-out
])
def test_the_lane_takes_a_workflow_that_one_chain_runs_whole_and_nothing_else(
        edges: dict[str, list[str]], gated: str, expect: tuple[str, tuple[str, ...]] | None) -> None:
    spec = _spec(edges, gated)
    follow = _policy(spec)
    plan = lane_plan(spec, lambda fn: follow.get(fn, ()))
    assert (None if plan is None else (plan.head, plan.chain)) == expect


def test_a_chain_that_stops_short_or_runs_out_of_order_is_not_the_lanes() -> None:
    spec = _spec({"a": [], "b": ["a"], "c": ["b"]})
    assert lane_plan(spec, lambda fn: ("b", "c")) is not None
    assert lane_plan(spec, lambda fn: ("b",)) is None  # c would be left for the general path
    assert lane_plan(spec, lambda fn: ("c", "b")) is None  # c is not ready after a
    assert lane_plan(spec, lambda fn: ()) is None
