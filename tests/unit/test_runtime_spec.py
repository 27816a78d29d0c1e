"""Workflow spec loading: the four patterns parse, and every malformed spec is refused with a message
that names the culprit."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfaas.errors import FunctionFailed, SpecError
from gfaas.runtime.dag import DagState
from gfaas.runtime.spec import TypeDecl, loads

pytestmark = pytest.mark.usefixtures("rt_handlers")

BASE = """
name: wf
inputs: {x: {dtype: float64, shape: [-1]}}
outputs: {out: b.y}
functions:
  - {name: a, kind: cpu, handler: "rt_handlers:double", inputs: {x: input.x},
     outputs: {y: {dtype: float64, shape: [-1]}, n_pos: {shape: []}}}
  - {name: b, kind: gpu, handler: "rt_handlers:negate", inputs: {x: a.y}, outputs: {y: null}}
"""


def spec(text: str = BASE, **kw):  # type: ignore[no-untyped-def]
    return loads(textwrap.dedent(text), **kw)


def test_sequence_parses_in_topological_order() -> None:
    """A chain loads with functions ordered producer first, sources and readers resolved."""
    s = spec()
    assert [f.name for f in s.functions] == ["a", "b"]
    assert s.readers("input", "x") == ["a"]
    assert s.readers("a", "y") == ["b"]
    assert s.outputs["out"] == ("b", "y")
    assert s.function("a").outputs["n_pos"].scalar


def test_order_does_not_depend_on_listing_order() -> None:
    """Functions listed consumer first still come out producer first."""
    lines = textwrap.dedent(BASE).strip().splitlines()
    cut = lines.index("functions:") + 1
    a_lines, b_lines = lines[cut:cut + 2], lines[cut + 2:]
    assert "name: b" in b_lines[0]
    assert [f.name for f in spec("\n".join(lines[:cut] + b_lines + a_lines)).functions] == ["a", "b"]


FANS = """
name: fans
inputs: {x: null}
outputs: {out: join.y}
functions:
  - {name: split, kind: cpu, handler: "rt_handlers:split", inputs: {x: input.x}, outputs: {lo: null, hi: null}}
  - {name: left, kind: gpu, handler: "rt_handlers:double", inputs: {x: split.lo}, outputs: {y: null, n_pos: {shape: []}}}
  - {name: right, kind: gpu, handler: "rt_handlers:negate", inputs: {x: split.hi}, outputs: {y: null}}
  - {name: join, kind: cpu, handler: "rt_handlers:concat", inputs: {a: left.y, b: right.y}, outputs: {y: null}}
"""


def test_fan_out_and_fan_in() -> None:
    """One producer feeding two functions that meet again in one."""
    s = spec(FANS)
    order = [f.name for f in s.functions]
    assert order[0] == "split" and order[-1] == "join"
    assert s.readers("split", "lo") == ["left"] and s.readers("left", "y") == ["join"]


COND = """
name: cond
inputs: {x: null}
outputs: {pos: when_pos.y, always: a.y}
functions:
  - {name: a, kind: cpu, handler: "rt_handlers:double", inputs: {x: input.x}, outputs: {y: null, n_pos: {shape: []}}}
  - name: when_pos
    kind: gpu
    handler: "rt_handlers:negate"
    inputs: {x: {from: a.y, when: "a.n_pos > 0"}}
    outputs: {y: null}
  - {name: after, kind: cpu, handler: "rt_handlers:negate", inputs: {x: when_pos.y}, outputs: {y: null}}
"""


def test_condition_parses() -> None:
    s = spec(COND.replace("outputs: {pos: when_pos.y, always: a.y}", "outputs: {pos: after.y, always: a.y}"))
    c = s.function("when_pos").inputs[0].when
    assert c is not None and str(c) == "a.n_pos > 0"
    assert c.holds(1) and not c.holds(0)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.replace("inputs: {x: a.y}", "inputs: {x: b.y}"), "cycle: b -> b"),
        (lambda t: t.replace("inputs: {x: a.y}", "inputs: {x: c.y}"), "unknown function 'c'"),
        (lambda t: t.replace("inputs: {x: a.y}", "inputs: {x: a.zz}"), "does not declare"),
        (lambda t: t.replace("inputs: {x: input.x}", "inputs: {x: input.q}"), "input.q"),
        (lambda t: t.replace("rt_handlers:negate", "rt_handlers:nope"), "no handler 'nope'"),
        (lambda t: t.replace("rt_handlers:negate", "no_such_module_xyz:f"), "does not import"),
        (lambda t: t.replace("rt_handlers:negate", "rt_handlers.negate"), "must be 'module:function'"),
        (lambda t: t.replace("kind: gpu", "kind: tpu"), "kind 'tpu'"),
        (lambda t: t.replace("name: b,", "name: a,"), "two functions are named 'a'"),
        (lambda t: t.replace("name: b,", "name: B,"), "must match"),
        (lambda t: t.replace("outputs: {out: b.y}", "outputs: {out: b.q}"), "output 'out' comes from 'b.q'"),
        (lambda t: t.replace("outputs: {out: b.y}", "outputs: {out: a.y}"), "nothing reads the outputs of function 'b'"),
        (lambda t: t.replace("outputs: {out: b.y}", "outputs: {}"), "`outputs` is empty"),
        (lambda t: t.replace("inputs: {x: a.y}", "inputs: {}"), "has no inputs"),
        (lambda t: t.replace("inputs: {x: a.y}", "inputs: {x: {from: a.y, dtype: int32}}"),
         "type mismatch with a.y: dtype float64 vs int32"),
        (lambda t: t.replace("inputs: {x: a.y}", "inputs: {x: {from: a.y, shape: [-1, 3]}}"), "shape [-1] vs [-1, 3]"),
        (lambda t: t.replace("inputs: {x: a.y}", "inputs: {x: {from: a.y, when: 'a.y > 0'}}"),
         "conditions need a scalar output"),
        (lambda t: t.replace("inputs: {x: a.y}", "inputs: {x: {from: a.y, when: 'a.n_pos >> 0'}}"),
         "must read 'function.output OP number'"),
        (lambda t: t.replace("inputs: {x: a.y}", "inputs: {x: {from: a.y, when: 'b.y > 0'}}"), "is not upstream of 'b'"),
        (lambda t: t.replace("kind: gpu,", "kind: gpu, colour: red,"), "unknown key(s) ['colour']"),
        (lambda t: t.replace("kind: gpu,", "kind: gpu, slo_ms: -3,"), "slo_ms -3"),
        (lambda t: t.replace("kind: gpu,", "kind: gpu, device: tpu0,"), "device 'tpu0'"),
        (lambda t: t.replace("dtype: float64, shape: [-1]}}", "dtype: floaty}}", 1), "not a numpy dtype"),
        (lambda t: t.replace("name: wf", "name: 9wf"), "workflow name '9wf'"),
        (lambda t: "- just\n- a list\n", "expected a mapping"),
        (lambda t: "name: [unclosed", "not valid YAML"),
        (lambda t: t.replace("functions:", "functions: []\nxfunctions:"), "unknown key(s) ['xfunctions']"),
    ],
)
def test_malformed_specs_are_refused_with_the_culprit_named(edit, message) -> None:  # type: ignore[no-untyped-def]
    """Each malformed spec raises SpecError whose message names what is wrong."""
    with pytest.raises(SpecError) as e:
        spec(edit(textwrap.dedent(BASE)))
    assert message in str(e.value)


def test_longer_cycle_is_printed_in_order() -> None:
    text = FANS.replace("inputs: {x: input.x}", "inputs: {x: join.y}")
    with pytest.raises(SpecError, match=r"cycle: .*split.*->.*join|cycle: .*join.*->.*split"):
        spec(text)


def test_handlers_need_not_import_when_not_checked() -> None:
    """Loading for description only (e.g. on a gateway without the code) skips the import check."""
    s = spec(BASE.replace("rt_handlers:negate", "elsewhere_mod:fn"), check_handlers=False)
    assert s.function("b").handler == "elsewhere_mod:fn"


def test_json_spec_is_accepted() -> None:
    import json

    import yaml

    s = spec(json.dumps(yaml.safe_load(textwrap.dedent(BASE))))
    assert [f.name for f in s.functions] == ["a", "b"]


def test_type_decl_checks_values() -> None:
    d = TypeDecl("float32", (-1, 3))
    d.check(np.zeros((5, 3), np.float32), "v")
    with pytest.raises(SpecError, match="dtype float64 where float32"):
        d.check(np.zeros((5, 3)), "v")
    with pytest.raises(SpecError, match=r"shape \[5, 4\] where \[-1, 3\]"):
        d.check(np.zeros((5, 4), np.float32), "v")
    TypeDecl(None, ()).check(3, "scalar")


# ---- DagState: which functions run -----------------------------------------------------------------
def test_dag_runs_a_condition_only_when_it_holds() -> None:
    """Exact decisions for the conditional workflow: true -> both run; false -> both skipped at once."""
    s = spec(COND.replace("outputs: {pos: when_pos.y, always: a.y}", "outputs: {pos: after.y, always: a.y}"))
    d = DagState(s)
    assert d.start() == (["a"], [])
    assert d.finished("a", {"n_pos": 2}) == (["when_pos"], [])
    assert d.finished("when_pos", {}) == (["after"], [])
    assert d.finished("after", {}) == ([], []) and d.complete
    d = DagState(s)
    d.start()
    assert d.finished("a", {"n_pos": 0}) == ([], ["when_pos", "after"]) and d.complete


def test_dag_condition_without_its_scalar_fails_clearly() -> None:
    s = spec(COND.replace("outputs: {pos: when_pos.y, always: a.y}", "outputs: {pos: after.y, always: a.y}"))
    d = DagState(s)
    d.start()
    with pytest.raises(FunctionFailed, match="returned no scalar 'n_pos'"):
        d.finished("a", {})


def test_dag_refuses_a_finish_it_did_not_start() -> None:
    d = DagState(spec())
    d.start()
    with pytest.raises(FunctionFailed, match="reported done but was 'waiting'"):
        d.finished("b", {})


@given(st.lists(st.booleans(), min_size=3, max_size=3))
def test_dag_fans_in_only_after_every_branch(order) -> None:  # type: ignore[no-untyped-def]
    """Whatever order the branches finish in, join becomes ready exactly once, after both."""
    s = spec(FANS)
    d = DagState(s)
    assert d.start() == (["split"], [])
    ready, _ = d.finished("split", {})
    assert sorted(ready) == ["left", "right"]
    first, second = ("left", "right") if order[0] else ("right", "left")
    assert d.finished(first, {"n_pos": 1}) == ([], [])
    assert d.finished(second, {"n_pos": 1}) == (["join"], [])
    assert d.finished("join", {}) == ([], []) and d.complete


def _reference_decisions(s, finish_order, scalars):  # type: ignore[no-untyped-def]
    """The readiness rule restated as plainly as possible (every function, every pass): the oracle
    for DagState, which works from a plan made once per spec."""
    state = {f.name: "waiting" for f in s.functions}
    got: dict[str, dict[str, float]] = {}
    events = []

    def runs(f):  # type: ignore[no-untyped-def]
        for i in f.inputs:
            if i.source != "input" and state[i.source] == "skipped":
                return False
            c = i.when
            if c is not None and (state[c.function] == "skipped" or not c.holds(got[c.function][c.output])):
                return False
        return True

    def advance():  # type: ignore[no-untyped-def]
        changed = True
        while changed:
            changed = False
            for f in s.functions:
                if state[f.name] != "waiting":
                    continue
                if any(state[i.source] in ("waiting", "ready") for i in f.inputs if i.source != "input"):
                    continue
                state[f.name] = "ready" if runs(f) else "skipped"
                changed = changed or state[f.name] == "skipped"
                events.append((f.name, state[f.name]))

    advance()
    for name in finish_order:
        if state[name] == "ready":
            state[name] = "done"
            got[name] = scalars[name]
            advance()
    return events, state


@given(st.data())
def test_dag_decides_as_its_rule_says_on_random_workflows(data) -> None:  # type: ignore[no-untyped-def]
    """Random DAGs of up to 7 functions, each reading up to 3 earlier ones (some through a ``when:``
    condition on a scalar), finished in random orders with random scalars: the same ready and skipped
    decisions, in the same order, as the rule restated plainly (DagState's plan is an optimisation)."""
    n = data.draw(st.integers(1, 7))
    outs = ", ".join(f"o{k}: f{k}.y" for k in range(n))  # every function's output is read
    lines = ["name: rnd", "inputs: {x: null}", f"outputs: {{{outs}}}", "functions:"]
    for k in range(n):
        srcs = data.draw(st.lists(st.integers(0, k - 1), max_size=3, unique=True)) if k else []
        ins = {"x": "input.x"} if not srcs else {}
        for j, src in enumerate(srcs):
            if data.draw(st.booleans()):
                ins[f"i{j}"] = {"from": f"f{src}.y", "when": f"f{src}.n > {data.draw(st.integers(-1, 1))}"}
            else:
                ins[f"i{j}"] = f"f{src}.y"
        lines.append(f"  - {{name: f{k}, kind: cpu, handler: 'rt_handlers:double', inputs: {ins!r}, "
                     "outputs: {y: null, n: {shape: []}}}")
    s = spec("\n".join(lines).replace("'", '"'))
    scalars = {f"f{k}": {"n": float(data.draw(st.integers(-1, 2)))} for k in range(n)}
    d = DagState(s)
    ready, _ = d.start()
    pending = list(ready)
    order = []
    while pending:
        name = pending.pop(data.draw(st.integers(0, len(pending) - 1)))
        order.append(name)
        more, _ = d.finished(name, scalars[name])
        pending.extend(more)
    events, state = _reference_decisions(s, order, scalars)
    assert d.events == events
    assert d.state == state and d.complete
