"""Every example runs and prints exactly its golden output (examples/NAME.out), as SimPy checks its own.

To accept a deliberate change of output: ``GFAAS_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/integration/test_examples.py``,
then review the diff of examples/*.out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUNNABLE = sorted(p for p in EXAMPLES.glob("*.py") if p.with_suffix(".out").exists() or "def main" in p.read_text())

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_every_runnable_example_has_golden_output() -> None:
    missing = [p.name for p in RUNNABLE if not p.with_suffix(".out").exists()]
    assert not missing, f"examples without golden output: {missing}; create it with GFAAS_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: p.stem)
def test_example_prints_its_golden_output(path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=EXAMPLES.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    golden = path.with_suffix(".out")
    if os.environ.get("GFAAS_UPDATE_GOLDEN") == "1":
        golden.write_text(proc.stdout)
    assert golden.exists(), f"no golden output {golden.name}"
    assert proc.stdout == golden.read_text()
