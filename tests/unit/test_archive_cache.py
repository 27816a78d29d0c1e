"""runtime.deployments.Deployments._archive: a stored code package packed once for Ray actors' starts,
and only the newest ``ARCHIVES_KEPT`` kept (each may be as large as ``max_code_bytes``; every redeploy
of a changed package adds one)."""

from __future__ import annotations

import threading
from pathlib import Path

from gfaas.runtime import deployments as D
from gfaas.runtime.codepkg import read_archive


def test_packed_once_and_only_the_newest_packages_kept(tmp_path: Path) -> None:
    dep = object.__new__(D.Deployments)  # only the cache is exercised
    dep._archives = {}
    dep._forks_lock = threading.Lock()
    dirs = []
    for k in range(D.ARCHIVES_KEPT + 2):
        d = tmp_path / f"pkg{k}"
        (d / "mypkg").mkdir(parents=True)
        (d / "mypkg" / "handlers.py").write_text(f"def f(ctx, inputs):\n    return {{'k': {k}}}\n")
        dirs.append(str(d))
    first = dep._archive(dirs[0])
    assert dep._archive(dirs[0]) is first  # the same bytes object: not packed again
    assert read_archive(first).digest == read_archive(dep._archive(dirs[0])).digest
    for path in dirs[1:]:
        dep._archive(path)
    assert list(dep._archives) == dirs[2:]  # the two oldest went first
    again = dep._archive(dirs[0])  # packed again on demand, with the same content
    assert again is not first and again == first and len(dep._archives) == D.ARCHIVES_KEPT
