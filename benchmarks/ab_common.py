"""What the interleaved A/B scripts (``ab_dataplane.py``, ``ab_overload.py``, ``ab_pool_alloc.py``) share:
the base commit checked out into a temporary worktree, the runs interleaved ABBA, the result written.

On a shared 2-core VM the second run of a pair is systematically slower or faster, the peers whose
code is the same in both halves included, so the order alternates: base first in odd pairs, last in
even ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = TypeVar("T")


@contextlib.contextmanager
def base_tree(base: str) -> Iterator[tuple[str, str]]:
    """``(full sha, its src directory)`` of ``base``, checked out in a worktree removed afterwards."""
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", base], capture_output=True, text=True,
                         check=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="gfaas-ab-")
    wt = os.path.join(tmp, "base")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", wt, sha], check=True)
    try:
        if os.path.isdir(os.path.join(wt, "native")) \
                and subprocess.run(["git", "-C", ROOT, "diff", "--quiet", sha, "--", "native"]).returncode != 0:
            _build_native(wt)
        yield sha, os.path.join(wt, "src")
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", wt], check=False)
        os.rmdir(tmp)


def _build_native(wt: str) -> None:
    """The base's own ``gfaas_native``, built into its ``src``: the base's runtime has that directory
    first on its path (``PYTHONPATH``), and so do the workers it starts (they ignore ``PYTHONPATH`` and
    put the runtime's ``src`` first). Otherwise this checkout's extension serves the base's Python,
    and a base from before a change of the extension's API fails at its first task."""
    print(f"building the base's gfaas_native (its native/ differs from this checkout's) in {wt} ...",
          file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--progress-bar", "off", "--target",
                    os.path.join(wt, "src"), os.path.join(wt, "native")], check=True)


def interleaved(pairs: int, run: Callable[[str], T], base_src: str,
                done: Callable[[int, T, T], None] | None = None) -> list[tuple[T, T]]:
    """``pairs`` of ``(run(base_src), run(this checkout's src))``, ABBA; ``done(k, base, new)`` after each."""
    new_src = os.path.join(ROOT, "src")
    out: list[tuple[T, T]] = []
    for k in range(pairs):
        if k % 2 == 0:
            b = run(base_src)
            n = run(new_src)
        else:
            n = run(new_src)
            b = run(base_src)
        out.append((b, n))
        if done is not None:
            done(k, b, n)
    return out


def write_json(path: str | None, doc: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
