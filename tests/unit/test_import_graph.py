"""The package's import graph: no cycles between modules, and the policy package depends on nothing
above it (one policy, two executors: the runtime and the simulator both sit above it)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from import_graph import cycles, graph  # noqa: E402

#: Cycles still being untied (issue 13). The list may only shrink: a new cycle fails, and so does a
#: listed one that has gone (delete it here).
KNOWN_CYCLES: list[list[str]] = []
#: What the policy package may import: itself and the layers below it.
POLICY_MAY_IMPORT = ("gfaas.policy", "gfaas.errors", "gfaas.units", "gfaas.clock", "gfaas.topology", "gfaas.native")
KNOWN_POLICY_VIOLATIONS: set[tuple[str, str]] = set()


def test_no_new_import_cycles() -> None:
    found = cycles(graph())
    new = [c for c in found if c not in KNOWN_CYCLES]
    gone = [c for c in KNOWN_CYCLES if c not in found]
    assert not new, f"new import cycles: {new}"
    assert not gone, f"cycles untied (remove them from KNOWN_CYCLES): {gone}"


def test_the_policy_package_depends_on_nothing_above_it() -> None:
    g = graph()
    bad = {(m, d) for m, deps in g.items() if m.startswith("gfaas.policy") for d in deps
           if not d.startswith(POLICY_MAY_IMPORT)}
    assert bad - KNOWN_POLICY_VIOLATIONS == set(), f"policy imports from above it: {sorted(bad)}"
    assert bad >= KNOWN_POLICY_VIOLATIONS, "a known violation is gone: remove it from the list"


def test_the_graph_reader_sees_type_checking_and_function_imports(tmp_path: Path) -> None:
    """Imports under TYPE_CHECKING and inside functions count (they are dependencies too), except a
    package __init__'s TYPE_CHECKING re-export block."""
    from import_graph import imports

    mod = tmp_path / "m.py"
    mod.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .store import Store\n"
                   "def f():\n    from ..policy import storage\n    import gfaas.units\n")
    known = {"gfaas.dataplane.store", "gfaas.policy", "gfaas.policy.storage", "gfaas.units"}
    assert imports("gfaas.dataplane.m", mod, known) == known - {"gfaas.policy"}
    init = tmp_path / "__init__.py"
    init.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .store import Store\n")
    assert imports("gfaas.dataplane", init, known) == set()


#: The packages from the bottom up: a module may import its own package and those listed before it,
#: never one listed after it (the runtime reading a benchmark's handlers or a measured workflow's
#: sizes was such an upward import). Modules of one entry may import each other. The package root
#: (``gfaas/__init__.py``, the public API re-exported) is above everything and may be imported by the
#: commands at the top only.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("units", "clock", "secfiles", "gcpause", "pyexec", "lifeline", "proctree", "provenance", "native"),
    ("topology",),
    ("policy",),
    ("config",),
    ("dedup",),
    ("dataplane",),
    ("models",),
    ("accel",),
    ("runtime",),
    ("gfaas",),
    ("workflows",),
    ("sim",),
    ("scaling",),
    ("deploy",),
    ("bench",),
    ("demo", "demo_gpu", "cli", "cli_accel", "cli_bench", "cli_cluster", "cli_dedup", "cli_deploy", "cli_gateway",
     "cli_invoke", "cli_logs", "cli_runtime", "cli_scale", "cli_sim", "__main__"),
]


def _layer_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "gfaas"
    for k, names in enumerate(LAYERS):
        if top in names:
            return k
    raise AssertionError(f"{module}: its package {top!r} is in no layer; add it to LAYERS where it belongs")


def test_no_package_imports_one_above_it() -> None:
    g = graph()
    upward = sorted((m, d) for m, deps in g.items() for d in deps if _layer_of(d) > _layer_of(m))
    assert not upward, "imports from a layer above (see LAYERS): " + ", ".join(f"{m} -> {d}" for m, d in upward)


def test_the_layer_check_sees_an_upward_import() -> None:
    """The rule itself: the runtime reading a benchmark, or the policy reading the runtime, is upward."""
    assert _layer_of("gfaas.bench.overload_handlers") > _layer_of("gfaas.runtime.gateway.dashboard")
    assert _layer_of("gfaas.workflows.measured") > _layer_of("gfaas.runtime.local")
    assert _layer_of("gfaas.runtime.dag") > _layer_of("gfaas.policy.autoscale")
    assert _layer_of("gfaas.cli_bench") > _layer_of("gfaas") > _layer_of("gfaas.runtime.local")


def test_the_package_root_exports_from_the_runtime_and_below() -> None:
    """Its names load lazily (no import the graph sees), so this is where its place in LAYERS is held."""
    import gfaas

    above = sorted({mod for mod, _ in gfaas._EXPORTS.values() if _layer_of(mod) >= _layer_of("gfaas")})
    assert not above, f"the package root exports from above the runtime: {above}"
