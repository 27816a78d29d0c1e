"""The results browser's files: which folders it offers, what it lists, and reading them without
following links (issue 37, row 5).

The browser lists JSON files under a few directories (the checkout's committed results, ``./out``).
Someone else who can write into such a directory could plant a symbolic link there (to a root-only
file, ``/etc/shadow``) and have the gateway, often root, serve it. So:

* every file is opened component by component from its directory with ``O_NOFOLLOW`` (``openat``):
  a link anywhere on the way, even one swapped in after the listing, fails the open;
  only regular files are read;
* ``./out`` of the gateway's working directory is offered only when it is the gateway's user's own
  and nobody else may write to it (:func:`private_dir`).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from ...errors import NotFound

log = logging.getLogger("gfaas.gateway")

__all__ = ["NotInside", "default_results_dirs", "find_result", "list_results", "private_dir", "read_inside",
           "results_dirs_from_env"]

_DOC_FIGURES = {"dedup.json": "docs/dedup.png", "scale-netns.json": "docs/scaling-ramp.png",
                "keepalive.json": "docs/autoscaling.png", "cluster-day.json": "docs/results/cluster-day.png",
                "accel-dse.json": "docs/accel-dse.png", "dscs-experiments.json": "docs/results/dscs-platforms.png"}


class NotInside(OSError):
    """The file is not a regular file reached without links inside its directory."""


def read_inside(base: str | os.PathLike[str], rel: str, max_bytes: int) -> bytes:
    """The bytes of ``base/rel`` (at most ``max_bytes``), reached without following any link below
    ``base``; :class:`NotInside` if a part is a link, ``..`` or not what it should be."""
    parts = PurePosixPath(rel).parts
    if not parts or any(p in ("", ".", "..") or "/" in p for p in parts):
        raise NotInside(f"{rel!r} is not a plain relative path")
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise NotInside(f"{rel!r}: {part!r} is not a directory of its own ({exc.strerror})") from None
            os.close(fd)
            fd = nxt
        try:
            f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            raise NotInside(f"{rel!r} cannot be opened without following a link ({exc.strerror})") from None
    finally:
        os.close(fd)
    try:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            raise NotInside(f"{rel!r} is not a regular file")
        chunks, left = [], max_bytes
        while left > 0:
            chunk = os.read(f, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(f)


def private_dir(path: Path) -> bool:
    """Whether ``path`` is a directory (not a link) owned by this process's user, that neither its
    group nor others may write, in a parent that others may not rename it out of (not writable by
    others, or sticky)."""
    try:
        st = os.lstat(path)
        parent = os.stat(path.parent)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    own = st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    parent_ok = not parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or bool(parent.st_mode & stat.S_ISVTX)
    if not own or not parent_ok:
        log.warning("results browser: %s is not offered: it is a link, not this user's, or others may write "
                    "to it (or its parent); set GFAAS_RESULTS_DIRS to name result folders explicitly", path)
        return False
    return True


def default_results_dirs() -> list[tuple[str, str]]:
    """(label, directory): the checkout's committed results, then ``./out`` (local runs), where they exist."""
    from ...provenance import source_root

    out = []
    committed = source_root() / "benchmarks" / "results"
    if committed.is_dir():
        out.append(("committed", str(committed)))
    local = Path.cwd() / "out"
    if local.is_dir() and private_dir(local):  # see result_files: nobody else's files, no links
        out.append(("local", str(local)))
    return out


def _summary(entry: dict[str, Any]) -> dict[str, Any]:
    """The commit and command a result names, read cheaply (files over 4 MiB are not parsed)."""
    info: dict[str, Any] = {"commit": None, "utc": None, "command": None, "kind": None}
    if entry["bytes"] > 4 << 20:
        return info
    base, rel = entry["_at"]
    try:
        doc = json.loads(read_inside(base, rel, 4 << 20))
    except (OSError, ValueError):
        return info
    if not isinstance(doc, dict):
        return info
    prov = doc.get("provenance") or {}
    info.update(commit=prov.get("commit"), utc=prov.get("utc") or doc.get("started_utc"),
                command=prov.get("command"), dirty=prov.get("dirty"))
    info["kind"] = "experiments" if "experiments" in doc else "targets" if "targets" in doc else \
        "rows" if "rows" in doc else "document"
    return info


def _entries(dirs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Every ``*.json`` under the result directories (three levels deep at most): id, path, size, figure."""
    found = []
    for label, root in dirs:
        base = Path(root)
        for path in sorted(base.glob("**/*.json")):  # ** does not enter linked directories
            rel = path.relative_to(base)
            if len(rel.parts) > 3 or path.is_symlink() or not path.is_file():
                continue  # a link is never listed (nor read: result_files.read_inside)
            st = path.stat()
            fig = _figure(label, base, path)
            found.append({"id": f"{label}/{rel.as_posix()}", "source": label, "path": str(path),
                          "bytes": st.st_size, "mtime": st.st_mtime, "figure": fig and str(Path(fig[0]) / fig[1]),
                          "_at": (str(base), rel.as_posix()), "_figure": fig})
    return found


def list_results(dirs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """:func:`_entries` with the commit each names, newest measurement first (a checkout gives every
    file the same mtime: the provenance's UTC stamp is what orders them)."""
    found = [{**{k: v for k, v in e.items() if not k.startswith("_")}, **_summary(e)} for e in _entries(dirs)]
    found.sort(key=lambda e: (e.get("utc") or "", e["mtime"]), reverse=True)
    return found


def _figure(label: str, base: Path, path: Path) -> tuple[str, str] | None:
    """(directory, path inside it) of the figure drawn from a result, if there is one."""
    if label == "committed":
        doc = _DOC_FIGURES.get(path.name)
        if doc:
            root = base.parent.parent
            fig = root / doc
            return (str(root), doc) if fig.is_file() and not fig.is_symlink() else None
        return None
    pngs = sorted(p for p in path.parent.glob("*.png") if not p.is_symlink())
    return (str(base), pngs[0].relative_to(base).as_posix()) if pngs else None


def find_result(dirs: list[tuple[str, str]], rid: str) -> dict[str, Any]:
    for entry in _entries(dirs):  # by the listing's ids only: no path from the client is opened
        if entry["id"] == rid:
            return entry
    raise NotFound(f"no result {rid[:200]!r}; GET /v1/results lists them")


def results_dirs_from_env() -> list[tuple[str, str]] | None:
    """``GFAAS_RESULTS_DIRS=label=dir:label=dir`` overrides the defaults (None when unset)."""
    text = os.environ.get("GFAAS_RESULTS_DIRS")
    if not text:
        return None
    out = []
    for part in text.split(os.pathsep):
        label, _, d = part.partition("=")
        if label and d:
            out.append((label, d))
    return out
