"""The simulator's requests step their DAG natively: ``gfaas_native.DagCore`` over a ``DagPlan``.

:class:`gfaas.runtime.dag.DagState` is the reference, and the runtime's: a request of the simulator
asks it which functions are ready or skipped and who reads an output (``start``, ``finished``,
``readers``, ``complete``, ``events``) several times per function. ``DagCore`` answers the same with
the same rule restated in Rust (``native/src/dag.rs``) over a plan compiled once per spec here
(``tests/unit/test_sim_dag_native.py`` holds the two to the same decisions on random DAGs with
conditions and skips). ``dag_kind()`` says which one the cluster uses: the native one where the
simulator's core is native (``kernel.CORE``) and the extension has it; ``GFAAS_SIM_DAG=python`` keeps
the reference under the native core, and the pure-Python core is all reference.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..native import choose, native_class
from ..runtime.spec import WorkflowSpec
from .kernel import CORE

_Plan: Any = native_class("DagPlan")
_Core: Any = native_class("DagCore")


def native_dag_available() -> bool:
    """Whether ``gfaas_native`` here has ``DagPlan`` and ``DagCore``."""
    return _Plan is not None and _Core is not None


def compile_plan(spec: WorkflowSpec) -> Any:
    """``spec`` as a ``DagPlan``: per function its name, ``dag_plan``'s sources and gate, and its inputs
    (source, or None for the workflow's own; condition as ``(function, output, op, value, condition)``)."""
    if not native_dag_available():
        raise ConfigError("the native DAG needs gfaas_native with DagCore: run `make setup` (needs cargo) or "
                          "`pip install ./native`; the pure-Python DagState takes the same decisions")
    fns = []
    for (name, sources, gated), f in zip(spec.dag_plan, spec.functions, strict=True):
        ins = [(None if i.from_workflow else i.source,
                None if i.when is None else (i.when.function, i.when.output, i.when.op, float(i.when.value), i.when))
               for i in f.inputs]
        fns.append((name, list(sources), gated, ins))
    return _Plan(fns)


def new_core(plan: Any, events: list[tuple[str, str]] | None = None) -> Any:
    """One request's ``DagCore`` over ``plan``, logging its decisions into ``events`` when given."""
    return _Core(plan, events)


def dag_kind() -> str:
    """``"native"`` or ``"python"``: the DAG stepping the cluster uses (see the module docstring)."""
    if CORE != "native":
        choose("GFAAS_SIM_DAG", True, "DagCore")  # a bad value is an error either way
        return "python"
    return choose("GFAAS_SIM_DAG", native_dag_available(), "DagCore")


DAG_KIND = dag_kind()
