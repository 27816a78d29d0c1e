"""Which functions of an invocation can run next: pure bookkeeping, no threads, clocks or I/O.

:class:`DagState` is fed what finished (with its scalar outputs) and answers which functions are now
ready to run and which are skipped: a function is decided once every function it reads from is
decided; it is skipped when one of them was skipped or one of its ``when:`` conditions is false.
The local runtime and the Ray executor drive it, and so does the simulator (``gfaas.sim.cluster``),
so both executors take the same readiness and skipping decisions. ``events`` logs every decision in
order, ``(function, "ready" | "skipped")``, which is how tests compare the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..errors import FunctionFailed
from .spec import WorkflowSpec

FnState = Literal["waiting", "ready", "done", "skipped"]


@dataclass
class DagState:
    spec: WorkflowSpec
    state: dict[str, FnState] = field(default_factory=dict)
    scalars: dict[str, dict[str, float]] = field(default_factory=dict)
    events: list[tuple[str, FnState]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._plan = self.spec.dag_plan
        for name, _, _ in self._plan:
            self.state.setdefault(name, "waiting")
        self._undecided = sum(1 for st in self.state.values() if st in ("waiting", "ready"))

    def start(self) -> tuple[list[str], list[str]]:
        """The functions that can run as soon as the request's inputs are in: ``(ready, skipped)``."""
        return self._advance()

    def finished(self, function: str, scalars: Mapping[str, float]) -> tuple[list[str], list[str]]:
        """Record that ``function`` ran; return the functions this makes ``(ready, skipped)``."""
        if self.state.get(function) != "ready":
            raise FunctionFailed(f"function {function!r} reported done but was {self.state.get(function)!r}")
        self.state[function] = "done"
        self._undecided -= 1
        self.scalars[function] = dict(scalars)
        return self._advance()

    def readers(self, function: str, scalars: Mapping[str, float]) -> list[str]:
        """The functions that read an output of ``function`` and may still run once it finishes with
        ``scalars``: not skipped already, and no condition over ``function``'s scalars false. (Conditions
        over functions not decided yet count as true.) Changes nothing; a producer uses it to store
        only data someone will read."""
        out = []
        for f in self.spec.functions:
            ins = [i for i in f.inputs if i.source == function]
            if not ins or self.state[f.name] == "skipped":
                continue
            ok = True
            for i in f.inputs:
                c = i.when
                if c is None:
                    continue
                if c.function == function:
                    value = scalars.get(c.output)
                elif self.state[c.function] == "done":
                    value = self.scalars.get(c.function, {}).get(c.output)
                else:
                    continue
                if value is None or not c.holds(value):
                    ok = False
            if ok:
                out.append(f.name)
        return out

    @property
    def complete(self) -> bool:
        return self._undecided == 0

    def _advance(self) -> tuple[list[str], list[str]]:
        ready: list[str] = []
        skipped: list[str] = []
        state = self.state
        changed = True
        while changed:  # a skip can decide functions further down at once
            changed = False
            for name, sources, gated in self._plan:
                if state[name] != "waiting":
                    continue
                lost = False  # a source was skipped
                for s in sources:
                    st = state[s]
                    if st == "waiting" or st == "ready":
                        break
                    lost = lost or st == "skipped"
                else:
                    # With no condition and no source skipped nothing can skip it: it runs.
                    runs = self._runs(name) if gated or lost else True
                    if runs:
                        state[name] = "ready"
                        ready.append(name)
                    else:
                        state[name] = "skipped"
                        self._undecided -= 1
                        skipped.append(name)
                        changed = True
                    self.events.append((name, state[name]))
        return ready, skipped

    def _runs(self, name: str) -> bool:
        for i in self.spec.function(name).inputs:
            if not i.from_workflow and self.state[i.source] == "skipped":
                return False
            c = i.when
            if c is None:
                continue
            if self.state[c.function] == "skipped":
                return False
            values = self.scalars.get(c.function, {})
            if c.output not in values:
                raise FunctionFailed(
                    f"condition '{c}' of function {name!r}: {c.function!r} returned no scalar {c.output!r} "
                    f"(scalars it returned: {sorted(values)}); return a number for it"
                )
            if not c.holds(values[c.output]):
                return False
        return True
