"""The workflows the simulator runs: the runtime's own specs with the runtime's measured data sizes.

The six reference workflows (seed 000 Table 1, seed 001 Fig. 12) are built from the specs the
runtime deploys, ``gfaas/workflows/specs/NAME.yaml``: the same function names, kinds (cpu/gpu),
edges, conditions, fan-out and fan-in. Each request is stepped through the runtime's own
:class:`~gfaas.runtime.dag.DagState` (see ``gfaas.sim.cluster``), so readiness and the skipping of
conditional branches are the runtime's decisions.

Bytes per edge are the runtime's, measured by running each workflow at full scale (``seed=0``) and
committed as ``gfaas/workflows/edge_sizes.json`` (``python -m gfaas.workflows.sizes --json``; the
simulator cannot afford to run the models). Per (producer, consumer) pair the simulator moves one
object holding the bytes of every output the consumer reads from the producer. A GPU function's
inputs from the request (``input.NAME``) start in host memory (the host-to-gFn case) and its outputs
returned to the caller go back to host memory (gFn-to-host). CPU functions run on the host.

Where the papers run a function on a GPU that the specs run on the CPU (the papers do all pre- and
post-processing on the GPU with CV-CUDA; the specs were written for CPU machines), the simulator
follows the papers: ``data/paper_workloads.toml`` lists those functions with the sections that say so
(:mod:`gfaas.sim.paper_workloads`), and each becomes a GPU function of profile
``profiles.CVCUDA``, which costs the bytes it reads and writes at the GPU's memory bandwidth.

What the specs do not say is in two tables below, in one place: :data:`GPU_PROFILES` (which compute
profile of ``gfaas.sim.profiles`` and which batch each GPU function runs) and
:data:`CONDITION_PROBABILITY` (how often each condition holds; the simulator draws the scalar the
condition reads from its seeded RNG). CPU functions take ``profiles.CPU_MS[function name]``.

``moa`` (Mixture-of-Agents, seed 001 §6.4) has no runtime spec; it is built here by hand, like
the small workflows tests build with :class:`Workflow`, and gets a spec generated from its edges.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from ..errors import ConfigError, SpecError
from ..runtime.placement import function_edges
from ..runtime.spec import Condition, WorkflowSpec, from_dict, loads
from ..workflows.measured import edge_sizes as edge_sizes
from . import paper_workloads
from .profiles import CVCUDA

MB = 10**6
Pattern = Literal["sequence", "condition", "fan-in", "fan-out", "fan-out + fan-in", "layers"]

#: The papers' pattern of each reference workflow (docs/workflows.md).
PATTERNS: dict[str, Pattern] = {"traffic": "condition", "driving": "sequence", "video": "fan-in",
                                "image": "fan-out + fan-in", "social": "condition", "yelp": "sequence"}

#: GPU function -> (compute profile in ``gfaas.sim.profiles.MODEL_GFLOPS``, batch). The profiles are the
#: simulator's (FLOPs-scaled from ResNet-50 on V100); where the spec's zoo model has another name the
#: mapping says which profile stands in:
#:
#: - ``yolo`` -> ``yolo-det`` (traffic) and ``yolo-face`` (video, the same FLOPs);
#: - ``fcn`` -> ``yolo-seg``: the papers' segmenter, which the zoo's FCN-ResNet50 replaces;
#: - ``efficientnet_b0`` -> ``alexnet`` (0.72 GFLOPs, about EfficientNet-B0's 0.78) and ``vit_b16`` ->
#:   ``resnet101``: the image ensemble's light and heavy members in the simulator's old version;
#: - ``bert_base`` -> ``bert``.
#:
#: The batch is what the function processes per request at full scale (the leading dimension of its
#: input in ``edge_sizes.json`` for ``seed=0``): frames, crops, images or token rows.
GPU_PROFILES: dict[tuple[str, str], tuple[str, int]] = {
    ("traffic", "detect"): ("yolo-det", 2),            # 2 decoded frames
    ("traffic", "recog_person"): ("resnet50", 4),      # 4 person crops
    ("traffic", "recog_vehicle"): ("resnet50", 4),     # 4 vehicle crops
    ("driving", "segment"): ("yolo-seg", 4),           # 4 frames
    **{("video", f"detect_face_{i}"): ("yolo-face", 2) for i in range(4)},  # 2 frames per chunk
    ("video", "recognise"): ("resnet50", 24),          # 4 chunks x 6 face crops
    ("image", "classify_resnet"): ("resnet50", 1),     # 1 image
    ("image", "classify_effnet"): ("alexnet", 1),
    ("image", "classify_vit"): ("resnet101", 1),
    ("social", "bert"): ("bert", 1),                   # 1 token sequence
    ("yelp", "bert_filter"): ("bert", 5),              # 5 sentences
    ("yelp", "bert_sentiment"): ("bert", 4),           # the 4 kept
}

#: (workflow, function, scalar output) -> probability that the conditions over it hold. The simulator
#: draws per request whether they do and hands DagState a value of the scalar that makes them true or
#: false (``condition_value``). Traffic's rates are the simulator's earlier per-edge ones.
CONDITION_PROBABILITY: dict[tuple[str, str, str], float] = {
    ("traffic", "detect", "num_persons"): 0.6,
    ("traffic", "detect", "num_vehicles"): 0.8,
    ("social", "ocr", "num_tokens"): 0.7,
}


@dataclass(frozen=True)
class Function:
    """A workflow stage. ``model`` names a GPU profile (kind gpu) or a CPU time (kind cpu)."""

    name: str
    kind: Literal["gpu", "cpu"]
    model: str
    batch: int = 1
    input_bytes: int = 0    # bytes it reads from host memory when it starts
    output_bytes: int = 0   # bytes it writes back to host memory when it ends


@dataclass(frozen=True)
class DataEdge:
    """Bytes from one function to another. ``prob`` < 1 (hand-built workflows only) becomes a condition
    of the generated spec; workflows built from a runtime spec carry their conditions in the spec."""

    src: str
    dst: str
    nbytes: int
    prob: float = 1.0


@dataclass(frozen=True)
class Workflow:
    """Functions and edges with sizes, plus the spec DagState steps (generated when not given) and,
    per condition scalar, the probability that it lets its conditions hold."""

    name: str
    pattern: Pattern
    functions: tuple[Function, ...]
    edges: tuple[DataEdge, ...]
    source: str = ""
    spec: WorkflowSpec | None = field(default=None, compare=False)
    conditions: Mapping[tuple[str, str], float] = field(default_factory=dict, compare=False)
    _by_name: dict[str, Function] = field(init=False, repr=False, compare=False)
    _preds: dict[str, list[DataEdge]] = field(init=False, repr=False, compare=False)
    _succs: dict[str, list[DataEdge]] = field(init=False, repr=False, compare=False)
    _values: dict[tuple[str, str, bool], float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [f.name for f in self.functions]
        if len(set(names)) != len(names):
            raise ConfigError(f"workflow {self.name!r} repeats a function name: {names}")
        object.__setattr__(self, "_by_name", {f.name: f for f in self.functions})
        object.__setattr__(self, "_values", {})
        for e in self.edges:
            for end in (e.src, e.dst):
                if end not in self._by_name:
                    raise ConfigError(f"workflow {self.name!r}: edge {e.src}->{e.dst} names unknown function {end!r}")
            if not 0 < e.prob <= 1:
                raise ConfigError(f"workflow {self.name!r}: edge {e.src}->{e.dst} probability {e.prob} not in (0, 1]")
        object.__setattr__(self, "_preds", {n: [e for e in self.edges if e.dst == n] for n in names})
        object.__setattr__(self, "_succs", {n: [e for e in self.edges if e.src == n] for n in names})
        self.topological_order()  # raises on cycles
        if self.spec is None:
            spec, conds = _generated_spec(self)
            object.__setattr__(self, "spec", spec)
            object.__setattr__(self, "conditions", conds)
        else:
            missing = sorted(set(names) ^ {f.name for f in self.spec.functions})
            if missing:
                raise ConfigError(f"workflow {self.name!r}: functions {missing} are not both in the spec and here")

    def function(self, name: str) -> Function:
        return self._by_name[name]

    def preds(self, name: str) -> list[DataEdge]:
        return self._preds[name]

    def succs(self, name: str) -> list[DataEdge]:
        return self._succs[name]

    def topological_order(self) -> list[str]:
        indeg = {f.name: 0 for f in self.functions}
        for e in self.edges:
            indeg[e.dst] += 1
        ready = [f.name for f in self.functions if indeg[f.name] == 0]
        out: list[str] = []
        while ready:
            n = ready.pop(0)
            out.append(n)
            for e in self.edges:
                if e.src == n:
                    indeg[e.dst] -= 1
                    if indeg[e.dst] == 0:
                        ready.append(e.dst)
        if len(out) != len(self.functions):
            raise ConfigError(f"workflow {self.name!r} has a cycle; a workflow must be a DAG")
        return out

    @property
    def gpu_functions(self) -> list[str]:
        return [f.name for f in self.functions if f.kind == "gpu"]

    def draw_scalars(self, rng: random.Random) -> dict[str, dict[str, float]]:
        """One request's condition scalars, function -> {output: value}, drawn in spec order."""
        assert self.spec is not None
        out: dict[str, dict[str, float]] = {}
        values = self._values  # (fn, output, holds) -> its scalar: the same for every request of the spec
        for (fn, output), p in self.conditions.items():
            holds = p >= 1 or rng.random() < p
            v = values.get((fn, output, holds))
            if v is None:
                v = values[(fn, output, holds)] = condition_value(_conditions_over(self.spec, fn, output)[0], holds)
            out.setdefault(fn, {})[output] = v
        return out


def condition_value(c: Condition, holds: bool) -> float:
    """A value of ``c``'s scalar for which ``c`` holds (or, with ``holds=False``, does not)."""
    for x in (c.value + 1, c.value, c.value - 1):
        if c.holds(x) == holds:
            return x
    raise ConfigError(f"no value makes condition '{c}' {'hold' if holds else 'fail'}")  # pragma: no cover


def _conditions_over(spec: WorkflowSpec, fn: str, output: str) -> list[Condition]:
    return [i.when for f in spec.functions for i in f.inputs
            if i.when is not None and i.when.function == fn and i.when.output == output]


def _generated_spec(wf: Workflow) -> tuple[WorkflowSpec, dict[tuple[str, str], float]]:
    """A spec with ``wf``'s functions and edges; an edge with ``prob`` < 1 reads ``src.take_DST > 0``."""
    fns = []
    conds: dict[tuple[str, str], float] = {}
    for name in wf.topological_order():
        f = wf.function(name)
        ins: dict[str, Any] = {}
        for e in wf.preds(name):
            src: Any = f"{e.src}.out_{e.dst}"
            if e.prob < 1:
                src = {"from": src, "when": f"{e.src}.take_{e.dst} > 0"}
                conds[(e.src, f"take_{e.dst}")] = e.prob
            ins[f"from_{e.src}"] = src
        if not ins:
            ins["x"] = "input.x"
        outs: dict[str, Any] = {"done": None}
        for e in wf.succs(name):
            outs[f"out_{e.dst}"] = None
            if e.prob < 1:
                outs[f"take_{e.dst}"] = {"shape": []}
        fns.append({"name": f.name, "kind": f.kind, "handler": "gfaas.sim:none", "inputs": ins, "outputs": outs})
    doc = {"name": wf.name, "inputs": {"x": None}, "functions": fns,
           "outputs": {f"{f.name}_done": f"{f.name}.done" for f in wf.functions}}
    try:
        return from_dict(doc, check_handlers=False, where=f"simulated workflow {wf.name!r}"), conds
    except SpecError as exc:
        raise ConfigError(f"workflow {wf.name!r} cannot be stepped as a spec: {exc}") from None


# ---- the reference workflows, from the runtime's specs ---------------------------------------------
def from_spec(spec: WorkflowSpec, sizes: list[dict[str, Any]], pattern: Pattern = "sequence",
              source: str = "", on_gpu: Collection[tuple[str, str]] = ()) -> Workflow:
    """A simulator workflow for a runtime spec with measured ``sizes`` (rows of ``edge_sizes.json``).
    ``on_gpu``: (workflow, function) pairs of CPU functions to run on a GPU as CV-CUDA operators."""
    nbytes: dict[tuple[str, str], int] = {(r["from"], r["to"]): int(r["nbytes"]) for r in sizes}
    kind = {f.name: f.kind for f in spec.functions}
    input_bytes = dict.fromkeys(kind, 0)
    output_bytes = dict.fromkeys(kind, 0)
    # Between functions: the runtime's own description, which its placement uses too.
    pair = {(u, v): n for u, v, n in function_edges(spec, sizes, strict=True)}
    for f in spec.functions:
        for i in f.inputs:
            key = (f"{i.source}.{i.output}", f"{f.name}.{i.name}")
            if i.from_workflow:
                if key not in nbytes:
                    raise ConfigError(f"workflow {spec.name!r}: no measured size for input {key[0]} -> {key[1]};"
                                      " regenerate gfaas/workflows/edge_sizes.json"
                                      " (python -m gfaas.workflows.sizes --json)")
                input_bytes[f.name] += nbytes[key]
    for out, (fn, o) in spec.outputs.items():
        key = (f"{fn}.{o}", f"caller.{out}")
        if key not in nbytes:
            raise ConfigError(f"workflow {spec.name!r}: no measured size for output {out!r} ({fn}.{o})")
        output_bytes[fn] += nbytes[key]
    fns = []
    for f in spec.functions:
        if f.kind == "gpu":
            if (spec.name, f.name) not in GPU_PROFILES:
                raise ConfigError(f"workflow {spec.name!r}: GPU function {f.name!r} has no entry in "
                                  "gfaas.sim.workflows.GPU_PROFILES (compute profile, batch)")
            model, batch = GPU_PROFILES[(spec.name, f.name)]
            fns.append(Function(f.name, "gpu", model, batch, input_bytes[f.name], output_bytes[f.name]))
        elif (spec.name, f.name) in on_gpu:  # the papers' CV-CUDA pre- or post-processing
            fns.append(Function(f.name, "gpu", CVCUDA, touched_bytes(sizes, f.name), input_bytes[f.name],
                                output_bytes[f.name]))
        else:  # on the host: request data and results are already there
            fns.append(Function(f.name, "cpu", f.name))
    edges = tuple(DataEdge(s, d, n) for (s, d), n in pair.items())
    conds = {}
    for f in spec.functions:
        for i in f.inputs:
            c = i.when
            if c is not None and (c.function, c.output) not in conds:
                p = CONDITION_PROBABILITY.get((spec.name, c.function, c.output))
                if p is None:
                    raise ConfigError(f"workflow {spec.name!r}: condition '{c}' has no probability in "
                                      "gfaas.sim.workflows.CONDITION_PROBABILITY")
                conds[(c.function, c.output)] = p
    return Workflow(spec.name, pattern, tuple(fns), edges, source, spec, conds)


def touched_bytes(sizes: list[dict[str, Any]], fn: str) -> int:
    """The bytes ``fn`` reads and writes per request (rows of ``edge_sizes.json``): every input once,
    and every output once however many functions read it."""
    read = sum(int(r["nbytes"]) for r in sizes if r["to"].startswith(f"{fn}."))
    written = {r["from"]: int(r["nbytes"]) for r in sizes if r["from"].startswith(f"{fn}.")}
    return read + sum(written.values())


def reference(name: str, paper: bool = False) -> Workflow:
    """One of the six reference workflows, from its runtime spec and measured sizes; with ``paper``,
    as the papers ran it (``data/paper_workloads.toml``: pre- and post-processing on the GPU)."""
    from .. import workflows as runtime_workflows

    spec = loads(runtime_workflows.spec_text(name), check_handlers=False, where=f"specs/{name}.yaml")
    return from_spec(spec, edge_sizes()[name], PATTERNS[name], f"gfaas/workflows/specs/{name}.yaml",
                     paper_workloads.on_gpu() if paper else ())


def moa(layers: int = 3, agents: int = 3, kv_bytes: int = 4096 * 2 * 32 * 4096 * 2) -> Workflow:
    """Mixture-of-Agents: every agent of a layer reads the KV caches of all agents of the previous one.

    The default KV cache is a 4K-token prompt of a 7B-class model: 4096 tokens x 2 (K, V) x 32 layers
    x 4096 hidden x 2 bytes = 2.1 GB (seed 001 §6.4 uses 4K inputs).
    """
    fns = []
    edges = []
    for layer in range(layers):
        for a in range(agents):
            fns.append(Function(f"l{layer}a{a}", "gpu", "bert", batch=1,
                                input_bytes=4096 * 8 if layer == 0 else 0))
            if layer:
                edges += [DataEdge(f"l{layer - 1}a{p}", f"l{layer}a{a}", kv_bytes) for p in range(agents)]
    return Workflow("moa", "layers", tuple(fns), tuple(edges), "GROUTER §6.4, Mixture-of-Agents (Wang et al. 2024)")


REFERENCE = tuple(PATTERNS)
WORKFLOWS = (*REFERENCE, "moa")


def workflow(name: str, paper: bool = False) -> Workflow:
    """A workflow by name. ``paper``: the papers' version of a reference workflow (:func:`reference`),
    which the papers' experiments run; without it, the runtime's as deployed (the cluster-scale runs)."""
    if name == "moa":
        return moa()
    if name not in PATTERNS:
        raise ConfigError(f"unknown workflow {name!r}; choose one of {', '.join(WORKFLOWS)}")
    return _reference(name, paper)


@cache
def _reference(name: str, paper: bool) -> Workflow:
    return reference(name, paper)
