"""The README's generated blocks: what a first run costs (benchmarks/results/first-run-cpu.json) and the
demo's report (benchmarks/results/demo-cpu.json), as the demo prints it.

    .venv/bin/python benchmarks/readme_tables.py --write README.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from doc_blocks import write_blocks

ROOT = Path(__file__).resolve().parents[1]
R = ROOT / "benchmarks" / "results"


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _min(s: float) -> str:
    return f"{s:.0f} s" if s < 100 else f"{s / 60:.1f} min"


def first_run(doc: dict[str, Any]) -> str:
    p = doc["provenance"]
    m = p["machine"]
    cache = ("no pip cache, no cargo registry" if not p.get("settings", {}).get("pip_cache")
             else "pip's cache warm")
    lines = [f"What a first run cost on a fresh clone ({m['cores']} cores, {m['mem_bytes'] / 2**30:.0f} GiB, no GPU; "
             f"{cache}, an empty model cache; `make first-run-results`, commit {p['commit'][:7]}):", "",
             "| step | time | disk it adds |", "|---|---:|---:|",
             f"| `make setup` (the first make command does it) | {_min(doc['setup_s'])} | {_gb(doc['venv_bytes'])} "
             "in `.venv`" + (f", {_gb(doc['native_build_bytes'])} building the native core"
                             if doc.get("native_build_bytes") else "") + " |",
             f"| `.venv/bin/gfaas demo --scale small`: a first try, shrunk models | {_min(doc['small_demo_s'])} | "
             f"{_gb(doc['small_cache_bytes'])} of models |"]
    if "full_demo_s" in doc:
        lines.append(f"| `make demo`: the real architectures (built in code, then cached) | {_min(doc['full_demo_s'])} | "
                     f"{_gb(doc['full_cache_bytes'] - doc['small_cache_bytes'])} more of models |")
    lines += ["", "Models are built in code, never downloaded, and cached under `~/.cache/gfaas/models` "
              "(`$GFAAS_CACHE_DIR`); a second run skips the set-up and the builds."]
    return "\n".join(lines)


def demo(doc: dict[str, Any]) -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from gfaas.demo import table_text

    return "```\n" + table_text(doc) + f"\n```\n\n(commit {doc['provenance']['commit'][:7]}, {doc['wall_s']:.0f} s in all.)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", metavar="PAGE", help="replace the blocks of this page (else print them)")
    a = ap.parse_args()
    blocks = {}
    for name, file, render in (("first-run", "first-run-cpu.json", first_run), ("demo", "demo-cpu.json", demo)):
        path = R / file
        if path.exists():
            blocks[name] = render(json.loads(path.read_text()))
    if a.write:
        write_blocks(a.write, blocks)
    else:
        print("\n\n".join(blocks.values()))


if __name__ == "__main__":
    main()
