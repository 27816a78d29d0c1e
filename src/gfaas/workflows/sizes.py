"""Bytes on every data edge of the reference workflows, measured by running them with
:func:`gfaas.workflows.run_local`.

``python -m gfaas.workflows.sizes [--scale full] [--stub]`` prints one Markdown table per workflow
(the tables quoted in ``docs/workflows.md``). ``--stub`` uses the shape-faithful stand-ins of
:mod:`gfaas.workflows.stub` instead of the model zoo: every edge but the detectors' crops has the
same size either way, since those depend only on the input and the models' input sizes; crop edges
scale with the number of detections, which the table shows.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..units import format_decimal
from . import names, run_local
from .stub import stub_models


def edges(name: str, scale: str = "full", seed: int = 0, stub: bool = False) -> list[dict[str, Any]]:
    """Every edge that carried data in one run, plus one ``-> caller`` edge per workflow output."""
    r = run_local(name, seed, scale, models=stub_models() if stub else None)
    rows = list(r["edges"])
    for out, arr in r["outputs"].items():
        rows.append({"from": out, "to": "caller", "nbytes": int(arr.nbytes), "dtype": str(arr.dtype),
                     "shape": list(arr.shape)})
    return rows


def table(name: str, scale: str = "full", seed: int = 0, stub: bool = False) -> str:
    lines = [f"| {name}: edge | to | dtype, shape | bytes |", "|---|---|---|---:|"]
    for e in edges(name, scale, seed, stub):
        lines.append(f"| {e['from']} | {e['to']} | {e['dtype']} {e['shape']} | {format_decimal(e['nbytes'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gfaas.workflows.sizes", description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="full", choices=("small", "full"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stub", action="store_true", help="stand-in models instead of the model zoo")
    p.add_argument("workflows", nargs="*", help="default: all six")
    a = p.parse_args(argv)
    for name in a.workflows or names():
        print(table(name, a.scale, a.seed, a.stub), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
