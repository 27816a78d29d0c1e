"""``gfaas invoke WORKFLOW --input NAME=VALUE ...``: one invocation through a running gateway, from the shell.

Each ``--input NAME=VALUE`` is a ``.npy`` file, a ``.json`` file, or JSON text (``3``, ``[1, 2]``);
JSON becomes an array of the dtype the workflow declares for that input (``gfaas workflows show
WORKFLOW``), and the runtime checks shapes. ``--seed N`` asks a reference workflow to make its own
inputs. The outputs land in ``--out DIR`` (default ``out/invoke/WORKFLOW``): one ``NAME.npy`` per
output and ``result.json`` (status, invocation ID, outputs' dtypes and shapes, scalars, where the time
went); ``--json`` prints that document instead of the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .cli_gateway import add_gateway_args, client
from .errors import SpecError

SHOWN = 8  # outputs of at most this many elements are printed (and kept in result.json) as values


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("invoke", help="invoke a workflow on a running gateway and save its outputs",
                       description=__doc__.split("\n\n", 1)[1] if __doc__ else None)
    p.add_argument("workflow", help="a workflow the gateway serves (gfaas workflows list)")
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=VALUE",
                   help="an input: NAME=file.npy, NAME=file.json or NAME=JSON (repeat for each input)")
    p.add_argument("--seed", type=int, default=None,
                   help="let the workflow make its own inputs from this seed (the reference workflows)")
    p.add_argument("--transport", choices=["gfaas", "redis"], default=None,
                   help="how data passes between the functions (default: the gateway's)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for the result (default 600; the gateway may cap it)")
    p.add_argument("--out", default="", metavar="DIR", help="where the outputs go (default out/invoke/WORKFLOW)")
    p.add_argument("--json", action="store_true", help="print result.json instead of the summary")
    add_gateway_args(p)
    p.set_defaults(func=cmd_invoke)


def parse_input(item: str, declared: dict[str, Any]) -> tuple[str, np.ndarray]:
    """``NAME=VALUE`` as (name, array); ``declared``: the workflow's inputs as the gateway describes them."""
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise SpecError(f"--input {item!r}: write NAME=VALUE, e.g. --input image=cat.npy or --input n=[1,2,3]")
    if declared and name not in declared:
        raise SpecError(f"--input {name}: the workflow has no input {name!r}; its inputs are {sorted(declared)}")
    dtype = (declared.get(name) or {}).get("dtype")
    if value.endswith(".npy"):
        try:
            arr = np.load(value, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise SpecError(f"--input {name}: cannot read {value} as a .npy file: {exc}") from None
        return name, arr
    if value.endswith(".json"):
        try:
            data = json.loads(Path(value).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SpecError(f"--input {name}: cannot read {value} as a JSON file: {exc}") from None
    else:
        try:
            data = json.loads(value)
        except ValueError:
            raise SpecError(f"--input {name}={value!r} is neither a .npy or .json file nor JSON text "
                            "(write a list as [1, 2, 3], a string as '\"text\"')") from None
    try:
        return name, np.asarray(data, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"--input {name}: {str(data)[:80]} does not convert to the declared dtype {dtype}: {exc}") \
            from None


def _summary_value(arr: np.ndarray) -> Any:
    return arr.tolist() if arr.size <= SHOWN and arr.dtype.kind in "biufc?U" else None


def write_outputs(res: Any, out: Path) -> dict[str, Any]:
    """Save every output as ``NAME.npy`` under ``out`` and return the ``result.json`` document."""
    out.mkdir(parents=True, exist_ok=True)
    outputs: dict[str, Any] = {}
    for name, arr in sorted(res.outputs.items()):
        arr = np.asarray(arr)
        path = out / f"{name}.npy"
        np.save(path, arr, allow_pickle=False)
        outputs[name] = {"dtype": str(arr.dtype), "shape": list(arr.shape), "file": str(path)}
        value = _summary_value(arr)
        if value is not None:
            outputs[name]["value"] = value
    b = res.breakdown
    doc = {"workflow": res.workflow, "invocation_id": res.invocation_id, "status": res.status, "error": res.error,
           "outputs": outputs, "scalars": {k: float(v) for k, v in sorted(res.scalars.items())},
           "breakdown_ms": {k[:-2]: round(getattr(b, k) * 1e3, 3) for k in ("total_s", "queue_s", "compute_s",
                                                                      "fn_pass_s", "host_pass_s", "cold_start_s")},
           "failure": None if res.failure is None else {"function": res.failure.function, "error": res.failure.error,
                                                          "logs": list(res.failure.logs)}}
    (out / "result.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return doc


def cmd_invoke(a: argparse.Namespace) -> int:
    from .runtime.client_http import InvocationTimeout

    with client(a, timeout=30.0) as gw:
        declared = gw.describe(a.workflow).get("inputs", {})
        inputs = dict(parse_input(item, declared) for item in a.input)
        if not inputs and a.seed is None and declared:
            raise SpecError(f"{a.workflow} takes inputs {sorted(declared)}: give each with --input NAME=VALUE "
                            "(or --seed N for a reference workflow that makes its own)")
        try:
            res = gw.invoke(a.workflow, inputs or None, seed=a.seed, timeout=a.timeout, transport=a.transport)
        except InvocationTimeout as exc:
            print(f"gfaas invoke: {a.workflow} still running after {a.timeout:g} s; its result will be at "
                  f"/v1/invocations/{exc.invocation_id}/result", file=sys.stderr)
            return 1
    out = Path(a.out or os.path.join("out", "invoke", a.workflow))
    doc = write_outputs(res, out)
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        _print_summary(doc, out)
    if res.status != "done":
        print(f"gfaas: error: {a.workflow} failed: {res.error}", file=sys.stderr)
        for line in (doc["failure"] or {}).get("logs", [])[-10:]:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


def _print_summary(doc: dict[str, Any], out: Path) -> None:
    b = doc["breakdown_ms"]
    print(f"{doc['workflow']}: {doc['status']} in {b['total']:.1f} ms (compute {b['compute']:.1f} ms, "
          f"data passing {b['fn_pass'] + b['host_pass']:.1f} ms); invocation {doc['invocation_id']}")
    for name, o in doc["outputs"].items():
        shown = f" = {json.dumps(o['value'])}" if "value" in o else ""
        print(f"  {name:<12} {o['dtype']:<8} {str(o['shape']):<16} -> {o['file']}{shown}")
    print(f"result: {out / 'result.json'}")
