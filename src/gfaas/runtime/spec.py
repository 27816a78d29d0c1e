"""Workflow specs: YAML (or JSON) text in, a validated, frozen :class:`WorkflowSpec` out.

A spec names the workflow's inputs and outputs and its functions; each function lists where every
input comes from (``input.NAME`` or ``function.output``) and which outputs it returns. The four
patterns of the papers need nothing special: a sequence is a chain of sources, fan-out is one output
read by several functions, fan-in is a function with inputs from several, and a condition is an input
with ``when: "fn.output OP NUMBER"`` over a scalar output of an upstream function. ``docs/workflows.md``
has a full example.

Everything is checked here, once, with errors that name the function, the field and the fix: unknown
keys, bad names, unknown sources, cycles (the cycle is printed), functions nothing reads, handlers that
do not import, conditions over non-scalar outputs, and dtype/shape mismatches where both ends declare one.

Parsing is bounded for text from untrusted clients: YAML anchors and aliases are refused (an alias bomb
of a few hundred bytes expands into gigabytes), documents deeper than :data:`MAX_DEPTH` are refused
before anything recurses over them, and the topological sort is iterative. :func:`screen` adds what
only a public endpoint needs: caps on size and functions, and handlers only from allowed packages,
checked before anything is imported.
"""

from __future__ import annotations

import importlib
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
import yaml

from ..errors import ConfigError, SpecError
from ..policy.autoscale import ScalingSpec, parse_scaling
from ..policy.resources import Resources, parse_resources

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_FN = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_IO = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_WHEN = re.compile(r"^\s*([a-z][a-z0-9_]*)\.([a-z_][a-z0-9_]*)\s*(>=|<=|==|!=|>|<)\s*(-?[0-9.eE+-]+)\s*$")
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
}
INPUT = "input"  # the source name of the workflow's own inputs
ACCELERATORS = ("dscs",)  # values of a function's ``accelerator:`` field
# Nesting of a spec document (mappings and lists). A real spec is about 6 deep (functions -> entry ->
# inputs -> input -> shape); handler params get the rest. Deeper documents are refused before any
# code recurses over them (a RecursionError would otherwise surface as an internal error).
MAX_DEPTH = 32
MAX_TIMEOUT_S = 86400.0  # a function's timeout_s: at most a day
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ATTR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class TypeDecl:
    """A declared dtype and shape; ``None`` leaves it open, ``-1`` leaves one dimension open."""

    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    @property
    def scalar(self) -> bool:
        return self.shape == ()

    @cached_property
    def np_dtype(self) -> np.dtype[Any] | None:
        """The declared dtype as numpy's (made once: every call's inputs and outputs are checked)."""
        return None if self.dtype is None else np.dtype(self.dtype)

    def fits(self, arr: np.ndarray) -> bool:
        """Whether the array ``arr`` fits this declaration (:meth:`check` says why not)."""
        dt = self.np_dtype
        if dt is not None and arr.dtype != dt:
            return False
        return self.shape is None or arr.shape == self.shape or _shape_fits(arr.shape, self.shape)

    def check(self, value: Any, what: str) -> None:
        """Raise :class:`SpecError` if ``value`` does not fit this declaration."""
        # A device array (gfaas.dataplane.device_array) is checked from its metadata, not copied here.
        if isinstance(value, np.ndarray):
            arr = value
        else:
            arr = value if hasattr(value, "tensor") and hasattr(value, "shape") else np.asarray(value)
        dt = self.np_dtype
        if dt is not None and arr.dtype != dt:
            raise SpecError(f"{what}: dtype {arr.dtype} where {self.dtype} is declared")
        if self.shape is not None and arr.shape != self.shape and not _shape_fits(arr.shape, self.shape):
            raise SpecError(f"{what}: shape {list(arr.shape)} where {list(self.shape)} is declared (-1 = any)")

    def compatible(self, other: TypeDecl) -> str | None:
        """Why two declarations of one edge disagree, or None."""
        if self.dtype and other.dtype and np.dtype(self.dtype) != np.dtype(other.dtype):
            return f"dtype {self.dtype} vs {other.dtype}"
        if self.shape is not None and other.shape is not None and (
            len(self.shape) != len(other.shape)
            or any(a != b and a != -1 and b != -1 for a, b in zip(self.shape, other.shape, strict=True))
        ):
            return f"shape {list(self.shape)} vs {list(other.shape)}"
        return None


def name_diff(declared: Any, got: Any, extra_word: str) -> str:
    """``" (missing [...]) (<extra_word> [...])"`` for names one side lacks; ``""`` when they match."""
    missing, extra = sorted(set(declared) - set(got)), sorted(set(got) - set(declared))
    return (f" (missing {missing})" if missing else "") + (f" ({extra_word} {extra})" if extra else "")


def _shape_fits(shape: tuple[int, ...], decl: tuple[int, ...]) -> bool:
    return len(shape) == len(decl) and all(d == -1 or d == s for s, d in zip(shape, decl, strict=True))


@dataclass(frozen=True)
class Condition:
    """``function.output OP value``: evaluated on the scalar that ``function`` returned."""

    function: str
    output: str
    op: str
    value: float

    def holds(self, observed: Any) -> bool:
        return bool(_OPS[self.op](float(observed), self.value))

    def __str__(self) -> str:
        return f"{self.function}.{self.output} {self.op} {self.value:g}"


@dataclass(frozen=True)
class InputSpec:
    """One input of a function: where it comes from, and the condition that gates it (if any)."""

    name: str
    source: str  # INPUT or a function name
    output: str
    when: Condition | None = None
    decl: TypeDecl = field(default_factory=TypeDecl)

    @property
    def from_workflow(self) -> bool:
        return self.source == INPUT


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    kind: Literal["cpu", "gpu"]
    handler: str
    inputs: tuple[InputSpec, ...]
    outputs: Mapping[str, TypeDecl]
    model: str | None = None  # a zoo model's name
    slo_ms: float | None = None
    device: str = "auto"
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # ``accelerator: dscs``: the function's model may run on the in-storage accelerator of the drive
    # that holds its inputs (gfaas.runtime.accel); None: it always runs on a CPU/GPU worker.
    accelerator: str | None = None
    # ``model: {file: PATH}``: an ONNX file inside the workflow's code package (gfaas.models.files)
    model_file: str | None = None
    # ``scaling:`` and ``resources:`` (gfaas.policy.autoscale / .resources); None: the runtime's defaults
    scaling: ScalingSpec | None = None
    resources: Resources | None = None
    # ``timeout_s:``: the longest one call may run once its worker took it; past it the worker is killed
    # and replaced and the invocation fails naming the function. None: the runtime's default
    # (``RuntimeConfig.function_timeout_s``, 300 s).
    timeout_s: float | None = None

    def load_handler(self) -> Callable[..., Any]:
        """Import the handler (``module:function``)."""
        return _import_handler(self.handler, f"function {self.name!r}")


@dataclass(frozen=True)
class WorkflowSpec:
    name: str
    functions: tuple[FunctionSpec, ...]  # in a topological order
    inputs: Mapping[str, TypeDecl]
    outputs: Mapping[str, tuple[str, str]]  # workflow output -> (function, output)
    description: str = ""
    text: str = ""  # the text it was loaded from

    @cached_property
    def _by_name(self) -> dict[str, FunctionSpec]:
        return {f.name: f for f in self.functions}

    @cached_property
    def _readers(self) -> dict[tuple[str, str], tuple[str, ...]]:
        out: dict[tuple[str, str], list[str]] = {}
        for f in self.functions:
            for i in f.inputs:
                readers = out.setdefault((i.source, i.output), [])
                if f.name not in readers:
                    readers.append(f.name)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def dag_plan(self) -> tuple[tuple[str, tuple[str, ...], bool], ...]:
        """Per function, in order: its name, the functions it reads from, and whether anything but
        those functions finishing decides it (a ``when:`` condition): what :class:`~.dag.DagState`
        reads on every step, worked out once per spec."""
        return tuple((f.name, tuple(dict.fromkeys(i.source for i in f.inputs if not i.from_workflow)),
                      any(i.when is not None for i in f.inputs)) for f in self.functions)

    @cached_property
    def accelerated(self) -> bool:
        """Whether a function is marked ``accelerator:`` (only then does the runtime track which
        simulated drive holds each value: runtime.accel's rule reads it for those functions alone)."""
        return any(f.accelerator for f in self.functions)

    def function(self, name: str) -> FunctionSpec:
        f = self._by_name.get(name)
        if f is None:
            raise SpecError(f"workflow {self.name!r} has no function {name!r}; it has {[f.name for f in self.functions]}")
        return f

    def readers(self, source: str, output: str) -> list[str]:
        """The functions that read ``source.output`` (``source`` may be ``input``), in spec order."""
        return list(self._readers.get((source, output), ()))

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (what the gateway shows)."""
        return {
            "name": self.name,
            "description": self.description,
            "inputs": {k: _decl_dict(v) for k, v in self.inputs.items()},
            "outputs": {k: f"{fn}.{out}" for k, (fn, out) in self.outputs.items()},
            "functions": [
                {"name": f.name, "kind": f.kind, "handler": f.handler,
                 "model": f.model if f.model_file is None else {"file": f.model_file}, "slo_ms": f.slo_ms,
                 "timeout_s": f.timeout_s, "device": f.device, "accelerator": f.accelerator,
                 "inputs": {i.name: {"from": f"{i.source}.{i.output}", "when": str(i.when) if i.when else None}
                            for i in f.inputs},
                 "outputs": {k: _decl_dict(v) for k, v in f.outputs.items()}} | _scaling_dict(f)
                for f in self.functions
            ],
        }


def _scaling_dict(f: FunctionSpec) -> dict[str, Any]:
    """The declared ``scaling`` and ``resources`` of a function (absent when it declares none)."""
    out: dict[str, Any] = {}
    if f.scaling is not None:
        out["scaling"] = {k.name: getattr(f.scaling, k.name) for k in fields(f.scaling)}
    if f.resources is not None:
        out["resources"] = f.resources.describe()
    return out


def _decl_dict(d: TypeDecl) -> dict[str, Any]:
    return {"dtype": d.dtype, "shape": None if d.shape is None else list(d.shape)}


# ---- loading ---------------------------------------------------------------------------------------
def load(path: str | Path, *, check_handlers: bool = True) -> WorkflowSpec:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read workflow spec {p}: {exc.strerror}") from None
    return loads(text, check_handlers=check_handlers, where=str(p))


def loads(text: str, *, check_handlers: bool = True, where: str = "spec") -> WorkflowSpec:
    """Parse and validate a spec (YAML, of which JSON is a subset)."""
    return from_dict(parse(text, where), check_handlers=check_handlers, where=where, text=text)


class _SpecLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without anchors and aliases, and with a bound on nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            kind = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
            raise SpecError(f"YAML {kind}{event.anchor} at line {event.start_mark.line + 1}: anchors and aliases "
                            "are not accepted in specs; write the repeated part out")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise SpecError(f"nesting deeper than {MAX_DEPTH} levels at line {event.start_mark.line + 1}; "
                            "a spec needs about 6")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse(text: str, where: str = "spec") -> Any:
    """The spec text as a plain document (YAML, or JSON when it starts with ``{``), bounded: no YAML
    anchors or aliases, nesting at most :data:`MAX_DEPTH`; :class:`SpecError` otherwise."""
    try:
        if text.lstrip()[:1] != "{":
            loader = _SpecLoader(text)
            try:
                return loader.get_single_data()
            finally:
                loader.dispose()
        doc = json.loads(text)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SpecError(f"{where}: not valid YAML/JSON: {exc}") from None
    except RecursionError:
        raise SpecError(f"{where}: nesting deeper than {MAX_DEPTH} levels; a spec needs about 6") from None
    _check_depth(doc, where)
    return doc


def _check_depth(doc: Any, where: str) -> None:
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                raise SpecError(f"{where}: nesting deeper than {MAX_DEPTH} levels; a spec needs about 6")
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))


def screen(text: str, *, handler_packages: Sequence[str], max_functions: int, where: str = "spec",
           import_handlers: bool = True) -> Any:
    """Check a spec from an untrusted client before a runtime sees it; returns the parsed document.

    Beyond :func:`parse`'s bounds: at most ``max_functions`` functions, and every ``handler`` names a
    function of a module inside one of ``handler_packages`` (``pkg`` allows ``pkg`` and ``pkg.sub``),
    checked by name before the module is imported; the imported object must be a callable defined
    in an allowed package too (not, say, ``os.system`` imported into an allowed module). The rest
    of the validation is the runtime's (:func:`loads`). ``import_handlers=False`` (a spec deployed
    with its code package) checks only the bounds: the runtime checks the handlers against the package.
    """
    doc = parse(text, where)
    fns = doc.get("functions") if isinstance(doc, dict) else None
    if not isinstance(fns, list):
        return doc
    if len(fns) > max_functions:
        raise SpecError(f"{where}: {len(fns)} functions, more than this gateway's max_functions={max_functions}; "
                        "split the workflow or start the gateway with a larger max_functions")
    for k, f in enumerate(fns if import_handlers else []):
        handler = f.get("handler") if isinstance(f, dict) else None
        if isinstance(handler, str):
            name = f.get("name")
            _import_handler(handler, f"function {name!r}" if isinstance(name, str) else f"{where}: functions[{k}]",
                            handler_packages)
    return doc


def from_dict(doc: Any, *, check_handlers: bool = True, where: str = "spec", text: str = "") -> WorkflowSpec:
    top = _mapping(doc, where, {"name", "description", "inputs", "outputs", "functions"}, {"name", "functions"})
    name = _name(top["name"], _NAME, f"{where}: workflow name")
    ctx = f"workflow {name!r}"
    inputs = {_name(k, _IO, f"{ctx}: input name"): _decl(v, f"{ctx}: input {k!r}")
              for k, v in _mapping(top.get("inputs") or {}, f"{ctx}: inputs").items()}
    raw_fns = top["functions"]
    if not isinstance(raw_fns, list) or not raw_fns:
        raise SpecError(f"{ctx}: `functions` must be a non-empty list of function entries")
    fns: dict[str, FunctionSpec] = {}
    for k, raw in enumerate(raw_fns):
        f = _function(raw, f"{ctx}: functions[{k}]", check_handlers)
        if f.name in fns:
            raise SpecError(f"{ctx}: two functions are named {f.name!r}; names must be unique")
        if f.name == INPUT:
            raise SpecError(f"{ctx}: {INPUT!r} is reserved for the workflow's inputs; rename that function")
        fns[f.name] = f
    outputs: dict[str, tuple[str, str]] = {}
    for out, src in _mapping(top.get("outputs") or {}, f"{ctx}: outputs").items():
        fn, o = _source(src, f"{ctx}: output {out!r}")
        if fn not in fns or o not in fns[fn].outputs:
            raise SpecError(f"{ctx}: output {out!r} comes from {src!r}, which no function declares "
                            f"(functions and outputs: {_catalogue(fns)})")
        outputs[_name(out, _IO, f"{ctx}: output name")] = (fn, o)
    if not outputs:
        raise SpecError(f"{ctx}: `outputs` is empty; name at least one `function.output` the caller gets back")
    _check_edges(ctx, fns, inputs)
    order = _topological(ctx, fns)
    _check_conditions(ctx, fns, order)
    _check_used(ctx, fns, outputs)
    return WorkflowSpec(name, tuple(fns[n] for n in order), MappingProxyType(inputs), MappingProxyType(outputs),
                        str(top.get("description") or ""), text)


def _function(raw: Any, where: str, check_handlers: bool) -> FunctionSpec:
    d = _mapping(raw, where, {"name", "kind", "handler", "model", "slo_ms", "params", "inputs", "outputs", "device",
                                "accelerator", "scaling", "resources", "timeout_s"},
                 {"name", "kind", "handler", "inputs", "outputs"})
    name = _name(d["name"], _FN, f"{where}: name")
    ctx = f"function {name!r}"
    kind = d["kind"]
    if kind not in ("cpu", "gpu"):
        raise SpecError(f"{ctx}: kind {kind!r} is not cpu or gpu")
    handler = d["handler"]
    if not isinstance(handler, str) or handler.count(":") != 1:
        raise SpecError(f"{ctx}: handler {handler!r} must be 'module:function'")
    if check_handlers:
        _import_handler(handler, ctx)
    model = d.get("model")
    model_file = None
    if isinstance(model, dict):
        model_file = _model_file(model, ctx)
        model = None
    elif model is not None and not isinstance(model, str):
        raise SpecError(f"{ctx}: model {model!r} must be a model zoo name (see gfaas.models.names()) or "
                        "{file: PATH}, an ONNX file in the workflow's code package")
    slo = d.get("slo_ms")
    if slo is not None and (isinstance(slo, bool) or not isinstance(slo, int | float) or slo <= 0):
        raise SpecError(f"{ctx}: slo_ms {slo!r} must be a positive number of milliseconds")
    timeout = d.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not 0 < timeout <= MAX_TIMEOUT_S):
        raise SpecError(f"{ctx}: timeout_s {timeout!r} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}] "
                        "(leave it out for the runtime's default, 300 s)")
    device = d.get("device", "auto")
    if not isinstance(device, str) or not re.match(r"^(auto|cpu|cuda:\d+)$", device):
        raise SpecError(f"{ctx}: device {device!r} must be auto, cpu or cuda:N")
    accelerator = d.get("accelerator")
    if accelerator is not None:
        if not isinstance(accelerator, str) or accelerator not in ACCELERATORS:
            raise SpecError(f"{ctx}: accelerator {accelerator!r} is not known; allowed: {list(ACCELERATORS)} "
                            "(or leave the field out)")
        if model is None and model_file is None:
            raise SpecError(f"{ctx}: accelerator {accelerator!r} runs the function's model, but the function names "
                            "no model; add `model: NAME` (a zoo model, gfaas.models.names()) or remove `accelerator`")
    params = d.get("params") or {}
    if not isinstance(params, dict):
        raise SpecError(f"{ctx}: params must be a mapping, got {type(params).__name__}")
    ins = []
    for iname, src in _mapping(d["inputs"], f"{ctx}: inputs").items():
        ins.append(_input(_name(iname, _IO, f"{ctx}: input name"), src, f"{ctx}: input {iname!r}"))
    outs = {_name(k, _IO, f"{ctx}: output name"): _decl(v, f"{ctx}: output {k!r}")
            for k, v in _mapping(d["outputs"], f"{ctx}: outputs").items()}
    if not ins:
        raise SpecError(f"{ctx} has no inputs, so nothing can ever trigger it; give it at least one input")
    if not outs:
        raise SpecError(f"{ctx} declares no outputs; list what its handler returns under `outputs:`")
    try:
        scaling = parse_scaling(d["scaling"]) if d.get("scaling") is not None else None
        resources = parse_resources(d["resources"]) if d.get("resources") is not None else None
    except SpecError:
        raise
    except ConfigError as exc:
        raise SpecError(f"{ctx}: {exc}") from None
    return FunctionSpec(name, kind, handler, tuple(ins), MappingProxyType(outs), model,
                        None if slo is None else float(slo), device, MappingProxyType(dict(params)), accelerator,
                        model_file, scaling, resources, None if timeout is None else float(timeout))


def _model_file(raw: dict[str, Any], ctx: str) -> str:
    """The package path of ``model: {file: PATH}`` (relative, inside the package, an .onnx file)."""
    d = _mapping(raw, f"{ctx}: model", {"file"}, {"file"})
    path = d["file"]
    if not isinstance(path, str):
        raise SpecError(f"{ctx}: model file {path!r} must be a path inside the code package, e.g. models/net.onnx")
    from .codepkg import check_path

    try:
        path = check_path(path)
    except SpecError as exc:
        raise SpecError(f"{ctx}: model file: {exc}") from None
    if not path.endswith(".onnx"):
        raise SpecError(f"{ctx}: model file {path!r} is not an .onnx file; gfaas runs ONNX models (export yours "
                        "with torch.onnx.export); torch and safetensors files need the model's code as well")
    return path


def _input(name: str, raw: Any, where: str) -> InputSpec:
    if isinstance(raw, str):
        src, out = _source(raw, where)
        return InputSpec(name, src, out)
    d = _mapping(raw, where, {"from", "when", "dtype", "shape"}, {"from"})
    src, out = _source(d["from"], where)
    when = None
    if d.get("when") is not None:
        m = _WHEN.match(str(d["when"]))
        if not m:
            raise SpecError(f"{where}: condition {d['when']!r} must read 'function.output OP number' "
                            f"with OP one of {' '.join(_OPS)}")
        try:
            value = float(m.group(4))
        except ValueError:
            raise SpecError(f"{where}: condition {d['when']!r}: {m.group(4)!r} is not a number") from None
        when = Condition(m.group(1), m.group(2), m.group(3), value)
    return InputSpec(name, src, out, when, _decl({k: d[k] for k in ("dtype", "shape") if k in d}, where))


def _source(raw: Any, where: str) -> tuple[str, str]:
    if not isinstance(raw, str) or raw.count(".") != 1:
        raise SpecError(f"{where}: source {raw!r} must be 'input.NAME' or 'function.output'")
    a, b = raw.split(".")
    return a, b


def _decl(raw: Any, where: str) -> TypeDecl:
    if raw is None:
        return TypeDecl()
    d = _mapping(raw, where, {"dtype", "shape"})
    dtype = d.get("dtype")
    if dtype is not None:
        try:
            dtype = np.dtype(dtype).name
        except TypeError:
            raise SpecError(f"{where}: dtype {d['dtype']!r} is not a numpy dtype name (e.g. float32, uint8)") from None
    shape = d.get("shape")
    if shape is not None:
        if not isinstance(shape, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= -1
                                                  for x in shape):
            raise SpecError(f"{where}: shape {shape!r} must be a list of sizes (-1 = any), [] for a scalar")
        shape = tuple(shape)
    return TypeDecl(dtype, shape)


def _mapping(raw: Any, where: str, allowed: set[str] | None = None,
             required: frozenset[str] | set[str] = frozenset()) -> dict:
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: expected a mapping, got {type(raw).__name__} {raw!r:.60}")
    if allowed is not None:
        unknown = sorted(set(map(str, raw)) - allowed)
        if unknown:
            raise SpecError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    missing = sorted(required - set(raw))
    if missing:
        raise SpecError(f"{where}: missing key(s) {missing}")
    return raw


def _name(raw: Any, pattern: re.Pattern[str], where: str) -> str:
    if not isinstance(raw, str) or not pattern.match(raw):
        raise SpecError(f"{where} {raw!r} must match {pattern.pattern}")
    return raw


def _allowed(module: str, packages: Sequence[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _import_handler(handler: str, where: str, packages: Sequence[str] | None = None) -> Callable[..., Any]:
    """Import ``module:function``; with ``packages``, only from modules inside them (checked first)."""
    module, _, attr = handler.partition(":")
    if not _MODULE.match(module) or not _ATTR.match(attr) or attr.startswith("__"):
        raise SpecError(f"{where}: handler {handler!r} must be 'package.module:function' (Python names, "
                        "no dunder attributes)")
    if packages is not None and not _allowed(module, packages):
        raise SpecError(f"{where}: handler {handler!r} is not in an allowed package; this gateway loads handlers "
                        f"only from {sorted(packages)} (the handler_packages setting, gfaas serve "
                        "--allow-handlers PACKAGE)")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        raise SpecError(f"{where}: handler module {module!r} does not import: {exc}") from None
    except AttributeError:
        raise SpecError(f"{where}: module {module!r} has no handler {attr!r}") from None
    if not callable(fn):
        raise SpecError(f"{where}: handler {handler!r} is not callable")
    defined_in = getattr(fn, "__module__", None)
    if packages is not None and not (isinstance(defined_in, str) and _allowed(defined_in, packages)):
        raise SpecError(f"{where}: handler {handler!r} is defined in {defined_in!r}, outside the allowed packages "
                        f"{sorted(packages)} (the handler_packages setting)")
    return fn


def _catalogue(fns: Mapping[str, FunctionSpec]) -> str:
    return ", ".join(f"{f.name}.{{{','.join(f.outputs)}}}" for f in fns.values())


def _check_edges(ctx: str, fns: Mapping[str, FunctionSpec], inputs: Mapping[str, TypeDecl]) -> None:
    for f in fns.values():
        for i in f.inputs:
            where = f"{ctx}: function {f.name!r} input {i.name!r}"
            if i.from_workflow:
                if i.output not in inputs:
                    raise SpecError(f"{where} reads input.{i.output}, but the workflow declares inputs "
                                    f"{sorted(inputs)}; add it under `inputs:`")
                produced = inputs[i.output]
            else:
                if i.source not in fns:
                    raise SpecError(f"{where} reads from unknown function {i.source!r}; functions: {sorted(fns)}")
                if i.output not in fns[i.source].outputs:
                    raise SpecError(f"{where} reads {i.source}.{i.output}, which {i.source!r} does not declare "
                                    f"(it declares {sorted(fns[i.source].outputs)})")
                produced = fns[i.source].outputs[i.output]
            why = produced.compatible(i.decl)
            if why:
                raise SpecError(f"{where}: type mismatch with {i.source}.{i.output}: {why}")


def _topological(ctx: str, fns: Mapping[str, FunctionSpec]) -> list[str]:
    """Dependencies first, in a depth-first order; iterative, so a long chain cannot exhaust the stack."""
    deps = {n: sorted({i.source for i in f.inputs if not i.from_workflow}) for n, f in fns.items()}
    order: list[str] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done
    for root in fns:
        if state.get(root):
            continue
        state[root] = 1
        path, stack = [root], [iter(deps[root])]
        while stack:
            d = next(stack[-1], None)
            if d is None:
                stack.pop()
                n = path.pop()
                state[n] = 2
                order.append(n)
            elif state.get(d) == 1:
                cyc = path[path.index(d):] + [d]
                raise SpecError(f"{ctx}: the functions form a cycle: {' -> '.join(reversed(cyc))}; "
                                "a workflow must be a DAG")
            elif not state.get(d):
                state[d] = 1
                path.append(d)
                stack.append(iter(deps[d]))
    return order


def _check_conditions(ctx: str, fns: Mapping[str, FunctionSpec], order: list[str]) -> None:
    ancestors: dict[str, set[str]] = {}
    for n in order:
        a: set[str] = set()
        for i in fns[n].inputs:
            if not i.from_workflow:
                a |= {i.source} | ancestors[i.source]
        ancestors[n] = a
    for f in fns.values():
        for i in f.inputs:
            c = i.when
            if c is None:
                continue
            where = f"{ctx}: function {f.name!r} input {i.name!r} condition '{c}'"
            if c.function not in fns or c.output not in fns[c.function].outputs:
                raise SpecError(f"{where} names {c.function}.{c.output}, which no function declares")
            if c.function not in ancestors[f.name]:
                raise SpecError(f"{where}: {c.function!r} is not upstream of {f.name!r}, so its value is not "
                                "known when the condition is evaluated")
            decl = fns[c.function].outputs[c.output]
            if decl.shape is not None and decl.shape != ():
                raise SpecError(f"{where}: {c.function}.{c.output} is declared with shape {list(decl.shape)}; "
                                "conditions need a scalar output (shape: [])")


def _check_used(ctx: str, fns: Mapping[str, FunctionSpec], outputs: Mapping[str, tuple[str, str]]) -> None:
    used = {fn for fn, _ in outputs.values()}
    for f in fns.values():
        used |= {i.source for i in f.inputs}
        used |= {i.when.function for i in f.inputs if i.when}
    for n in fns:
        if n not in used:
            raise SpecError(f"{ctx}: nothing reads the outputs of function {n!r}; pass one to another function "
                            "or list it under `outputs:`, or remove the function")
