"""Functional emulation of every zoo model on the ``dscs`` preset, fp32 and int8, against onnxruntime.

Run: ``.venv/bin/python benchmarks/accel_emulation.py [--scale small|full] [--json benchmarks/results/accel-emulation.json]``.
Each row is ``gfaas accel run MODEL --precision P --json``'s verdict: the largest relative error
(``max |y - ref| / max |ref|`` per output, worst output) and whether it is within the bound
(fp32 1e-4; int8 0.3, gfaas.accel.quant).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gfaas.accel import check, compile_model, preset
from gfaas.cli_bench import cli_settings
from gfaas.models import zoo
from gfaas.provenance import provenance


def run(scale: str) -> dict[str, object]:
    rows = []
    cfg = preset("dscs")
    for name in zoo.names():
        prog = compile_model(zoo.build(name, scale, 0), cfg, 1)
        for precision in ("fp32", "int8"):
            t0 = time.perf_counter()
            res = check(prog, precision, seed=0)
            rows.append({"model": name, "precision": precision, "max_rel_err": res.max_rel_err,
                         "tolerance": res.tolerance, "outputs_match": res.outputs_match,
                         "seconds": time.perf_counter() - t0})
            print(f"{name:16} {precision}: {res.max_rel_err:.3g} (bound {res.tolerance:g})", file=sys.stderr)
    return {"scale": scale, "config": cfg.name, "rows": rows, "all_match": all(r["outputs_match"] for r in rows)}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=["small", "full"], default="small")
    ap.add_argument("--json", help="write the result (with provenance) to this file")
    return ap


def main() -> None:
    a = build_parser().parse_args()
    doc = {"provenance": provenance(["benchmarks/accel_emulation.py", *sys.argv[1:]], settings=cli_settings(a)),
           **run(a.scale)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    else:
        print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
