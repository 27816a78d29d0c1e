"""The six reference inference workflows of the FaaSTube/GROUTER papers (seed 000 Table 1), with real
numpy pre- and post-processing around the model zoo's networks.

Each workflow is a module here (handlers, ``make_inputs(seed, scale)``, ``SPEC``) plus a spec file
``specs/NAME.yaml`` shipped as package data. This module is the registry:

* :func:`names`, :func:`spec_text`, :func:`make_inputs` — what the runtime, gateway and demo deploy;
* :func:`run_local` — a tiny reference executor that runs a workflow's handlers in this process in
  topological order, evaluating the ``when:`` conditions. It is the oracle the real runtime's outputs
  are compared against, so it stays deliberately simple. ``docs/workflows.md`` describes the DAGs.
"""

from __future__ import annotations

import importlib
import operator
import re
from collections.abc import Callable, Mapping
from importlib import resources
from types import ModuleType
from typing import Any

import numpy as np
import yaml

from ..errors import NotFound, SpecError
from ..runtime.context import in_process_context

_NAMES = ("driving", "image", "social", "traffic", "video", "yelp")
_WHEN = re.compile(r"^\s*([a-z][a-z0-9_]*)\.([a-z_][a-z0-9_]*)\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*$")
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
}
ModelSource = Callable[[str, str], Any] | Mapping[str, Any]


def names() -> list[str]:
    """The reference workflows, sorted."""
    return list(_NAMES)


def _check(name: str) -> str:
    if name not in _NAMES:
        raise NotFound(f"no reference workflow {name!r}; known: {', '.join(_NAMES)}")
    return name


def module(name: str) -> ModuleType:
    """The module holding a workflow's handlers and input generator."""
    return importlib.import_module(f"{__name__}.{_check(name)}")


def spec_text(name: str) -> str:
    """The workflow's spec (YAML), as shipped in ``gfaas/workflows/specs/NAME.yaml``."""
    return (resources.files(__name__) / "specs" / f"{_check(name)}.yaml").read_text(encoding="utf-8")


def make_inputs(name: str, seed: int = 0, scale: str = "small") -> dict[str, np.ndarray]:
    """Deterministic synthetic inputs of a workflow: the same ``(seed, scale)`` gives the same arrays."""
    out: dict[str, np.ndarray] = module(name).make_inputs(seed=seed, scale=scale)
    return out


_MODELS: dict[tuple[str, str], Any] = {}


def _zoo(model: str, scale: str) -> Any:
    key = (model, scale)
    if key not in _MODELS:
        _MODELS[key] = importlib.import_module("gfaas.models").load(model, scale=scale)
    return _MODELS[key]


def _source(src: str) -> tuple[str, str]:
    fn, _, out = src.partition(".")
    return fn, out


def _order(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Producers before consumers (a condition's function counts as a producer); ties in listing order."""
    deps = {}
    for f in functions:
        d = set()
        for src in f["inputs"].values():
            d.add(_source(src if isinstance(src, str) else src["from"])[0])
            if isinstance(src, dict) and src.get("when"):
                d.add(str(src["when"]).split(".")[0].strip())
        deps[f["name"]] = d - {"input"}
    done: list[dict[str, Any]] = []
    left = list(functions)
    while left:
        ready = [f for f in left if deps[f["name"]] <= {g["name"] for g in done}]
        if not ready:
            raise SpecError(f"functions {[f['name'] for f in left]} depend on each other (a cycle)")
        done.append(ready[0])
        left.remove(ready[0])
    return done


def _check_output(wf: str, fn: str, name: str, value: np.ndarray, decl: Any) -> None:
    if not decl:
        return
    where = f"workflow {wf!r} function {fn!r} output {name!r}"
    if decl.get("dtype") is not None and value.dtype != np.dtype(decl["dtype"]):
        raise SpecError(f"{where}: dtype {value.dtype}, declared {decl['dtype']}")
    shape = decl.get("shape")
    if shape is not None and (len(shape) != value.ndim or any(d not in (-1, s) for d, s in zip(shape, value.shape,
                                                                                               strict=True))):
        raise SpecError(f"{where}: shape {list(value.shape)}, declared {shape}")


def run_local(name: str, seed: int = 0, scale: str = "small", *, inputs: Mapping[str, np.ndarray] | None = None,
              models: ModelSource | None = None) -> dict[str, Any]:
    """Run a workflow in this process, function by function, and return what happened.

    ``inputs`` replaces ``make_inputs(name, seed, scale)``; ``models`` replaces the model zoo (a mapping
    model name -> model, or a callable ``(name, scale) -> model``). A function runs when none of its
    producers was skipped and all its ``when:`` conditions hold; otherwise it is skipped. Every output
    is checked against its declared dtype and shape.

    Returns a dict with ``outputs`` (workflow output -> array; absent when its function was skipped),
    ``scalars`` (``"fn.output"`` -> float, for every scalar output of a function that ran), ``ran`` and
    ``skipped`` (function names, in execution order) and ``edges``: one entry per data edge that
    carried data, ``{"from": "fn.output" or "input.NAME", "to": "fn.input", "nbytes", "dtype", "shape"}``.
    """
    doc = yaml.safe_load(spec_text(name))
    arrays = dict(inputs) if inputs is not None else make_inputs(name, seed, scale)
    values: dict[str, np.ndarray] = {f"input.{k}": np.asarray(v) for k, v in arrays.items()}
    scalars: dict[str, float] = {}
    ran: list[str] = []
    skipped: list[str] = []
    edges: list[dict[str, Any]] = []
    for f in _order(doc["functions"]):
        fn = f["name"]
        runs = True
        feeds: dict[str, str] = {}
        for iname, src in f["inputs"].items():
            entry = src if isinstance(src, dict) else {"from": src}
            producer = _source(entry["from"])[0]
            if producer in skipped:
                runs = False
            if entry.get("when"):
                m = _WHEN.match(str(entry["when"]))
                if not m:
                    raise SpecError(f"workflow {name!r} function {fn!r}: bad condition {entry['when']!r}")
                c_fn, c_out, op, num = m.groups()
                if c_fn in skipped or not _OPS[op](scalars[f"{c_fn}.{c_out}"], float(num)):
                    runs = False
            feeds[iname] = entry["from"]
        if not runs:
            skipped.append(fn)
            continue
        model = None
        if f.get("model"):
            source = models if models is not None else _zoo
            model = source[f["model"]] if isinstance(source, Mapping) else source(f["model"], scale)
        ctx, refs = in_process_context({i: values[s] for i, s in feeds.items()}, workflow=name, function=fn,
                                       params=f.get("params") or {}, model=model, scale=scale)
        mod, _, attr = f["handler"].partition(":")
        out = getattr(importlib.import_module(mod), attr)(ctx, refs)
        declared = f["outputs"]
        if set(out) != set(declared):
            raise SpecError(f"workflow {name!r} function {fn!r} returned {sorted(out)}, declared {sorted(declared)}")
        for oname, v in out.items():
            arr = np.asarray(v)
            _check_output(name, fn, oname, arr, declared[oname])
            values[f"{fn}.{oname}"] = arr
            if arr.ndim == 0 and arr.dtype.kind in "biuf":
                scalars[f"{fn}.{oname}"] = float(arr)
        edges.extend({"from": s, "to": f"{fn}.{i}", "nbytes": int(values[s].nbytes), "dtype": str(values[s].dtype),
                      "shape": list(values[s].shape)} for i, s in feeds.items())
        ran.append(fn)
    outputs = {k: values[src] for k, src in doc["outputs"].items() if _source(src)[0] not in skipped}
    return {"workflow": name, "outputs": outputs, "scalars": scalars, "ran": ran, "skipped": skipped, "edges": edges}


__all__ = ["make_inputs", "module", "names", "run_local", "spec_text"]
