"""A runtime starts without importing onnx (gfaas.accel loads its compiler on first use).

onnx's import cost a runtime's start 0.1-0.9 s (ml_dtypes 0.7.0's extension alone 0.74-0.83 s on a
2-core AMD EPYC VM): runtime.accel needs only the accelerator's configuration, not its compiler.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import gfaas.accel


def test_importing_the_runtime_leaves_onnx_unimported() -> None:
    code = "import sys, gfaas.runtime.local, gfaas.cli; print(sorted(m for m in ('onnx', 'ml_dtypes') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", gfaas.accel.__all__)
def test_every_public_name_of_the_accelerator_package_loads(name: str) -> None:
    assert getattr(gfaas.accel, name) is not None
    assert name in vars(gfaas.accel)  # cached after the first lookup


def test_the_public_names_are_the_lazy_ones() -> None:
    assert sorted(gfaas.accel.__all__) == sorted(gfaas.accel._EXPORTS)
    assert set(gfaas.accel.__all__) <= set(dir(gfaas.accel))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'compile_models'"):
        gfaas.accel.compile_models  # noqa: B018
