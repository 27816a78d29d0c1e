"""``import gfaas`` and ``import gfaas.sim.kernel`` stay cheap: public names load on first use.

Run in a fresh interpreter each, since this process has imported most of gfaas already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
before = set(sys.modules)
import {module}
new = sorted(set(sys.modules) - before)
print(json.dumps(new))
"""


def _loaded(module: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return list(json.loads(out))


@pytest.mark.parametrize(("module", "bound"), [("gfaas", 60), ("gfaas.sim", 60), ("gfaas.sim.kernel", 80)])
def test_import_loads_few_modules(module: str, bound: int) -> None:
    new = _loaded(module)
    heavy = [m for m in ("numpy", "yaml", "msgspec", "onnxruntime", "fastapi", "redis", "rich") if m in new]
    assert not heavy, f"import {module} loads {heavy}; import them where they are used"
    assert len(new) <= bound, f"import {module} loads {len(new)} modules (bound {bound}): {new}"


def test_the_kernel_loads_only_what_it_needs() -> None:
    loaded = _loaded("gfaas.sim.kernel")
    ours = [m for m in loaded if m == "gfaas" or m.startswith("gfaas.")]
    assert ours == ["gfaas", "gfaas.clock", "gfaas.errors", "gfaas.native", "gfaas.sim", "gfaas.sim.kernel"]
    # and the native core's extension where it is built (docs/design/native-core.md), nothing else
    assert {m for m in loaded if m.startswith("gfaas_native")} <= {"gfaas_native", "gfaas_native.gfaas_native"}


def test_a_public_name_loads_on_first_use() -> None:
    code = "import sys, gfaas; assert 'gfaas.runtime.local' not in sys.modules; gfaas.LocalRuntime; " \
           "assert 'gfaas.runtime.local' in sys.modules; print(sorted(dir(gfaas))[:1])"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True)
