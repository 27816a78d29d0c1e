"""A newcomer's first run, timed: a fresh clone, ``make setup``, ``gfaas demo --scale small`` and ``make
demo`` with an empty model cache, no pip cache and an empty cargo registry (a fresh machine has none of
them; ``make setup`` builds the simulator's native core with cargo), and the disk each leaves.

    .venv/bin/python benchmarks/first_run.py --json benchmarks/results/first-run-cpu.json

About 12 minutes on 2 cores (``--no-full`` skips ``make demo``, about 3). The README's quick start
quotes the result (benchmarks/readme_tables.py writes its block).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gfaas.provenance import provenance  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=str(ROOT), help="the repository to clone (default: this checkout)")
    ap.add_argument("--no-full", dest="full", action="store_false", help="skip `make demo` (full scale)")
    ap.add_argument("--pip-cache", action="store_true", help="let pip use its cache (a machine that installed before)")
    ap.add_argument("--json", metavar="FILE", help="write the result here")
    return ap


def settings(a: argparse.Namespace) -> dict[str, Any]:
    return {"full": a.full, "pip_cache": a.pip_cache}


def du(path: Path) -> int:
    """Bytes of the files under ``path`` (as ``du -sb``; 0 if it does not exist)."""
    if not path.exists():
        return 0
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def timed(cmd: list[str], cwd: Path, env: dict[str, str], what: str) -> float:
    print(f"first run: {what}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"first run: {what} failed ({r.returncode}) after {took:.0f} s:\n{r.stderr[-3000:]}")
    print(f"first run: {what}: {took:.0f} s", file=sys.stderr, flush=True)
    return took


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="gfaas-first-run-"))
    try:
        clone, cache = tmp / "gfaas", tmp / "models"
        subprocess.run(["git", "clone", "-q", a.repo, str(clone)], check=True)
        env = {**os.environ, "GFAAS_CACHE_DIR": str(cache), "GFAAS_RUN_DIR": str(tmp / "run")}
        if not a.pip_cache:
            env["PIP_NO_CACHE_DIR"] = "1"
            env["CARGO_HOME"] = str(tmp / "cargo")  # crates downloaded again; the toolchain stays rustup's
        for k in ("VIRTUAL_ENV", "PYTHONPATH"):
            env.pop(k, None)
        doc: dict[str, Any] = {}
        doc["setup_s"] = timed(["make", "setup"], clone, env, "make setup")
        doc["venv_bytes"] = du(clone / ".venv")
        doc["native_build_bytes"] = du(clone / "native" / "target") + du(tmp / "cargo")
        doc["small_demo_s"] = timed([".venv/bin/gfaas", "demo", "--scale", "small", "--out", str(tmp / "small")],
                                    clone, env, "gfaas demo --scale small (empty model cache)")
        doc["small_cache_bytes"] = du(cache)
        if a.full:
            doc["full_demo_s"] = timed(["make", "demo"], clone, env, "make demo (full scale)")
            doc["full_cache_bytes"] = du(cache)
            doc["demo_out_bytes"] = du(clone / "out")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc["provenance"] = provenance(settings=settings(a))
    text = json.dumps(doc, indent=2)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
