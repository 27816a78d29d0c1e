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
        yield sha, os.path.join(wt, "src")
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", wt], check=False)
        os.rmdir(tmp)


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
