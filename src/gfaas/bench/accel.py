"""``gfaas bench accel``: our analytical timing model against SCALE-Sim v3, the oracle, in one run.

SCALE-Sim 3.0.0 needs ``numpy < 2.3``, so it runs in an isolated virtual environment this module
creates under ``<repo>/.cache/scalesim-venv`` (ignored by git) and drives through its Python API in a
subprocess (its command line ignores ``-s``; ``save_disk_space=True`` keeps it from writing traces;
it insists on a layout file, so one with default factors is written next to the topology). Both
simulators see the same layers (SCALE-Sim convolutions have no padding, so the topology gives the
padded feature map) on output- and weight-stationary 32x32 and 128x128 arrays; the table compares
compute cycles (SCALE-Sim: total minus stall cycles) per layer. On SCALE-Sim's ResNet-50 topology
(3.41 GMAC unpadded) the wall time of both gives ``speedup_vs_scalesim``: 128x128 OS by default, all
four configurations with ``--full`` (about 160 s each for SCALE-Sim on a 2-core machine).

This file is also the driver that runs inside that environment (``python accel.py --driver``): the
part below ``_driver`` imports only the standard library and SCALE-Sim.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCALESIM_REQ = ("scalesim==3.0.0", "numpy<2.3")
ARRAYS = (32, 128)
DATAFLOWS = ("os", "ws")
#: Scratchpad sizes for both simulators (KiB each). Compute cycles do not depend on them.
SRAM_KB = (512, 512, 256)

#: Validation layers as SCALE-Sim topology rows: name, ifmap h, ifmap w (already padded), filter h,
#: filter w, channels, filters, stride. A GEMM m x k x n is a 1 x m map, 1x1 filter, k channels.
LAYERS: tuple[tuple[str, int, int, int, int, int, int, int], ...] = (
    ("gemm_256x256x256", 1, 256, 1, 1, 256, 256, 1),
    ("gemm_odd_100x300x77", 1, 100, 1, 1, 300, 77, 1),
    ("gemv_1x768x1000", 1, 1, 1, 1, 768, 1000, 1),
    ("vit_qkv_197x192x576", 1, 197, 1, 1, 192, 576, 1),
    ("conv3x3_30x30x64_64", 30, 30, 3, 3, 64, 64, 1),
    ("conv7x7s2_rgb_stem", 69, 69, 7, 7, 3, 64, 2),
    ("conv1x1_28x28x256_128", 28, 28, 1, 1, 256, 128, 1),
    ("conv3x3s2_odd_29x29x96_160", 29, 29, 3, 3, 96, 160, 2),
    ("conv5x5_odd_17x17x33_47", 17, 17, 5, 5, 33, 47, 1),
    ("conv1x1s2_down_28x28x128_256", 28, 28, 1, 1, 128, 256, 2),
    ("conv3x3_9x9x256_256", 9, 9, 3, 3, 256, 256, 1),
    ("conv11x11s4_alexnet_stem", 67, 67, 11, 11, 3, 96, 4),
)
QUICK_LAYERS = LAYERS[:4] + LAYERS[5:7] + LAYERS[8:9] + LAYERS[11:12] + LAYERS[9:10] + LAYERS[7:8]

#: SCALE-Sim's ResNet-50 topology (its ``topologies/conv_nets/Resnet50.csv``), restated: unpadded
#: convolutions, 3.41 GMAC in total (checked by the unit tests).
RESNET50: tuple[tuple[str, int, int, int, int, int, int, int], ...] = (
    ("Conv1", 224, 224, 7, 7, 3, 64, 2),
    ("Conv2_1a", 56, 56, 1, 1, 64, 64, 1), ("Conv2_1b", 56, 56, 3, 3, 64, 64, 1),
    ("Conv2_1c", 56, 56, 1, 1, 64, 256, 1), ("Conv2_1d", 56, 56, 1, 1, 64, 256, 1),
    ("Conv2_2a", 56, 56, 1, 1, 256, 64, 1), ("Conv2_2b", 56, 56, 3, 3, 64, 64, 1),
    ("Conv2_2c", 56, 56, 1, 1, 64, 256, 1),
    ("Conv2_3a", 56, 56, 1, 1, 256, 64, 1), ("Conv2_3b", 56, 56, 3, 3, 64, 64, 1),
    ("Conv2_3c", 56, 56, 1, 1, 64, 256, 1),
    ("Conv3_1a", 56, 56, 1, 1, 256, 128, 2), ("Conv3_1b", 28, 28, 3, 3, 128, 128, 1),
    ("Conv3_1c", 28, 28, 1, 1, 128, 512, 1), ("Conv3_1d", 56, 56, 1, 1, 256, 512, 2),
    ("Conv3_2a", 28, 28, 1, 1, 512, 128, 1), ("Conv3_2b", 28, 28, 3, 3, 128, 128, 1),
    ("Conv3_2c", 28, 28, 1, 1, 128, 512, 1),
    ("Conv3_3a", 28, 28, 1, 1, 512, 128, 1), ("Conv3_3b", 28, 28, 3, 3, 128, 128, 1),
    ("Conv3_3c", 28, 28, 1, 1, 128, 512, 1),
    ("Conv3_4a", 28, 28, 1, 1, 512, 128, 1), ("Conv3_4b", 28, 28, 3, 3, 128, 128, 1),
    ("Conv3_4c", 28, 28, 1, 1, 128, 512, 1),
    ("Conv4_1a", 28, 28, 1, 1, 512, 256, 2), ("Conv4_1b", 14, 14, 3, 3, 256, 256, 1),
    ("Conv4_1c", 14, 14, 1, 1, 256, 1024, 1), ("Conv4_1d", 28, 28, 1, 1, 512, 1024, 2),
    ("Conv4_2a", 14, 14, 1, 1, 1024, 256, 1), ("Conv4_2b", 14, 14, 3, 3, 256, 256, 1),
    ("Conv4_2c", 14, 14, 1, 1, 256, 1024, 1),
    ("Conv4_3a", 14, 14, 1, 1, 1024, 256, 1), ("Conv4_3b", 14, 14, 3, 3, 256, 256, 1),
    ("Conv4_3c", 14, 14, 1, 1, 256, 1024, 1),
    ("Conv4_4a", 14, 14, 1, 1, 1024, 256, 1), ("Conv4_4b", 14, 14, 3, 3, 256, 256, 1),
    ("Conv4_4c", 14, 14, 1, 1, 256, 1024, 1),
    ("Conv4_5a", 14, 14, 1, 1, 1024, 256, 1), ("Conv4_5b", 14, 14, 3, 3, 256, 256, 1),
    ("Conv4_5c", 14, 14, 1, 1, 256, 1024, 1),
    ("Conv4_6a", 14, 14, 1, 1, 1024, 256, 1), ("Conv4_6b", 14, 14, 3, 3, 256, 256, 1),
    ("Conv4_6c", 14, 14, 1, 1, 256, 1024, 1),
    ("Conv5_1a", 14, 14, 1, 1, 1024, 512, 2), ("Conv5_1b", 7, 7, 3, 3, 512, 512, 1),
    ("Conv5_1c", 7, 7, 1, 1, 512, 2048, 1), ("Conv5_1d", 14, 14, 1, 1, 1024, 2048, 2),
    ("Conv5_2a", 7, 7, 1, 1, 2048, 512, 1), ("Conv5_2b", 7, 7, 3, 3, 512, 512, 1),
    ("Conv5_2c", 7, 7, 1, 1, 512, 2048, 1),
    ("Conv5_3a", 7, 7, 1, 1, 2048, 512, 1), ("Conv5_3b", 7, 7, 3, 3, 512, 512, 1),
    ("Conv5_3c", 7, 7, 1, 1, 512, 2048, 1),
    ("FC1000", 1, 1, 1, 1, 2048, 1000, 1),
)


def _repo_root() -> Path:
    from ..provenance import source_root

    return source_root()


def venv_dir() -> Path:
    return Path(os.environ.get("GFAAS_SCALESIM_VENV", _repo_root() / ".cache" / "scalesim-venv"))


def ensure_venv(log: Any = sys.stderr) -> Path:
    """The isolated environment's python, created with SCALE-Sim on first use."""
    from ..errors import DependencyMissing

    d = venv_dir()
    py = d / "bin" / "python"
    probe = [str(py), "-c", "import scalesim.scale_sim, numpy; assert numpy.__version__ < '2.3'"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    print(f"creating {d} with {' '.join(SCALESIM_REQ)} (once; a minute or two)", file=log, flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(d)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *SCALESIM_REQ], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise DependencyMissing(f"could not create the SCALE-Sim environment {d} ({e}); create it by hand: "
                                f"python -m venv {d} && {py} -m pip install {' '.join(SCALESIM_REQ)}") from None
    return py


def run_scalesim(py: Path, rows: int, cols: int, dataflow: str,
                 layers: tuple[tuple[str, int, int, int, int, int, int, int], ...]) -> dict[str, Any]:
    """One SCALE-Sim run (a config and a topology) in the isolated environment:
    ``{"layers": [{"name", "total", "stall"}], "wall_s"}`` (wall time inside the driver)."""
    spec = {"rows": rows, "cols": cols, "dataflow": dataflow, "sram_kb": SRAM_KB, "layers": layers}
    r = subprocess.run([str(py), __file__, "--driver"], input=json.dumps(spec), capture_output=False,
                       stdout=subprocess.PIPE, text=True, check=True)
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def _ours(rows: int, cols: int, dataflow: str,
          layers: tuple[tuple[str, int, int, int, int, int, int, int], ...]) -> tuple[list[int], float, int]:
    """Our compute cycles per layer, the wall time of timing the whole list, and its MACs."""
    from ..accel.arch import AccelConfig
    from ..accel.timing import _mat, time_model

    cfg = AccelConfig(rows=rows, cols=cols, dataflow=dataflow,  # type: ignore[arg-type]
                      ifmap_sram=SRAM_KB[0] * 1024, filter_sram=SRAM_KB[1] * 1024, ofmap_sram=SRAM_KB[2] * 1024)
    mls = [conv_layer(*row) for row in layers]
    _mat.cache_clear()  # time it cold: no result cached from an earlier run
    t0 = time.perf_counter()
    mt = time_model(cfg, mls)
    wall = time.perf_counter() - t0
    return [lt.compute_cycles for lt in mt.layers], wall, mt.macs


def conv_layer(name: str, ih: int, iw: int, fh: int, fw: int, ch: int, nf: int, stride: int) -> Any:
    """A SCALE-Sim topology row as a MatLayer of the same GEMM. SCALE-Sim sizes a convolution's
    output as ``ceil((i - f) / s) + 1``, one more pixel per dimension than ``floor`` when the stride
    does not divide ``i - f`` (it reads past the map's edge, e.g. ResNet-50's 1x1 stride-2 shortcuts
    on 56x56 give 29x29); both simulators must time the same GEMM, so this follows it."""
    from ..accel.layers import ConvGeom, MatLayer

    oh, ow = -(-(ih - fh) // stride) + 1, -(-(iw - fw) // stride) + 1
    return MatLayer(name, "Conv", m=oh * ow, k=fh * fw * ch, n=nf, conv=ConvGeom(ih, iw, fh, fw, ch, nf, stride))


def compare(py: Path, rows: int, cols: int, dataflow: str,
            layers: tuple[tuple[str, int, int, int, int, int, int, int], ...], log: Any) -> dict[str, Any]:
    """Both simulators on one config: per-layer cycles, errors and wall times."""
    print(f"SCALE-Sim {rows}x{cols} {dataflow}: {len(layers)} layers ...", file=log, flush=True)
    ss = run_scalesim(py, rows, cols, dataflow, layers)
    ours, wall_ours, macs = _ours(rows, cols, dataflow, layers)
    out: list[dict[str, Any]] = []
    for row, mine, theirs in zip(layers, ours, ss["layers"], strict=True):
        ref = int(theirs["total"]) - int(theirs["stall"])
        out.append({"name": row[0], "scalesim": ref, "ours": mine, "rel_err": abs(mine - ref) / ref})
    max_err = max(r["rel_err"] for r in out)
    print(f"  done in {ss['wall_s']:.1f} s; max error {max_err:.2%}", file=log, flush=True)
    return {"array": f"{rows}x{cols}", "dataflow": dataflow, "layers": out, "max_rel_err": max_err,
            "scalesim_total": sum(r["scalesim"] for r in out), "ours_total": sum(r["ours"] for r in out),
            "scalesim_wall_s": ss["wall_s"], "ours_wall_s": wall_ours, "macs": macs,
            "speedup_vs_scalesim": ss["wall_s"] / wall_ours if wall_ours > 0 else float("inf")}


def run(quick: bool = False, full: bool = False, log: Any = sys.stderr) -> dict[str, Any]:
    py = ensure_venv(log)
    layers = QUICK_LAYERS if quick else LAYERS
    res: dict[str, Any] = {"scalesim": SCALESIM_REQ[0], "sram_kb": list(SRAM_KB), "layers": []}
    arrays = (32, 128) if not quick else (128,)
    for side in arrays:
        for df in DATAFLOWS:
            res["layers"].append(compare(py, side, side, df, layers, log))
    res["max_rel_err"] = max(r["max_rel_err"] for r in res["layers"])
    r50 = [(s, df) for s in ARRAYS for df in DATAFLOWS] if full else [(128, "os")]
    res["resnet50"] = [compare(py, s, s, df, RESNET50, log) for s, df in r50]
    res["speedup_vs_scalesim"] = min(r["speedup_vs_scalesim"] for r in res["resnet50"])
    return res


def print_table(res: dict[str, Any]) -> None:
    for block in res["layers"] + res["resnet50"]:
        print(f"\n{block['array']} {block['dataflow']}: max error {block['max_rel_err']:.3%}")
        if len(block["layers"]) <= 20:
            print(f"  {'layer':34s} {'SCALE-Sim':>10s} {'ours':>10s} {'error':>8s}")
            for r in block["layers"]:
                print(f"  {r['name']:34s} {r['scalesim']:>10,d} {r['ours']:>10,d} {r['rel_err']:>8.3%}")
    for r in res["resnet50"]:
        print(f"\nResNet-50 {r['array']} {r['dataflow']}: {r['macs'] / 1e9:.2f} GMAC, SCALE-Sim "
              f"{r['scalesim_total']:,d} cycles in {r['scalesim_wall_s']:.1f} s, ours {r['ours_total']:,d} cycles "
              f"in {r['ours_wall_s'] * 1e3:.2f} ms: {r['speedup_vs_scalesim']:,.0f}x faster")
    print(f"\nmax relative error {res['max_rel_err']:.3%}; speedup_vs_scalesim {res['speedup_vs_scalesim']:,.0f}x")


def main(a: Any) -> int:
    """``gfaas bench accel [--json] [--out FILE] [--quick] [--full]``."""
    from ..provenance import provenance

    prov = provenance()  # taken before the run (minutes long), so it names the code that ran
    res = run(quick=a.quick, full=getattr(a, "full", False))
    res["provenance"] = prov
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=2))
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    return 0


# ---- the driver: runs inside the SCALE-Sim environment (stdlib + scalesim only) -----------------

_CFG = """[general]
run_name = gfaas_validation

[architecture_presets]
ArrayHeight : {rows}
ArrayWidth : {cols}
IfmapSramSzkB : {ikb}
FilterSramSzkB : {fkb}
OfmapSramSzkB : {okb}
IfmapOffset : 0
FilterOffset : 10000000
OfmapOffset : 20000000
Bandwidth : 10
Dataflow : {df}
ReadRequestBuffer : 32
WriteRequestBuffer : 32

[layout]
IfmapCustomLayout : False
IfmapSRAMBankBandwidth : 10
IfmapSRAMBankNum : 10
IfmapSRAMBankPort : 2
FilterCustomLayout : False
FilterSRAMBankBandwidth : 10
FilterSRAMBankNum : 10
FilterSRAMBankPort : 2

[sparsity]
SparsitySupport : false
SparseRep : ellpack_block
OptimizedMapping : false
BlockSize : 8
RandomNumberGeneratorSeed : 40

[run_presets]
InterfaceBandwidth : CALC
UseRamulatorTrace : False
"""


def _driver() -> None:
    import contextlib
    import io

    spec = json.loads(sys.stdin.read())
    from scalesim import simulator as ss_simulator
    from scalesim.scale_sim import scalesim

    with tempfile.TemporaryDirectory(prefix="gfaas-scalesim-") as tmp:
        cfg = Path(tmp, "cfg.cfg")
        ikb, fkb, okb = spec["sram_kb"]
        cfg.write_text(_CFG.format(rows=spec["rows"], cols=spec["cols"], ikb=ikb, fkb=fkb, okb=okb,
                                   df=spec["dataflow"]))
        topo, layout = Path(tmp, "topo.csv"), Path(tmp, "layout.csv")
        rows = spec["layers"]
        topo.write_text("Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, "
                        "Num Filter, Strides,\n" + "".join(", ".join(map(str, r)) + ",\n" for r in rows))
        layout.write_text("Layer name," + ",".join(f"f{i}" for i in range(20)) + ",\n"
                          + "".join(f"{r[0]}," + ",".join(["1"] * 20) + ",\n" for r in rows))
        n = len(rows)
        orig = ss_simulator.layer_sim.run
        t_start = time.perf_counter()

        def run_with_progress(self: Any) -> None:
            i = self.get_layer_id() if hasattr(self, "get_layer_id") else 0
            print(f"    layer {i + 1}/{n} ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)
            orig(self)

        ss_simulator.layer_sim.run = run_with_progress
        with contextlib.redirect_stdout(io.StringIO()):  # SCALE-Sim prints banners on stdout
            s = scalesim(save_disk_space=True, verbose=False, config=str(cfg), topology=str(topo),
                         layout=str(layout))
            t0 = time.perf_counter()
            s.run_scale(top_path=tmp)
            wall = time.perf_counter() - t0
        out = []
        for obj in s.runner.single_layer_sim_object_list:
            items = obj.get_compute_report_items()
            out.append({"total": int(items[1]), "stall": int(items[2])})
    print(json.dumps({"layers": out, "wall_s": wall}))


if __name__ == "__main__":
    if sys.argv[1:] == ["--driver"]:
        _driver()
